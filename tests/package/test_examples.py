"""Every example runs, against the rig's broker, and does what its docstring promises."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from examples import consume_process_produce as example
from kafka_txn import FatalError, TransactionalProducer
from kafka_txn.cli.local_broker import LocalBroker
from tests.support.rig import Broker, freeze

pytestmark = pytest.mark.slow  # the examples run end to end, a minute or more

ROOT = Path(__file__).resolve().parent.parent.parent
WAIT_S = 120.0
"""The bound of every wait for the example's progress (an example that stalls fails, never
hangs the run)."""


def _seed(broker, topic: str, values: list[bytes]) -> None:
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"seed-{topic}"}
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        with p.transaction():
            for i, v in enumerate(values):
                p.produce(topic, v, key=b"%d" % i)


def _seed_mock(cluster, values: list[bytes]) -> None:
    """Write ``values`` to the mock cluster's topic "in" with a plain confluent-kafka
    producer that is gone when this returns. Not a local of the test: the test's frame
    can outlive the test (on CPython 3.11 confluent-kafka pins an exception being handled
    when one of its calls raises inside the ``except`` block, with its traceback and the
    frames above it), and a producer it held, without a logger, would print "Connect to
    ... failed: Connection refused" to stderr for the rest of the run, once the mock
    cluster stops."""
    from confluent_kafka import Producer

    seed = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    for value in values:
        seed.produce("in", value)
    assert seed.flush(30) == 0


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


@pytest.mark.guarantee("6.1")
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


@pytest.mark.guarantee("6.7")
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


@pytest.mark.guarantee("6.4")
def test_consume_process_produce_aborts_before_it_rewinds(mock_cluster, monkeypatch):
    """The example aborts a failed transaction before it rewinds, and rewinds without an
    offset fetch: the mock cluster answers OffsetFetch with UNSTABLE_OFFSET_COMMIT (what
    Apache Kafka answers while the transaction's offsets are pending) from the failure
    until the abort. Every record is then processed, the failed batch twice."""
    from confluent_kafka import KafkaError

    from kafka_txn.testing import ApiKey

    for name in ("in", "out"):
        mock_cluster.create_topic(name, partitions=1)
    _seed_mock(mock_cluster, [b"v%d" % i for i in range(5)])
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


@pytest.mark.guarantee("6.5")
def test_consume_process_produce_commits_again_when_the_outcome_is_unknown(
    mock_cluster, monkeypatch
):
    """A commit that runs out of time with retriable errors (outcome unknown) is called
    again, not aborted: the example commits its batch once and never aborts."""
    from confluent_kafka import KafkaError

    from kafka_txn.testing import ApiKey

    for name in ("in", "out"):
        mock_cluster.create_topic(name, partitions=1)
    _seed_mock(mock_cluster, [b"v%d" % i for i in range(3)])
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


# ---------------------------------------------------------------- helpers of the cases below
def _seed_spread(
    broker, topic: str, values: list[bytes], partitions: int, keys: list[bytes] | None = None
) -> None:
    """``values`` round robin over the partitions, keyed by themselves (or ``keys``), in
    one transaction."""
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    with TransactionalProducer(conf) as p:
        p.init_transactions()
        with p.transaction():
            for i, v in enumerate(values):
                p.produce(topic, v, key=v if keys is None else keys[i], partition=i % partitions)


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def _capture(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except BaseException as exc:
        return exc


def _start(outcome: dict[str, object], name: str, fn: Callable[[], object]) -> threading.Thread:
    """``fn()`` in a thread; its result or exception goes to ``outcome[name]``."""
    thread = threading.Thread(target=lambda: outcome.update({name: _capture(fn)}), daemon=True)
    thread.start()
    return thread


def _exactly_once(values: list[bytes]) -> Counter[tuple[bytes | None, bytes | None]]:
    """What the sink must hold: each input's output (key, VALUE), once, nothing else."""
    return Counter((v, v.upper()) for v in values)


# ---------------------------------------------------------------- rebalance, takeover
@pytest.mark.guarantee("6.1")
def test_consume_process_produce_rebalance_mid_stream_is_exactly_once(broker, monkeypatch):
    """A second instance (its own transactional id, the same group) joins while the first
    is at work. The group rebalances between transactions: the first instance gives up
    partitions (on_revoke with partitions, while half of the input is not even written
    yet), both instances commit records, and an independent read_committed consumer
    (kafka-python, every partition assigned, read to the last stable offset) sees every
    input's output exactly once and nothing else."""
    partitions = 4
    source, sink = broker.create_topic(partitions), broker.create_topic(partitions)
    first = [b"a-%03d" % i for i in range(200)]
    second = [b"b-%03d" % i for i in range(200)]
    total = len(first) + len(second)
    _seed_spread(broker, source, first, partitions)

    def slow(msg):  # so that the first instance is still at work when the second joins
        time.sleep(0.005)
        return msg.value().upper()

    monkeypatch.setattr(example, "process", slow)
    group = f"g-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    stats = {"a": example.Stats(), "b": example.Stats()}
    outcome: dict[str, object] = {}

    def instance(name: str) -> threading.Thread:
        args = _args(broker, source, sink, group, "--idle-timeout", "600", "--batch-size", "10")
        args.transactional_id = f"{group}-{name}"
        return _start(outcome, name, lambda: example.run(args, stats[name], stop))

    def committed() -> int:
        return stats["a"].records + stats["b"].records

    threads = [instance("a")]
    try:
        _wait_until(lambda: stats["a"].records >= 20, "the first instance commits")
        threads.append(instance("b"))
        _wait_until(lambda: stats["b"].assigned > 0, "the second instance gets partitions")
        # An eager rebalance completes only once every member has given up its
        # partitions: the first instance's on_revoke has run by now.
        revoked_mid_stream, committed_then = stats["a"].revoked, committed()
        _seed_spread(broker, source, second, partitions)
        _wait_until(lambda: committed() >= total, "every input committed")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert revoked_mid_stream > 0 and committed_then < total
    assert outcome == {"a": stats["a"].records, "b": stats["b"].records}  # no error
    assert stats["a"].records > 0 and stats["b"].records > 0  # both did work
    assert committed() == total  # no input committed twice
    assert Counter(broker.read_committed(sink, expected=total)) == _exactly_once(first + second)


@pytest.mark.guarantee("6.7")
def test_consume_process_produce_restart_fences_a_zombie_and_takes_over(broker, monkeypatch):
    """An instance started again with the same --transactional-id while the old process
    still runs, stuck in the middle of a transaction (a zombie): the new instance's
    init_transactions() fences the zombie and aborts its open transaction; the zombie,
    once it wakes, stops with FatalError and leaves the group; the new instance takes the
    partition over from the group's committed offset. Every input's output is in the
    sink exactly once (kafka-python, read_committed)."""
    source, sink = broker.create_topic(1), broker.create_topic(1)
    inputs = [b"v%03d" % i for i in range(50)]
    _seed_spread(broker, source, inputs, 1)
    stuck, release = threading.Event(), threading.Event()

    def process(msg):
        if msg.value() == b"v025" and not stuck.is_set():  # outputs of v02x are sent
            stuck.set()
            release.wait(WAIT_S)
        return msg.value().upper()

    initialised: list[str] = []
    make_producer = example.make_producer

    def producer_that_reports_its_init(args):
        producer = make_producer(args)
        init = producer.init_transactions

        def init_spy(*a, **kw):
            init(*a, **kw)
            initialised.append(args.transactional_id)

        producer.init_transactions = init_spy
        return producer

    monkeypatch.setattr(example, "process", process)
    monkeypatch.setattr(example, "make_producer", producer_that_reports_its_init)
    group = f"g-{uuid.uuid4().hex[:8]}"
    args = _args(broker, source, sink, group, "--idle-timeout", "600", "--batch-size", "10")
    zombie_stats, new_stats = example.Stats(), example.Stats()
    stop_new = threading.Event()
    outcome: dict[str, object] = {}
    zombie = _start(outcome, "zombie", lambda: example.run(args, zombie_stats))
    new = None
    try:
        _wait_until(stuck.is_set, "the first instance is in the middle of a transaction")
        new = _start(outcome, "new", lambda: example.run(args, new_stats, stop_new))
        _wait_until(lambda: len(initialised) == 2, "the restarted instance fences the zombie")
        release.set()
        zombie.join(timeout=WAIT_S)
        _wait_until(lambda: zombie_stats.records + new_stats.records >= len(inputs), "all in")
    finally:
        release.set()
        stop_new.set()
        zombie.join(timeout=60)
        if new is not None:
            new.join(timeout=60)
    assert isinstance(outcome["zombie"], FatalError), outcome
    assert outcome["new"] == new_stats.records > 0
    assert zombie_stats.records + new_stats.records == len(inputs)
    assert Counter(broker.read_committed(sink, expected=len(inputs))) == _exactly_once(inputs)


# ---------------------------------------------------------------- commit failures
@pytest.mark.guarantee("6.5")
def test_consume_process_produce_commits_again_after_the_broker_cut_a_commit_off(monkeypatch):
    """A real broker stops answering (SIGSTOP) during a commit: commit_transaction() runs
    out of time with its outcome unknown. The example calls it again once the broker
    answers, never aborts, and an independent read_committed consumer (kafka-python)
    sees every input's output exactly once. A private broker: the test freezes it."""
    with LocalBroker() as local:
        rig = Broker(local.bootstrap_servers, local.description)
        source, sink = rig.create_topic(2), rig.create_topic(2)
        inputs = [b"v%03d" % i for i in range(60)]
        _seed_spread(rig, source, inputs, 2)
        calls: list[str] = []
        make_producer = example.make_producer

        def producer_whose_second_commit_is_cut_off(args):
            producer = make_producer(args)
            commit, abort = producer.commit_transaction, producer.abort_transaction

            def commit_spy(timeout=None):
                calls.append("commit")
                if calls.count("commit") != 2:
                    return commit(timeout)
                freeze(local._proc.pid)
                try:
                    return commit(3.0)  # the broker holds the request: outcome unknown
                finally:
                    os.kill(local._proc.pid, signal.SIGCONT)

            def abort_spy(timeout=None):
                calls.append("abort")
                return abort(timeout)

            producer.commit_transaction, producer.abort_transaction = commit_spy, abort_spy
            return producer

        monkeypatch.setattr(example, "make_producer", producer_whose_second_commit_is_cut_off)
        stats = example.Stats()
        group = f"g-{uuid.uuid4().hex[:8]}"
        assert example.run(_args(rig, source, sink, group, "--idle-timeout", "5"), stats) == 60
        assert "abort" not in calls
        assert calls.count("commit") == stats.transactions + 1  # the second one, twice
        assert Counter(rig.read_committed(sink, expected=60)) == _exactly_once(inputs)


@pytest.mark.guarantee("6.4")
def test_consume_process_produce_aborts_then_retries_a_failed_commit(mock_cluster, monkeypatch):
    """commit_transaction() fails abortably (CommitFailedException: the coordinator
    refuses EndTxn). The example aborts, rewinds to the batch's first offset, processes
    the batch again and commits it: commit, abort, commit. (The mock cluster: a real
    broker refuses no EndTxn on demand; the exactly-once checks on a real broker are the
    cases around this one.)"""
    from confluent_kafka import KafkaError

    from kafka_txn.testing import ApiKey

    for name in ("in", "out"):
        mock_cluster.create_topic(name, partitions=1)
    _seed_mock(mock_cluster, [b"v%d" % i for i in range(3)])
    calls: list[str] = []
    processed: list[bytes] = []

    def process(msg):
        processed.append(msg.value())
        return msg.value().upper()

    make_producer = example.make_producer

    def producer_whose_first_commit_is_refused(args):
        producer = make_producer(args)
        commit, abort = producer.commit_transaction, producer.abort_transaction

        def commit_spy(*a, **kw):
            calls.append("commit")
            if calls.count("commit") == 1:
                mock_cluster.push_request_errors(ApiKey.END_TXN, KafkaError.UNKNOWN_PRODUCER_ID)
            return commit(*a, **kw)

        def abort_spy(*a, **kw):
            calls.append("abort")
            return abort(*a, **kw)

        producer.commit_transaction, producer.abort_transaction = commit_spy, abort_spy
        return producer

    monkeypatch.setattr(example, "process", process)
    monkeypatch.setattr(example, "make_producer", producer_whose_first_commit_is_refused)
    args = example.parse_args(
        ["--bootstrap-servers", mock_cluster.bootstrap_servers, "--input-topic", "in",
         "--output-topic", "out", "--group", "g", "--transactional-id", "ex-0",
         "--idle-timeout", "10"]
    )  # fmt: skip
    stats = example.Stats()
    assert example.run(args, stats) == 3
    assert calls == ["commit", "abort", "commit"]
    assert processed == [b"v0", b"v1", b"v2"] * 2
    assert (stats.transactions, stats.aborts) == (1, 1)


def _topic_with_limit(broker, max_message_bytes: int) -> str:
    """A one-partition topic whose max.message.bytes is below the producer's limit: the
    broker refuses a larger record at delivery (MESSAGE_REJECTED)."""
    name = f"small-{uuid.uuid4().hex[:12]}"
    admin = broker.admin()
    config = {"max.message.bytes": str(max_message_bytes)}
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(timeout=60)
    _wait_until(lambda: name in admin.list_topics(name, timeout=10).topics, f"topic {name}")
    return name


@pytest.mark.parametrize("dead_letter", [True, False], ids=["dead_lettered", "skipped"])
@pytest.mark.guarantee("6.2")
def test_consume_process_produce_sets_aside_an_input_whose_output_is_rejected(broker, dead_letter):
    """An input whose output the broker refuses as too large (MESSAGE_REJECTED, at the
    commit's flush) is not retried forever: its batch goes again one record per
    transaction, the other records commit once, and after --max-attempts the input goes
    to the dead-letter topic with its offset (or, without one, is skipped); the loop
    ends at its idle timeout."""
    source, dlq = broker.create_topic(2), broker.create_topic(1)
    sink = _topic_with_limit(broker, 10_000)
    values = [b"ok-%02d" % i for i in range(30)]
    big = values[11] = b"x" * 20_000
    keys = [b"%d" % i for i in range(30)]
    _seed_spread(broker, source, values, 2, keys)
    extra = ["--max-attempts", "2", "--idle-timeout", "3"]
    if dead_letter:
        extra += ["--dead-letter-topic", dlq]
    stats, stop = example.Stats(), threading.Event()
    outcome: dict[str, object] = {}
    args = _args(broker, source, sink, f"g-{uuid.uuid4().hex[:8]}", *extra)
    worker = _start(outcome, "run", lambda: example.run(args, stats, stop))
    worker.join(timeout=WAIT_S)
    stop.set()  # only an example retrying forever is still running here
    worker.join(timeout=60)
    assert outcome["run"] == len(values), (outcome, stats)
    assert (stats.dead_lettered, stats.skipped) == ((1, 0) if dead_letter else (0, 1))
    expected = Counter((k, v.upper()) for k, v in zip(keys, values, strict=True) if v != big)
    assert Counter(broker.read_committed(sink, expected=len(values) - 1)) == expected
    set_aside = broker.read_committed(dlq, expected=1 if dead_letter else 0)
    assert set_aside == ([(b"11", big)] if dead_letter else [])


# ---------------------------------------------------------------- consumer errors
@pytest.mark.parametrize("loop", ["example", "processor"])
@pytest.mark.guarantee("6.8")
def test_a_fatal_consumer_error_stops_the_loop(mock_cluster, monkeypatch, loop):
    """librdkafka reports a fatal consumer error (here a static member fenced by another
    with its group.instance.id: FENCED_INSTANCE_ID on Heartbeat) through consume(), as an
    error of code _FATAL whose fatal() flag confluent-kafka leaves False. The example and
    ExactlyOnceProcessor (same failure table) stop with FatalError saying so, instead of
    logging it and polling on until their idle timeout."""
    from confluent_kafka import Consumer, KafkaError

    from kafka_txn.eos import ExactlyOnceProcessor

    heartbeat = 12  # Kafka protocol API key
    for name in ("in", "out"):
        mock_cluster.create_topic(name, partitions=1)
    _seed_mock(mock_cluster, [b"v0"])
    static = {"group.instance.id": "member-1", "heartbeat.interval.ms": 100}

    def process(msg):  # from the next heartbeat on, this member is fenced
        mock_cluster.push_request_errors(heartbeat, KafkaError.FENCED_INSTANCE_ID)
        return msg.value().upper()

    if loop == "example":
        monkeypatch.setattr(example, "Consumer", lambda conf: Consumer({**conf, **static}))
        monkeypatch.setattr(example, "process", process)
        args = example.parse_args(
            ["--bootstrap-servers", mock_cluster.bootstrap_servers, "--input-topic", "in",
             "--output-topic", "out", "--group", "g", "--transactional-id", "ex-0",
             "--idle-timeout", "30"]
        )  # fmt: skip
        run: Callable[[], object] = lambda: example.run(args)  # noqa: E731
    else:
        processor = ExactlyOnceProcessor(
            {"bootstrap.servers": mock_cluster.bootstrap_servers, "group.id": "g", **static},
            {"bootstrap.servers": mock_cluster.bootstrap_servers, "transactional.id": "p-0"},
            ["in"],
            lambda msg: [("out", process(msg))],
        )
        run = lambda: processor.run(idle_timeout=30)  # noqa: E731
    with pytest.raises(FatalError, match=r"(?i)consumer.*fenced|fenced.*consumer") as info:
        run()
    assert info.value.kafka_error.code() == KafkaError._FATAL


@pytest.mark.guarantee("6.8")
def test_consume_process_produce_logs_consumer_errors_and_goes_on(broker, caplog):
    """A consumer error that is not fatal (here the input topic does not exist:
    UNKNOWN_TOPIC_OR_PART) is logged as a warning, and the loop goes on until its idle
    timeout."""
    sink = broker.create_topic(1)
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    args = _args(broker, missing, sink, f"g-{uuid.uuid4().hex[:8]}", "--idle-timeout", "3")
    with caplog.at_level(logging.WARNING, logger=example.log.name):
        assert example.run(args) == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == example.log.name]
    assert any("consumer error" in m and missing in m for m in warnings), warnings


def test_consume_process_produce_script_stops_gracefully_on_sigterm(broker):
    """Run as a script (its main()), the example commits every input once, and SIGTERM
    ends it after the current transaction: exit status 0 and its summary line."""
    source, sink = broker.create_topic(2), broker.create_topic(2)
    inputs = [b"v%02d" % i for i in range(10)]
    _seed_spread(broker, source, inputs, 2)
    argv = ["--bootstrap-servers", broker.bootstrap_servers, "--input-topic", source,
            "--output-topic", sink, "--group", f"g-{uuid.uuid4().hex[:8]}",
            "--transactional-id", f"script-{uuid.uuid4().hex[:8]}",
            "--idle-timeout", "600"]  # fmt: skip
    script = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "consume_process_produce.py"), *argv],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        output = broker.read_committed(sink, expected=len(inputs), timeout=WAIT_S)
        script.send_signal(signal.SIGTERM)
        out, err = script.communicate(timeout=60)
    finally:
        if script.poll() is None:  # only when the script hangs
            script.kill()
            script.wait(timeout=30)
    assert script.returncode == 0, err[-3000:]
    assert f"committed {len(inputs)} input records exactly once" in out
    assert Counter(output) == _exactly_once(inputs)


@pytest.mark.parametrize("argv", [[], ["--bootstrap-servers", "x"]])
def test_example_requires_its_options(argv, capsys):
    with pytest.raises(SystemExit) as info:
        example.parse_args(argv)
    assert info.value.code == 2
    assert "required" in capsys.readouterr().err


def test_dual_write_postgres_example(broker, postgres_jdbc):
    from sqlalchemy import create_engine, select

    from examples import dual_write_postgres as dw
    from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy

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

    from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy

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


def test_every_example_is_listed_in_the_readme_and_run_by_a_test():
    """Each examples/*.py has its row in examples/README.md's table, and a test module
    under tests/ imports it or runs its file (the README says every example is run by a
    test)."""
    readme = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    tests = [p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("test_*.py")]
    for example_file in sorted((ROOT / "examples").glob("*.py")):
        name = example_file.stem
        if name == "__init__":
            continue
        assert f"| [{name}.py]({name}.py) |" in readme, f"examples/README.md does not list {name}"
        ways = (f"examples import {name}", f"examples.{name}", f"examples/{name}.py",
                f'"{name}.py"')  # fmt: skip
        assert any(way in text for text in tests for way in ways), f"no test runs {name}"
