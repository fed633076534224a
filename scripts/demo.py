"""The main job: run examples/consume_process_produce.py against a broker with one
injected failure, and verify that the output holds every input exactly once.

Uses the broker the test rig would (KAFKA_BOOTSTRAP_SERVERS, else testcontainers when a
Docker engine answers, else a local noida-db it starts and stops).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from examples import consume_process_produce as example  # noqa: E402
from kafka_txn import TransactionalProducer  # noqa: E402
from tests.rig import start_broker  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--fail-once-at", type=int, default=250)
    args = parser.parse_args(argv)

    broker = start_broker()
    try:
        print(f"broker: {broker.description}")
        source = broker.create_topic(partitions=3, prefix="demo-in")
        sink = broker.create_topic(partitions=3, prefix="demo-out")
        group = f"demo-{uuid.uuid4().hex[:8]}"
        inputs = [b"record-%05d" % i for i in range(args.records)]
        with TransactionalProducer(
            {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{group}-src"}
        ) as seed:
            seed.init_transactions()
            with seed.transaction():
                for i, value in enumerate(inputs):
                    seed.produce(source, value, key=b"%d" % i)
        print(f"produced {len(inputs)} input records to {source}")

        written = example.run(
            example.parse_args(
                [
                    "--bootstrap-servers",
                    broker.bootstrap_servers,
                    "--input-topic",
                    source,
                    "--output-topic",
                    sink,
                    "--group",
                    group,
                    "--transactional-id",
                    f"{group}-0",
                    "--idle-timeout",
                    "3",
                    "--fail-once-at",
                    str(args.fail_once_at),
                ]
            )
        )
        output = [v for _, v in broker.read_committed(sink, expected=len(inputs))]
        expected = Counter(v.upper() for v in inputs)
        got = Counter(output)
        missing = sum((expected - got).values())
        duplicated = sum((got - expected).values())

        reader = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
        try:
            parts = [TopicPartition(source, p) for p in range(3)]
            committed = sum(tp.offset for tp in reader.committed(parts, timeout=10))
        finally:
            reader.close()

        print(
            f"injected one processing failure at record {args.fail_once_at}: aborted, "
            "rewound and reprocessed"
        )
        print(f"committed transactions wrote {written} records; read_committed sees {len(output)}")
        print(
            f"missing: {missing}, duplicated: {duplicated}, "
            f"group offsets committed: {committed}/{len(inputs)}"
        )
        ok = missing == 0 and duplicated == 0 and committed == len(inputs)
        print("VERIFIED: exactly once" if ok else "FAILED: output is not exactly once")
        return 0 if ok else 1
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
