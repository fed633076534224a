"""Step hooks for the Spark sink tests. They run inside Spark's Python workers, so they
are picklable objects of an importable module; each fires once, remembered by a marker
file in its folder (workers are separate processes)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path


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
    """Fail partition 0 of batch 1 on its first attempt, once after preparing and once
    after the database committed (the worst moment: Kafka still prepared)."""

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        hit = batch_id == 1 and partition == 0 and attempt == 0
        if hit and step in ("after_prepare", "after_db_commit") and self.once(f"fail-{step}"):
            raise RuntimeError(f"injected task failure at {step}")


class FailInBatchOne(_Hook):
    """Fail two attempts of batch 1 after the database commit."""

    def __call__(self, step: str, batch_id: int, partition: int, attempt: int) -> None:
        hit = batch_id == 1 and partition == 0 and step == "after_db_commit" and attempt < 2
        if hit and self.once(f"attempt-{attempt}"):
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
