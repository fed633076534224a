"""Every example runs, against the rig's broker, and does what its docstring promises."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest

from examples import consume_process_produce as example
from kafka_txn import FatalError, TransactionalProducer

ROOT = Path(__file__).resolve().parent.parent


def _seed(broker, topic: str, values: list[bytes]) -> None:
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"seed-{topic}"}
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        with p.transaction():
            for i, v in enumerate(values):
                p.produce(topic, v, key=b"%d" % i)


def _args(broker, source, sink, group, *extra: str):
    return example.parse_args(
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
            "--batch-size",
            "20",
            *extra,
        ]
    )


def test_consume_process_produce_is_exactly_once_under_injected_failure(broker):
    source = broker.create_topic(partitions=3)
    sink = broker.create_topic(partitions=3)
    inputs = [b"v%03d" % i for i in range(300)]
    _seed(broker, source, inputs)

    group = f"g-{uuid.uuid4().hex[:8]}"
    written = example.run(
        _args(broker, source, sink, group, "--idle-timeout", "3", "--fail-once-at", "77")
    )
    assert written == len(inputs)
    output = Counter(v for _, v in broker.read_committed(sink, expected=len(inputs)))
    assert output == Counter(v.upper() for v in inputs)


def test_consume_process_produce_stops_on_fatal_error(broker):
    source = broker.create_topic(partitions=1)
    sink = broker.create_topic(partitions=1)
    _seed(broker, source, [b"first"])
    group = f"g-{uuid.uuid4().hex[:8]}"
    outcome: list[BaseException | int] = []

    def target() -> None:
        try:
            outcome.append(example.run(_args(broker, source, sink, group, "--idle-timeout", "30")))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    assert broker.read_committed(sink, expected=1) == [(b"0", b"FIRST")]

    # A second instance with the same transactional.id fences the running one.
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{group}-0"}
    with TransactionalProducer(conf) as usurper:
        usurper.init_transactions()
        _seed(broker, source, [b"second"])
        worker.join(timeout=60)
    assert not worker.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], FatalError), outcome


def test_consume_process_produce_aborts_before_it_rewinds(mock_cluster, monkeypatch):
    """The example aborts a failed transaction before it rewinds, and rewinds without an
    offset fetch: the mock cluster answers OffsetFetch with UNSTABLE_OFFSET_COMMIT (what
    Apache Kafka answers while the transaction's offsets are pending) from the failure
    until the abort. Every record is then processed, the failed batch twice."""
    from confluent_kafka import KafkaError, Producer

    from kafka_txn.testing import ApiKey

    for name in ("in", "out"):
        mock_cluster.create_topic(name, partitions=1)
    seed = Producer({"bootstrap.servers": mock_cluster.bootstrap_servers})
    for i in range(5):
        seed.produce("in", b"v%d" % i)
    assert seed.flush(30) == 0
    processed: list[bytes] = []
    events: list[str] = []

    def process(msg):
        processed.append(msg.value())
        if len(processed) == 1:  # the transaction has offsets pending from here on
            mock_cluster.push_request_errors(
                ApiKey.OFFSET_FETCH, *[KafkaError.UNSTABLE_OFFSET_COMMIT] * 100_000
            )
        return msg.value().upper()

    make_producer = example.make_producer

    def producer_that_reports_its_abort(args):
        producer = make_producer(args)
        abort = producer.abort_transaction

        def abort_then_settle(*a, **kw):
            abort(*a, **kw)
            events.append("aborted")
            mock_cluster.clear_request_errors(ApiKey.OFFSET_FETCH)

        producer.abort_transaction = abort_then_settle
        return producer

    monkeypatch.setattr(example, "process", process)
    monkeypatch.setattr(example, "make_producer", producer_that_reports_its_abort)
    args = example.parse_args(
        ["--bootstrap-servers", mock_cluster.bootstrap_servers, "--input-topic", "in",
         "--output-topic", "out", "--group", "g", "--transactional-id", "ex-0",
         "--idle-timeout", "10", "--fail-once-at", "2"]
    )  # fmt: skip
    assert example.run(args) == 5
    assert events == ["aborted"]
    assert processed == [b"v0", b"v0", b"v1", b"v2", b"v3", b"v4"]


def test_consume_process_produce_commits_again_when_the_outcome_is_unknown(
    mock_cluster, monkeypatch
):
    """A commit that runs out of time with retriable errors (outcome unknown) is called
    again, not aborted: the example commits its batch once and never aborts."""
    from confluent_kafka import KafkaError, Producer

    from kafka_txn.testing import ApiKey

    for name in ("in", "out"):
        mock_cluster.create_topic(name, partitions=1)
    seed = Producer({"bootstrap.servers": mock_cluster.bootstrap_servers})
    for i in range(3):
        seed.produce("in", b"v%d" % i)
    assert seed.flush(30) == 0
    calls: list[str] = []

    def producer_with_a_slow_first_commit(args):
        # The example's producer, with a 2 s deadline instead of transaction.timeout.ms.
        producer = TransactionalProducer(
            {"bootstrap.servers": args.bootstrap_servers,
             "transactional.id": args.transactional_id},
            operation_timeout=2.0,
        )  # fmt: skip
        commit, abort = producer.commit_transaction, producer.abort_transaction

        def commit_spy(*a, **kw):
            calls.append("commit")
            if calls.count("commit") == 1:
                mock_cluster.push_request_errors(
                    ApiKey.END_TXN, *[KafkaError.COORDINATOR_LOAD_IN_PROGRESS] * 100_000
                )
            try:
                return commit(*a, **kw)
            finally:
                mock_cluster.clear_request_errors(ApiKey.END_TXN)

        def abort_spy(*a, **kw):
            calls.append("abort")
            return abort(*a, **kw)

        producer.commit_transaction, producer.abort_transaction = commit_spy, abort_spy
        return producer

    monkeypatch.setattr(example, "make_producer", producer_with_a_slow_first_commit)
    args = example.parse_args(
        ["--bootstrap-servers", mock_cluster.bootstrap_servers, "--input-topic", "in",
         "--output-topic", "out", "--group", "g", "--transactional-id", "ex-0",
         "--idle-timeout", "10"]
    )  # fmt: skip
    assert example.run(args) == 3
    assert calls == ["commit", "commit"]


@pytest.mark.parametrize("argv", [[], ["--bootstrap-servers", "x"]])
def test_example_requires_its_options(argv, capsys):
    with pytest.raises(SystemExit) as info:
        example.parse_args(argv)
    assert info.value.code == 2
    assert "required" in capsys.readouterr().err


def test_dual_write_postgres_example(broker, postgres_jdbc):
    from sqlalchemy import create_engine, select

    from examples import dual_write_postgres as dw
    from kafka_txn.jdbc import jdbc_to_sqlalchemy

    topic = broker.create_topic()
    first_id = 1_000_000 + int(uuid.uuid4().int % 1_000_000) * 100
    args = dw.parse_args(
        ["--bootstrap-servers", broker.bootstrap_servers, "--jdbc-url", postgres_jdbc,
         "--topic", topic, "--transactional-id", f"orders-{uuid.uuid4().hex[:8]}",
         "--orders", "10", "--first-id", str(first_id)]
    )  # fmt: skip
    placed, refused = dw.run(args)
    assert (placed, refused) == (8, 2)
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    try:
        with engine.connect() as conn:
            ids = conn.execute(
                select(dw.ORDERS.c.id).where(dw.ORDERS.c.id >= first_id,
                                             dw.ORDERS.c.id < first_id + 10)
            ).scalars().all()  # fmt: skip
    finally:
        engine.dispose()
    events = broker.read_committed(topic, expected=8)
    import json

    assert sorted(json.loads(v)["id"] for _, v in events) == sorted(ids)
    assert len(ids) == 8


def test_spark_streaming_sink_example(broker, tmp_path):
    import json as _json

    from sqlalchemy import create_engine, text

    from kafka_txn.jdbc import jdbc_to_sqlalchemy

    (tmp_path / "in").mkdir()
    for f in range(2):
        lines = [_json.dumps({"id": f * 10 + i, "user": f"u{i % 3}", "action": "click"})
                 for i in range(10)]  # fmt: skip
        (tmp_path / "in" / f"e{f}.json").write_text("\n".join(lines) + "\n")
    topic = broker.create_topic(partitions=2)
    jdbc = f"jdbc:sqlite:{tmp_path}/events.db"
    argv = ["--bootstrap-servers", broker.bootstrap_servers, "--jdbc-url", jdbc,
            "--input", str(tmp_path / "in"), "--checkpoint", str(tmp_path / "ckpt"),
            "--topic", topic, "--prefix", f"ex-{uuid.uuid4().hex[:8]}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(2):  # a second run (a restart) finds nothing new to write
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "spark_streaming_sink.py"), *argv],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    ids = sorted(_json.loads(v)["id"] for _, v in broker.read_committed(topic, expected=20))
    assert ids == list(range(20))
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            assert sorted(conn.execute(text("SELECT id FROM events")).scalars()) == ids
    finally:
        engine.dispose()
