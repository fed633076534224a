"""Adversarial tests of TransactionalProducer's promises:
a signal's exception at any point of begin_transaction(), a user callback raising while
close() aborts after a fatal error, another thread or a zombie during begin's wait.

Each test builds its schedule on the local broker (``broker`` fixture), through
tests/proxies/kafka_proxy.py where the coordinator must answer something the broker would not,
and checks Kafka with kafka-python's read_committed consumer (tests/support/rig.py). Each test
guards the promise it names; the one kept as a strict xfail shows a documented
non-guarantee (its reason says why).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

import kafka_txn.twophase.prepare as twophase_module
from kafka_txn import TransactionalProducer
from kafka_txn.errors import (
    CommitFailedException,
    FatalError,
    IllegalStateError,
    KafkaTxnError,
    TransactionOutcomeUnknownError,
)
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support import adversaries as support
from tests.support.adversaries import (
    interrupt_after,
    profiled,
    record_commit_timeouts,
    settle_id,
    txn_config,
)
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

_ILLEGAL_GENERATION = 22

two_phase_config = support.two_phase_config
proxy = support.proxy


class _Interrupted(BaseException):
    """Stands for a signal handler's exception (KeyboardInterrupt, SystemExit). Its own
    class: the error of an interrupted send names the exception's class, and a test
    matches that name."""


@pytest.mark.parametrize("two_phase", [True, False], ids=["two-phase", "plain"])
@pytest.mark.guarantee("2.7")
def test_a_signal_right_after_librdkafkas_begin_leaves_the_producer_usable(
    broker: Broker, topic: str, producer_config: dict[str, Any], two_phase: bool
) -> None:
    config = dict(producer_config)
    if two_phase:
        config["transaction.two.phase.commit.enable"] = True
    producer = TransactionalProducer(config, operation_timeout=20)
    try:
        producer.init_transactions()
        interrupt_after("begin_transaction", producer.begin_transaction)
        assert producer.state == "ready"
        # The caller handled the interruption and goes on with the next transaction.
        producer.begin_transaction()
        producer.produce(topic, b"after-the-signal")
        if two_phase:
            state = producer.prepare_transaction()
            producer.complete_transaction(state)
        else:
            producer.commit_transaction()
        assert broker.read_committed(topic, expected=1) == [(None, b"after-the-signal")]
    finally:
        producer.close(timeout=5)


@pytest.mark.guarantee("2.7")
def test_a_second_signal_while_the_interrupted_wait_is_undone_leaves_the_producer_usable(
    broker: Broker, topic: str, two_phase_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    producer = TransactionalProducer(two_phase_config, operation_timeout=20)
    real_time = twophase_module.time
    signals = []

    def interrupted_sleep(seconds: float) -> None:
        signals.append(seconds)  # the first signal arrives during the wait
        raise _Interrupted("first signal, during the spacing wait")

    try:
        producer.init_transactions()
        monkeypatch.setattr(
            twophase_module,
            "time",
            types.SimpleNamespace(monotonic=real_time.monotonic, sleep=interrupted_sleep),
        )
        assert producer._twophase is not None
        producer._twophase.last_started_by = real_time.monotonic() + 5  # a wait is due

        def second_signal(frame: Any, event: str, arg: Any) -> None:
            # the undo's first call: the second signal's exception is raised there
            if event == "call" and frame.f_code.co_name == "invalidate":
                sys.setprofile(None)
                raise _Interrupted("second signal, as the undo starts")

        original_undo = producer._completion._undo_begin

        def undo() -> None:
            sys.setprofile(second_signal)
            try:
                original_undo()
            finally:
                sys.setprofile(None)

        monkeypatch.setattr(producer._completion, "_undo_begin", undo)
        with pytest.raises(_Interrupted):
            producer.begin_transaction()
        assert signals, "the spacing wait did not run"
        monkeypatch.undo()
        assert producer.state == "ready"
        producer.begin_transaction()
        producer.produce(topic, b"after-two-signals")
        producer.complete_transaction(producer.prepare_transaction())
        assert broker.read_committed(topic, expected=1) == [(None, b"after-two-signals")]
    finally:
        producer.close(timeout=5)


def _group_metadata(bootstrap: str) -> tuple[Consumer, Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{time.monotonic_ns()}"})
    return consumer, consumer.consumer_group_metadata()


@pytest.mark.guarantee("1.7")
def test_close_after_the_group_refused_the_offsets_closes_when_a_callback_raises(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str
) -> None:
    proxy.fail(ApiKey.TXN_OFFSET_COMMIT, _ILLEGAL_GENERATION)
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id), operation_timeout=20
    )
    consumer, metadata = _group_metadata(broker.bootstrap_servers)

    def on_delivery(error: Any, message: Any) -> None:
        raise RuntimeError("the user's delivery callback")

    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"never-visible", on_delivery=on_delivery)
        with pytest.raises(FatalError):
            producer.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], metadata)
        assert producer.state == "fatal error"
        with pytest.raises(RuntimeError, match="the user's delivery callback") as raised:
            producer.close(timeout=10)
        assert producer.state == "closed"
        assert any("close()" in note for note in getattr(raised.value, "__notes__", []))
        assert broker.open_partitions(topic) == {}
        assert broker.read_committed(topic, expected=0) == []
    finally:
        consumer.close()
        if producer.state != "closed":
            producer.close(timeout=5)


@pytest.mark.guarantee("1.6")
def test_commit_again_after_a_signal_right_after_librdkafkas_commit_writes_no_duplicate(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    producer = TransactionalProducer(producer_config, operation_timeout=20)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"once")
        interrupt_after("commit_transaction", producer.commit_transaction)
        assert producer.state == "committing"
        # The state's advice: call commit_transaction() again, never abort.
        producer.commit_transaction()
        assert producer.state == "ready"
        assert broker.read_committed(topic, expected=1) == [(None, b"once")]
    finally:
        producer.close(timeout=5)


@pytest.mark.guarantee("1.6")
def test_abort_again_after_a_signal_right_after_librdkafkas_abort_leaves_a_usable_producer(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    producer = TransactionalProducer(producer_config, operation_timeout=20)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"aborted")
        producer.flush(10)
        interrupt_after("abort_transaction", producer.abort_transaction)
        assert producer.state == "aborting"
        producer.abort_transaction()  # the state's advice: call abort_transaction() again
        producer.begin_transaction()
        producer.produce(topic, b"next")
        producer.commit_transaction()
        assert broker.read_committed(topic, expected=1) == [(None, b"next")]
    finally:
        producer.close(timeout=5)


class _Held:
    """An object only a caller's frame holds."""


@pytest.mark.xfail(
    strict=True,
    reason="not guaranteed (docs/guarantees.md, Not guaranteed): a with block's exit runs "
    "while the body's exception is handled, so when librdkafka's abort raises there (the "
    "coordinator holds its EndTxn reply past operation_timeout), confluent-kafka's "
    "KafkaError keeps the body's exception, its traceback and the caller's frame for "
    "good. Passes the day confluent-kafka stops doing that",
)
def test_the_abort_of_a_transaction_block_lets_go_of_its_callers_frames(
    mock_cluster: Any, mock_config: Callable[..., dict[str, Any]], txn_id: str
) -> None:
    from kafka_txn.testing import ApiKey as MockApiKey

    mock_cluster.create_topic("t", partitions=1)
    mock_cluster.set_coordinator("transaction", txn_id, 1)
    producer = TransactionalProducer(mock_config(), operation_timeout=1.5)
    producer.init_transactions()

    def body_fails(held: _Held) -> str:
        try:
            with producer.transaction():
                producer.send("t", b"v", partition=0).result(timeout=10)
                mock_cluster.delay_replies(1, MockApiKey.END_TXN, 2500)
                raise RuntimeError("the body failed")
        except TransactionOutcomeUnknownError as exc:  # the abort did not complete in time
            return exc.operation
        return "aborted"

    try:
        held = _Held()
        freed = weakref.ref(held)
        assert body_fails(held) == "abort_transaction"
        del held
        gc.collect()
        assert freed() is None, "the caller's frame is still held"
    finally:
        time.sleep(1.5)  # the held reply arrives; then the abort completes
        producer.abort_transaction(timeout=10)
        producer.close(timeout=5)


_TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53


@pytest.mark.guarantee("1.13")
def test_close_aborts_a_transaction_whose_prepare_failed_fatally(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str
) -> None:
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=20
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"never-visible", partition=0)
        proxy.fail(ApiKey.DESCRIBE_TRANSACTIONS, _TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        with pytest.raises(FatalError):
            producer.prepare_transaction()
        assert producer.state == "fatal error"
        producer.close(timeout=10)
        assert broker.open_partitions(topic) == {}
        assert broker.read_committed(topic, expected=0) == []
    finally:
        producer.close(timeout=5)
        # whatever is still open, the id's next init aborts it
        proxy.clear()
        settle_id(broker, txn_id)


_TOPIC_AUTHORIZATION_FAILED = 29


@pytest.mark.guarantee("1.13")
def test_close_aborts_a_transaction_whose_commit_found_a_topic_not_authorized(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str
) -> None:
    denied = broker.create_topic(partitions=1)
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id), operation_timeout=20
    )
    proxy.fail(
        ApiKey.ADD_PARTITIONS_TO_TXN,
        _TOPIC_AUTHORIZATION_FAILED,
        when=lambda r: any(t.name == denied for t in r.body.v3_and_below_topics or ()),
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"written", partition=0).result(timeout=10)
        producer.produce(denied, b"not-authorized")
        with pytest.raises(FatalError):
            producer.commit_transaction()
        producer.close(timeout=10)
        assert broker.open_partitions(topic) == {}
        assert broker.read_committed(topic, expected=0) == []
    finally:
        producer.close(timeout=5)
        proxy.clear()
        settle_id(broker, txn_id)


@pytest.mark.guarantee("1.9")
def test_a_resumed_commit_with_a_short_timeout_gets_the_retry_floor(
    mock_cluster: Any, mock_config: Callable[..., dict[str, Any]], txn_id: str
) -> None:
    from kafka_txn.testing import ApiKey as MockApiKey

    mock_cluster.create_topic("t", partitions=1)
    mock_cluster.set_coordinator("transaction", txn_id, 1)
    producer = TransactionalProducer(mock_config(), operation_timeout=30)
    recording = record_commit_timeouts(producer)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"v", partition=0).result(timeout=10)
        mock_cluster.delay_replies(1, MockApiKey.END_TXN, 3000)
        with pytest.raises(TransactionOutcomeUnknownError):
            producer.commit_transaction(timeout=0.5)
        with pytest.raises(TransactionOutcomeUnknownError):
            producer.commit_transaction(timeout=0.2)  # resumed, the reply still held
        assert all(t >= 1.0 for t in recording.commit_timeouts[1:]), recording.commit_timeouts
    finally:
        time.sleep(3)  # the held reply arrives
        producer.commit_transaction(timeout=10)
        producer.close(timeout=5)


def test_close_after_the_group_refused_the_offsets_and_a_zombie_took_over_warns_nothing(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str
) -> None:
    """1.12 with 1.13: the group refused the offsets (fatal for kafka-txn, abortable for
    librdkafka), then a second producer with the same transactional id initialised
    (aborting the open transaction, bumping the epoch) before close(): close()'s abort
    is refused as fenced, no warning comes through, and nothing becomes visible."""
    proxy.fail(ApiKey.TXN_OFFSET_COMMIT, _ILLEGAL_GENERATION)
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id), operation_timeout=20
    )
    consumer, metadata = _group_metadata(broker.bootstrap_servers)
    zombie_killer = TransactionalProducer(txn_config(broker.bootstrap_servers, txn_id))
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"never-visible", partition=0).result(timeout=10)
        with pytest.raises(FatalError):
            producer.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], metadata)
        zombie_killer.init_transactions()  # aborts the open transaction, fences
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            producer.close(timeout=10)
            del producer
            gc.collect()
        assert [str(w.message) for w in caught] == []
        assert broker.open_partitions(topic) == {}
        zombie_killer.begin_transaction()
        zombie_killer.produce(topic, b"successor", partition=0)
        zombie_killer.commit_transaction()
        assert broker.read_committed(topic, expected=1) == [(None, b"successor")]
    finally:
        consumer.close()
        zombie_killer.close(timeout=5)


@pytest.mark.guarantee("1.13")
def test_close_from_a_signal_handler_during_prepare_aborts_the_transaction(
    broker: Broker, topic: str, two_phase_config: dict[str, Any], txn_id: str
) -> None:
    producer = TransactionalProducer(two_phase_config, operation_timeout=20)
    closed: list[str] = []

    def handler_runs_close(frame: Any, event: str, arg: Any) -> None:
        # a SIGTERM handler that closes the producer, run as prepare's flush returns
        if event == "c_return" and getattr(arg, "__name__", "") == "flush":
            sys.setprofile(None)
            producer.close(timeout=10)
            closed.append(producer.state)

    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"never-visible", partition=0)
        with profiled(handler_runs_close), pytest.raises(KafkaTxnError):
            producer.prepare_transaction()
        assert closed == ["closed"]
        assert broker.open_partitions(topic) == {}
        assert broker.read_committed(topic, expected=0) == []
    finally:
        producer.close(timeout=5)
        settle_id(broker, txn_id)


@pytest.mark.guarantee("6.9")
def test_processor_whose_offsets_the_group_refused_closes_both_clients_when_a_callback_raises(
    broker: Broker, proxy: KafkaProxy, txn_id: str
) -> None:
    from kafka_txn.eos import ExactlyOnceProcessor

    source, sink = broker.create_topic(partitions=1), broker.create_topic(partitions=1)
    seed = TransactionalProducer(txn_config(broker.bootstrap_servers, f"{txn_id}-seed"))
    seed.init_transactions()
    with seed.transaction():
        seed.produce(source, b"input", partition=0)
    seed.close()
    proxy.fail(ApiKey.TXN_OFFSET_COMMIT, _ILLEGAL_GENERATION)

    def on_delivery(error: Any, message: Any) -> None:
        raise RuntimeError("the user's delivery callback")

    processor = ExactlyOnceProcessor(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": f"g-{txn_id}"},
        {
            "bootstrap.servers": proxy.bootstrap_servers,
            "transactional.id": txn_id,
            "on_delivery": on_delivery,
        },
        [source],
        lambda record: [(sink, record.value())],
    )
    try:
        with pytest.raises(FatalError):
            processor.run(idle_timeout=20, max_batches=1)
        assert processor.producer.state == "closed"
        with pytest.raises(RuntimeError):  # closed: confluent-kafka refuses
            processor.consumer.assignment()
        assert broker.open_partitions(sink) == {}
    finally:
        with contextlib.suppress(Exception):
            processor.close()


def test_a_signal_right_after_the_prepared_commit_returned_is_in_doubt_then_recovered_once(
    broker: Broker, topic: str, two_phase_config: dict[str, Any]
) -> None:
    """2.3 with a signal's exception right after librdkafka's commit of a prepared
    transaction returned (the producer stays 'in doubt' though Kafka committed):
    complete_transaction() again raises TransactionInDoubtError (never an abort), and a
    fresh process's recovery from the stored state finds it committed; its records are
    visible once."""
    from kafka_txn.errors import TransactionInDoubtError
    from kafka_txn.twophase.recovery import TransactionOutcome

    producer = TransactionalProducer(two_phase_config, operation_timeout=20)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"once", partition=0)
        state = producer.prepare_transaction()
        interrupt_after("commit_transaction", lambda: producer.complete_transaction(state))
        assert producer.state == "in doubt"
        with pytest.raises(TransactionInDoubtError):
            producer.complete_transaction(state)
        with pytest.raises(KafkaTxnError):
            producer.abort_transaction()
    finally:
        producer.close(timeout=5)
    successor = TransactionalProducer(two_phase_config, operation_timeout=20)
    try:
        successor.init_transactions(keep_prepared_txn=True)
        outcome = successor.complete_transaction(str(state))
        assert outcome is TransactionOutcome.ALREADY_COMMITTED
        assert broker.read_committed(topic, expected=1) == [(None, b"once")]
        successor.begin_transaction()
        successor.produce(topic, b"next", partition=0)
        successor.complete_transaction(successor.prepare_transaction())
        assert broker.read_committed(topic, expected=2) == [(None, b"once"), (None, b"next")]
    finally:
        successor.close(timeout=5)


def _close_after_c_call(name: str, producer: TransactionalProducer, seen: list[str]) -> Any:
    """A profile function standing for a SIGTERM handler that calls ``producer.close()``
    and returns (no exception): run as the C function ``name`` returns, the point where
    CPython runs a handler for a signal that arrived during the call."""

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and getattr(arg, "__name__", "") == name:
            sys.setprofile(None)
            seen.append(producer.state)
            producer.close(timeout=10)

    return profile


def _fresh_producer_commits(broker: Broker, config: dict[str, Any], topic: str) -> None:
    """The id is usable again: a new instance initialises (settling whatever was left
    open), and its transaction commits."""
    successor = TransactionalProducer(config, operation_timeout=20)
    try:
        successor.init_transactions()
        successor.begin_transaction()
        successor.produce(topic, b"successor", partition=0)
        successor.commit_transaction()
    finally:
        successor.close(timeout=5)


@pytest.mark.parametrize("two_phase", [False, True], ids=["plain", "two-phase"])
@pytest.mark.guarantee("1.6")
def test_close_from_a_signal_handler_right_after_librdkafkas_commit_reports_the_commit(
    broker: Broker, topic: str, producer_config: dict[str, Any], two_phase: bool
) -> None:
    """1.6: a handler that closes the producer as librdkafka's commit returns (the
    commit is done at the broker) must not turn the commit into an error: the call
    returns as committed, the records are visible once, the producer is closed."""
    config = {**producer_config, "transaction.two.phase.commit.enable": two_phase}
    producer = TransactionalProducer(config, operation_timeout=20)
    seen: list[str] = []
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"once", partition=0)
        state = producer.prepare_transaction() if two_phase else None
        with profiled(_close_after_c_call("commit_transaction", producer, seen)):
            if state is not None:
                assert producer.complete_transaction(state).value == "committed"
            else:
                producer.commit_transaction()
        assert seen == ["in doubt" if two_phase else "committing"]
        assert producer.state == "closed"
        with pytest.raises(KafkaTxnError, match="after close"):
            producer.begin_transaction()
    finally:
        producer.close(timeout=5)
    assert broker.read_committed(topic, expected=1) == [(None, b"once")]
    _fresh_producer_commits(broker, config, topic)
    assert broker.read_committed(topic, expected=2) == [(None, b"once"), (None, b"successor")]


@pytest.mark.guarantee("1.6")
def test_close_from_a_signal_handler_right_after_librdkafkas_abort_reports_the_abort(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    producer = TransactionalProducer(producer_config, operation_timeout=20)
    seen: list[str] = []
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"aborted", partition=0)
        producer.flush(10)
        with profiled(_close_after_c_call("abort_transaction", producer, seen)):
            producer.abort_transaction()
        assert seen == ["aborting"]
        assert producer.state == "closed"
    finally:
        producer.close(timeout=5)
    assert broker.open_partitions(topic) == {}
    _fresh_producer_commits(broker, producer_config, topic)
    assert broker.read_committed(topic, expected=1) == [(None, b"successor")]


@pytest.mark.parametrize("two_phase", [False, True], ids=["plain", "two-phase"])
@pytest.mark.guarantee("1.6")
def test_close_from_a_signal_handler_right_after_librdkafkas_begin_refuses_the_transaction(
    broker: Broker, topic: str, producer_config: dict[str, Any], two_phase: bool
) -> None:
    """The transaction begun as the handler closed the producer cannot be used:
    begin_transaction() says the producer was closed (not an internal error), nothing is
    left open, and the id is usable by a new instance at once."""
    config = {**producer_config, "transaction.two.phase.commit.enable": two_phase}
    producer = TransactionalProducer(config, operation_timeout=20)
    seen: list[str] = []
    try:
        producer.init_transactions()
        with (
            profiled(_close_after_c_call("begin_transaction", producer, seen)),
            pytest.raises(KafkaTxnError, match="closed") as raised,
        ):
            producer.begin_transaction()
        assert "internal error" not in str(raised.value)
        assert seen == ["ready"]
        assert producer.state == "closed"
    finally:
        producer.close(timeout=5)
    _fresh_producer_commits(broker, config, topic)
    assert broker.read_committed(topic, expected=1) == [(None, b"successor")]


@pytest.mark.guarantee("1.6")
def test_close_from_a_signal_handler_right_after_librdkafkas_init_leaves_it_closed(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    producer = TransactionalProducer(producer_config, operation_timeout=20)
    seen: list[str] = []
    try:
        with profiled(_close_after_c_call("init_transactions", producer, seen)):
            producer.init_transactions()
        assert seen == ["new"]
        assert producer.state == "closed"
    finally:
        producer.close(timeout=5)
    _fresh_producer_commits(broker, producer_config, topic)
    assert broker.read_committed(topic, expected=1) == [(None, b"successor")]


@pytest.mark.guarantee("1.6")
def test_close_from_a_signal_handler_as_prepare_confirms_hands_out_no_state(
    broker: Broker, topic: str, two_phase_config: dict[str, Any], txn_id: str
) -> None:
    """The last moment of prepare: the coordinator confirmed the transaction, and a
    handler closes the producer (which aborts a preparing transaction). No state may be
    handed out for a transaction that cannot commit: prepare_transaction() raises, and
    nothing is left open or visible."""
    producer = TransactionalProducer(two_phase_config, operation_timeout=20)
    seen: list[str] = []

    def handler_runs_close(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code.co_name == "confirm":
            sys.setprofile(None)
            seen.append(producer.state)
            producer.close(timeout=10)

    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"never-visible", partition=0)
        with profiled(handler_runs_close), pytest.raises(KafkaTxnError, match="not prepared"):
            producer.prepare_transaction()
        assert seen == ["preparing"]
        assert producer.state == "closed"
        assert broker.open_partitions(topic) == {}
    finally:
        producer.close(timeout=5)
    _fresh_producer_commits(broker, two_phase_config, topic)
    assert broker.read_committed(topic, expected=1) == [(None, b"successor")]


@pytest.mark.parametrize("call", ["produce", "send"])
@pytest.mark.parametrize("two_phase", [False, True], ids=["plain", "two-phase"])
@pytest.mark.guarantee("2.1")
def test_a_send_interrupted_right_after_librdkafka_queued_it_fails_the_transaction(
    broker: Broker, topic: str, producer_config: dict[str, Any], call: str, two_phase: bool
) -> None:
    """2.1 (a send that raised is not in the transaction): a signal's exception right
    after librdkafka queued the record makes the send raise, though the record is
    queued. The caller sends it again; the transaction must not commit with both: commit
    raises CommitFailedException (prepare TransactionAbortableError) naming the
    interrupted send, and after abort and retry the record is visible once."""
    from kafka_txn.errors import CommitFailedException, TransactionAbortableError

    config = {**producer_config, "transaction.two.phase.commit.enable": two_phase}
    producer = TransactionalProducer(config, operation_timeout=20)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        send = getattr(producer, call)
        interrupt_after("produce", lambda: send(topic, b"order-1", partition=0), _Interrupted)
        send(topic, b"order-1", partition=0)  # the caller's retry of the send
        failure = TransactionAbortableError if two_phase else CommitFailedException
        with pytest.raises(failure, match="_Interrupted during produce"):
            if two_phase:
                producer.prepare_transaction()
            else:
                producer.commit_transaction()
        producer.abort_transaction()
        assert broker.read_committed(topic, expected=0) == []
        producer.begin_transaction()  # the retry of the whole transaction
        send(topic, b"order-1", partition=0)
        if two_phase:
            producer.complete_transaction(producer.prepare_transaction())
        else:
            producer.commit_transaction()
        assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    finally:
        producer.close(timeout=5)


_END_TXN_ANSWERS_AFTER_APPLYING = pytest.mark.parametrize(
    "code",
    [KafkaError.REQUEST_TIMED_OUT, KafkaError.UNKNOWN, KafkaError.NETWORK_EXCEPTION],
    ids=["request-timed-out", "unknown-server-error", "network-exception"],
)


@_END_TXN_ANSWERS_AFTER_APPLYING
@pytest.mark.guarantee("1.3")
def test_a_commit_the_coordinator_applied_then_answered_with_an_error_is_never_commit_failed(
    broker: Broker, topic: str, txn_id: str, code: int
) -> None:
    """1.2/1.3: the coordinator applied EndTxn(commit) and answered with an error that
    is not a refusal (a Kafka-compatible broker, or a gateway in between; Apache Kafka
    maps a timed-out append to COORDINATOR_NOT_AVAILABLE, which librdkafka retries).
    librdkafka calls it abortable; CommitFailedException's abort-and-retry would write
    the records twice. commit_transaction() raises FatalError saying the outcome is
    unknown and not to retry; the records are visible once, and a new producer for the id
    goes on."""
    with KafkaProxy(broker.bootstrap_servers) as proxy:
        config = txn_config(proxy.bootstrap_servers, txn_id)
        producer = TransactionalProducer(config, operation_timeout=20)
        try:
            producer.init_transactions()
            proxy.fail(ApiKey.END_TXN, code, forward=True, times=1)
            producer.begin_transaction()
            producer.produce(topic, b"order-1")
            with pytest.raises(FatalError, match="whether it committed is unknown") as raised:
                producer.commit_transaction()
            assert not isinstance(raised.value, CommitFailedException)
            assert raised.value.kafka_error.code() == code
            assert producer.state == "fatal error"
        finally:
            producer.close(timeout=5)
    assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    direct = {**config, "bootstrap.servers": broker.bootstrap_servers}
    _fresh_producer_commits(broker, direct, topic)
    visible = sorted(broker.read_committed(topic, expected=2))
    assert visible == [(None, b"order-1"), (None, b"successor")]


@pytest.mark.guarantee("1.3")
def test_a_commit_refused_by_endtxn_with_an_abortable_refusal_is_still_commit_failed(
    broker: Broker, topic: str, txn_id: str
) -> None:
    """The other side of the line: an EndTxn answer with which the coordinator refuses a
    commit it did not apply (TRANSACTION_ABORTABLE, KIP-890) stays CommitFailedException,
    and abort and retry writes the records once."""
    with KafkaProxy(broker.bootstrap_servers) as proxy:
        config = txn_config(proxy.bootstrap_servers, txn_id)
        producer = TransactionalProducer(config, operation_timeout=20)
        try:
            producer.init_transactions()
            proxy.fail(ApiKey.END_TXN, KafkaError.TRANSACTION_ABORTABLE, times=1)
            producer.begin_transaction()
            producer.produce(topic, b"order-1")
            with pytest.raises(CommitFailedException):
                producer.commit_transaction()
            producer.abort_transaction()
            producer.begin_transaction()
            producer.produce(topic, b"order-1")
            producer.commit_transaction()
        finally:
            producer.close(timeout=5)
    assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]


@pytest.mark.guarantee("1.6")
def test_init_again_after_a_signal_right_after_librdkafkas_init_leaves_a_usable_producer(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """Guarantee 1.6: after a signal right after librdkafka's init, calling
    init_transactions() again leaves a usable producer."""
    producer = TransactionalProducer(producer_config, operation_timeout=20)
    try:
        interrupt_after("init_transactions", producer.init_transactions)
        assert producer.state == "new"
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"after-the-signal")
        producer.commit_transaction()
        assert broker.read_committed(topic, expected=1) == [(None, b"after-the-signal")]
    finally:
        producer.close(timeout=5)


@pytest.mark.guarantee("1.6")
def test_close_from_a_signal_handler_during_produce_aborts_the_transaction(
    broker: Broker, topic: str, producer_config: dict[str, Any]
) -> None:
    """close() ('An open transaction is aborted within timeout') and guarantee 1.6: close()
    from a signal handler during produce aborts the transaction."""
    producer = TransactionalProducer(producer_config, operation_timeout=20)
    closed: list[str] = []

    def sigterm_handler(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and getattr(arg, "__name__", "") == "produce":
            sys.setprofile(None)
            producer.close(timeout=2)  # the handler closes and returns
            closed.append(producer.state)

    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"first", partition=0).result(timeout=10)  # registered
        sys.setprofile(sigterm_handler)
        try:
            producer.produce(topic, b"second", partition=0)
        except IllegalStateError:
            pass  # reporting that close() ran is fine too
        finally:
            sys.setprofile(None)
        assert closed == ["closed"]
        assert broker.open_partitions(topic) == {}, "close() left the transaction open"
        assert broker.read_committed(topic, expected=0) == []
    finally:
        producer.close(timeout=5)
