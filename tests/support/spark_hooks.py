"""Step hooks for the Spark sink tests. They run inside Spark's Python workers, so they
are picklable objects of an importable module; each fires once, remembered by a marker
file in its folder (workers are separate processes)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


@dataclass(frozen=True)
class _Hook:
    folder: str

    def once(self, name: str) -> bool:
        try:
            (Path(self.folder) / name).touch(exist_ok=False)
            return True
        except FileExistsError:
            return False


class FailFirstAttempt(_Hook):
    """Fail partition 0 of batch 1 twice: its first attempt after preparing (nothing
    decided: the retry aborts it), its second after the database committed (the worst
    moment: Kafka still prepared; the third attempt must commit it, not write again).
    One attempt can fail only once, so each failure has an attempt of its own."""

    FAILURES: ClassVar[dict[int, str]] = {0: "after_prepare", 1: "after_db_commit"}
    """Spark attempt number -> the step it fails at."""

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        hit = batch_id == 1 and partition == 0 and self.FAILURES.get(attempt) == step
        if hit and self.once(f"fail-{step}"):
            raise RuntimeError(f"injected task failure at {step}")


class FailInBatchOne(_Hook):
    """Fail the first attempt of every partition of batch 1 after the database commit:
    two tasks in doubt at once, each committed by its own retry. (A retry of a partition
    whose database transaction committed writes nothing and fires no step: a second
    failure of the same partition after the database commit cannot happen.)"""

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        hit = batch_id == 1 and step == "after_db_commit" and attempt == 0
        if hit and self.once(f"partition-{partition}"):
            raise RuntimeError("injected task failure")


class KillDriverMidBatch(_Hook):
    """Kill the whole query (driver, JVM, workers: one process group) once, mid-batch 1,
    after partition 0 committed its database transaction but not Kafka."""

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        hit = batch_id == 1 and partition == 0 and step == "after_db_commit"
        if hit and self.once("killed"):
            os.killpg(int(os.environ["KAFKA_TXN_TEST_DRIVER_PGID"]), signal.SIGKILL)


@dataclass(frozen=True)
class FailPartition(_Hook):
    """Fail one partition of one batch on every attempt, before it writes anything (the
    job then fails after its retries), leaving the other partitions committed."""

    partition: int = 0
    batch: int = 0

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        if (batch_id, partition, step) == (self.batch, self.partition, "after_begin"):
            raise RuntimeError(f"injected failure of partition {partition}")


class RecordSteps(_Hook):
    """Record every step as a file ``<batch>-<partition>-<attempt>-<step>``."""

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        (Path(self.folder) / f"{batch_id}-{partition}-{attempt}-{step}").touch()


@dataclass(frozen=True)
class PauseBrokerInBatch(_Hook):
    """Once, in batch ``batch`` after partition 0's records were sent, pause the broker
    (SIGSTOP to ``pid``) for ``seconds``: a separate process sends SIGCONT, so the pause
    ends whatever becomes of the task and its worker."""

    pid: int = 0
    seconds: float = 0.0
    batch: int = 1

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        hit = batch_id == self.batch and partition == 0 and step == "after_send"
        if hit and self.once("paused"):
            os.kill(self.pid, signal.SIGSTOP)
            subprocess.Popen(
                ["sh", "-c", f"sleep {self.seconds}; kill -CONT {self.pid}"],
                start_new_session=True,
            )


@dataclass(frozen=True)
class KillEveryAttempt:
    """SIGKILL the Python worker running ``partition`` of ``batch`` at ``step``, on every
    attempt (the job then fails once Spark's retries run out)."""

    batch: int
    partition: int
    step: str

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        if (step, batch_id, partition) == (self.step, self.batch, self.partition):
            os.kill(os.getpid(), signal.SIGKILL)
