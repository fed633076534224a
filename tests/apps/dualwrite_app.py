"""A dual-write application for crash tests: one DualWriter transaction writing rows to
an ``events`` table and the same values to Kafka, SIGKILLed at a chosen step
(``--crash-at``; of the batch ``--crash-batch`` only, if given).

``--mode recover`` only starts the writer (recovery) and exits. Exit code 0, or -9 when
killed; ``--batches N`` writes N transactions; a fenced writer exits with code 3.
``--hold-after B --hold-until FILE``: after committing batch B, print "holding=B" and
wait (between two transactions, holding no lock) until FILE exists, then go on; exit code
4 if it does not appear within two minutes. ``--async`` runs the same with an
``AsyncDualWriter`` (``asyncio.run``): the same steps, killed the same way (``on_step``
runs in the writer's greenlet, on the event loop's thread).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable

from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from kafka_txn import FatalError
from kafka_txn.dualwrite.writer import STEPS, DualWriter


def events_table(name: str) -> Table:
    """The application's own table (a fresh MetaData each time: names differ per test)."""
    return Table(name, MetaData(), Column("batch", Integer), Column("value", String(64)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jdbc-url", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--events-table", required=True)
    parser.add_argument("--mode", choices=("run", "recover"), default="run")
    parser.add_argument("--crash-at", choices=("none", *STEPS), default="none")
    parser.add_argument("--crash-batch", type=int, default=None)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--batches", type=int, default=1)
    parser.add_argument("--records", type=int, default=4)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--hold-after", type=int, default=None)
    parser.add_argument("--hold-until", default=None)
    parser.add_argument("--async", dest="use_async", action="store_true")
    args = parser.parse_args(argv)

    args.current_batch = args.batch

    def on_step(step: str) -> None:
        if step == args.crash_at and args.crash_batch in (None, args.current_batch):
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup at all

    if args.use_async:
        return asyncio.run(_run_async(args, on_step))
    events = events_table(args.events_table)
    writer = DualWriter(
        {"bootstrap.servers": args.bootstrap_servers,
         "transactional.id": args.transactional_id},
        args.jdbc_url,
        on_step=on_step,
    )  # fmt: skip
    events.create(writer.engine, checkfirst=True)
    outcome = writer.start()
    print(f"outcome={outcome.value}", flush=True)
    if args.mode == "recover":
        writer.close()
        return 0
    try:
        for batch in range(args.batch, args.batch + args.batches):
            args.current_batch = batch
            values = [f"b{batch}-r{i}" for i in range(args.records)]
            with writer.transaction() as tx:
                tx.connection.execute(
                    insert(events), [{"batch": batch, "value": v} for v in values]
                )
                for value in values:
                    tx.produce(args.topic, value.encode())
            print(f"committed={batch}", flush=True)
            if batch == args.hold_after and not _hold(args.hold_until):
                return 4
            time.sleep(args.pause)
    except FatalError as exc:
        print(f"fenced={type(exc).__name__}: {exc}", flush=True)
        return 3
    finally:
        writer.close()
    return 0


async def _run_async(args: argparse.Namespace, on_step: Callable[[str], None]) -> int:
    """``main``'s run with an ``AsyncDualWriter``: the same output and exit codes."""
    # Imported here: the many tests that import events_table need no asyncio extension.
    from kafka_txn.aio import AsyncDualWriter

    events = events_table(args.events_table)
    writer = AsyncDualWriter(
        {"bootstrap.servers": args.bootstrap_servers,
         "transactional.id": args.transactional_id},
        args.jdbc_url,
        on_step=on_step,
    )  # fmt: skip
    async with writer.engine.begin() as conn:
        await conn.run_sync(lambda sync: events.create(sync, checkfirst=True))
    outcome = await writer.start()
    print(f"outcome={outcome.value}", flush=True)
    if args.mode == "recover":
        await writer.close()
        return 0
    try:
        for batch in range(args.batch, args.batch + args.batches):
            args.current_batch = batch
            values = [f"b{batch}-r{i}" for i in range(args.records)]
            async with writer.transaction() as tx:
                await tx.connection.execute(
                    insert(events), [{"batch": batch, "value": v} for v in values]
                )
                for value in values:
                    await tx.produce(args.topic, value.encode())
            print(f"committed={batch}", flush=True)
            if batch == args.hold_after and not await asyncio.to_thread(_hold, args.hold_until):
                return 4
            await asyncio.sleep(args.pause)
    except FatalError as exc:
        print(f"fenced={type(exc).__name__}: {exc}", flush=True)
        return 3
    finally:
        await writer.close()
    return 0


def _hold(until: str) -> bool:
    """Wait for the file ``until`` (what the test does meanwhile is then provably done
    while this writer is still at work); False after two minutes without it."""
    print(f"holding={until}", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(until):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


if __name__ == "__main__":
    sys.exit(main())
