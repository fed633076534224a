"""prepare_transaction() asks the coordinator (DescribeTransactions) while its flush runs
when the coordinator is a millisecond or more away: the answer is used only
when it shows this transaction, and anything else (an answer that overtook the
transaction's AddPartitionsToTxn, an error) is asked again the ordinary way. Run through
tests/proxies/kafka_proxy.py, which puts the coordinator's answers 5 ms away and holds back or
fails requests on the real broker."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kafka_txn import PreparedTxnState, TransactionalProducer, TransactionOutcome
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.coordinator.connection import BrokerConnection
from kafka_txn.errors import KafkaTxnError
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy, Request
from tests.support.adversaries import Interrupted, profiled, txn_config
from tests.support.rig import Broker

pytestmark = [pytest.mark.broker, pytest.mark.adversary]


@pytest.fixture
def proxy(broker: Broker) -> Iterator[KafkaProxy]:
    with KafkaProxy(broker.bootstrap_servers) as kafka_proxy:
        # A coordinator far enough away for prepare to ask it during the flush.
        kafka_proxy.delay(ApiKey.DESCRIBE_TRANSACTIONS, 5)
        yield kafka_proxy


@pytest.fixture
def producer(producer_config: dict[str, Any], proxy: KafkaProxy) -> Iterator[TransactionalProducer]:
    p = TransactionalProducer(
        {
            **producer_config,
            "bootstrap.servers": proxy.bootstrap_servers,
            "transaction.two.phase.commit.enable": True,
        }
    )
    p.init_transactions()
    yield p
    p.close()


def _transaction(producer: TransactionalProducer, topic: str, value: bytes) -> PreparedTxnState:
    producer.begin_transaction()
    producer.produce(topic, value)
    return producer.prepare_transaction()


def _warm_up(producer: TransactionalProducer, topic: str) -> PreparedTxnState:
    """Two transactions: the first prepare connects to the coordinator, the second
    measures its round trip (prepare asks during the flush only when it is long)."""
    for value in (b"warm-1", b"first"):
        state = _transaction(producer, topic, value)
        producer.complete_transaction(state)
    return state


def _describe(broker: Broker, txn_id: str) -> Any:
    settings = ConnectionSettings.from_librdkafka({"bootstrap.servers": broker.bootstrap_servers})
    with CoordinatorClient(settings, txn_id) as client:
        return client.describe()


def _hold_back(ms: float) -> Any:
    def hold(request: Request) -> None:
        time.sleep(ms / 1000)

    return hold


@pytest.mark.guarantee("2.6")
def test_an_answer_that_overtook_the_partition_registration_is_asked_again(
    broker: Broker, topic: str, producer: TransactionalProducer, producer_config: dict[str, Any],
    proxy: KafkaProxy,
) -> None:  # fmt: skip
    """AddPartitionsToTxn reaches the coordinator 100 ms late, so the DescribeTransactions
    sent during the flush shows the previous transaction (CompleteCommit) for a while:
    prepare asks again until the coordinator shows this one, and never takes the
    previous transaction's answer for this one's (which would prepare the empty state:
    "nothing to commit")."""
    first = _warm_up(producer, topic)
    before = proxy.count(ApiKey.DESCRIBE_TRANSACTIONS)
    late = proxy.before(ApiKey.ADD_PARTITIONS_TO_TXN, _hold_back(100), times=1)
    state = _transaction(producer, topic, b"second")
    asked = proxy.count(ApiKey.DESCRIBE_TRANSACTIONS) - before
    assert late.hits == 1
    assert asked >= 2, asked  # the answers showing the previous transaction were asked again
    assert not state.is_empty
    assert state.txn_start_ms is not None and state.txn_start_ms != first.txn_start_ms
    seen = _describe(broker, producer_config["transactional.id"])
    assert (seen.state, seen.start_time_ms) == ("Ongoing", state.txn_start_ms)
    assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    values = sorted(v for _, v in broker.read_committed(topic, expected=3))
    assert values == [b"first", b"second", b"warm-1"]


@pytest.mark.guarantee("2.6")
def test_an_answer_read_during_the_flush_that_is_an_error_is_asked_again(
    broker: Broker, topic: str, producer: TransactionalProducer, producer_config: dict[str, Any],
    proxy: KafkaProxy,
) -> None:  # fmt: skip
    """The DescribeTransactions sent during the flush (while AddPartitionsToTxn is held
    back, so it can only be that one) is answered COORDINATOR_LOAD_IN_PROGRESS: prepare
    asks again after the flush, the ordinary way, and prepares this transaction."""
    first = _warm_up(producer, topic)
    holding = threading.Event()

    def hold(request: Request) -> None:
        holding.set()
        time.sleep(0.1)
        holding.clear()

    proxy.before(ApiKey.ADD_PARTITIONS_TO_TXN, hold, times=1)
    refused = proxy.fail(
        ApiKey.DESCRIBE_TRANSACTIONS, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, times=1,
        when=lambda request: holding.is_set(),
    )  # fmt: skip
    state = _transaction(producer, topic, b"second")
    assert refused.hits == 1  # the one sent during the flush
    seen = _describe(broker, producer_config["transactional.id"])
    assert (seen.state, seen.start_time_ms) == ("Ongoing", state.txn_start_ms)
    assert state.txn_start_ms != first.txn_start_ms
    assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    values = sorted(v for _, v in broker.read_committed(topic, expected=3))
    assert values == [b"first", b"second", b"warm-1"]


@pytest.mark.guarantee("2.6")
def test_a_prepare_that_fails_with_an_answer_in_flight_leaves_the_next_one_working(
    broker: Broker, topic: str, producer: TransactionalProducer, proxy: KafkaProxy
) -> None:
    """The flush times out (AddPartitionsToTxn held back past prepare's timeout) while a
    DescribeTransactions is in flight: prepare fails (abortable), its unread answer is
    dropped with its connection, and the next transaction prepares and commits."""
    _warm_up(producer, topic)
    before = proxy.count(ApiKey.DESCRIBE_TRANSACTIONS)
    proxy.before(ApiKey.ADD_PARTITIONS_TO_TXN, _hold_back(1500), times=1)
    producer.begin_transaction()
    producer.produce(topic, b"dropped")
    with pytest.raises(Exception, match="undelivered"):
        producer.prepare_transaction(timeout=0.5)
    assert proxy.count(ApiKey.DESCRIBE_TRANSACTIONS) > before  # one was in flight
    producer.abort_transaction()
    state = _transaction(producer, topic, b"next")
    assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    values = sorted(v for _, v in broker.read_committed(topic, expected=3))
    assert values == [b"first", b"next", b"warm-1"]


def test_a_signal_as_an_abandoned_exchange_closes_never_keeps_the_connection(broker: Broker):
    """An exchange abandoned while a signal's exception strikes as its socket's close()
    returns (the check for pending signals after a call) still releases the connection:
    the next request on it is not made to wait until its deadline."""
    from kafka_txn.coordinator.messages import API_VERSIONS

    host, _, port = broker.bootstrap_servers.split(",")[0].rpartition(":")
    settings = ConnectionSettings(bootstrap=((host, int(port)),))
    conn = BrokerConnection(settings, host, int(port), deadline=time.monotonic() + 30)
    try:
        exchange = conn.send(API_VERSIONS, 0, {})
        close_code = BrokerConnection.close.__code__

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            if frame.f_code is not close_code:
                return None

            def local(frame: Any, event: str, arg: Any) -> Any:
                if event == "return":
                    raise KeyboardInterrupt  # as a signal handler would, there
                return local

            return local

        sys.settrace(tracer)
        try:
            with pytest.raises(KeyboardInterrupt):
                exchange.abandon()
        finally:
            sys.settrace(None)
        assert conn._lock.acquire(blocking=False), "the abandoned exchange kept the connection"
        conn._lock.release()
    finally:
        conn.close()


def _raise_when_returning(code: Any) -> Any:
    """A profile function that raises ``Interrupted`` as the Python function whose code
    is ``code`` returns: the schedule of a signal whose handler's exception CPython
    raises at the first evaluation check in the caller, right after the call."""

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code is code:
            sys.setprofile(None)
            raise Interrupted("signal right after BrokerConnection.send returned")

    return profile


@pytest.mark.guarantee("2.2")
def test_a_signal_as_prepares_early_describe_is_sent_leaves_prepare_bounded(
    broker: Broker, topic: str, txn_id: str
) -> None:
    """two-phase-commit.md's deadline and guarantee 1.6: a signal as prepare's early
    DescribeTransactions is sent leaves the next prepare bounded by its deadline (it must
    not wait forever on the connection's lock)."""
    with KafkaProxy(broker.bootstrap_servers, delay_ms=3) as slow:
        producer = TransactionalProducer(
            txn_config(slow.bootstrap_servers, txn_id, two_phase=True), operation_timeout=5
        )
        stuck: threading.Thread | None = None
        try:
            producer.init_transactions()
            # Two transactions: the first prepare connects, the second measures the
            # coordinator's round trip (>= 6 ms through the proxy).
            for _ in range(2):
                producer.begin_transaction()
                producer.produce(topic, b"order-0", partition=0)
                producer.complete_transaction(producer.prepare_transaction())
            assert producer._twophase is not None
            assert producer._twophase.describe_rtt_s is not None
            # Second: prepare sends its DescribeTransactions early; a signal strikes as
            # the send returns.
            producer.begin_transaction()
            producer.produce(topic, b"order-1", partition=0)
            with (
                profiled(_raise_when_returning(BrokerConnection.send.__code__)),
                pytest.raises(Interrupted),
            ):
                producer.prepare_transaction()
            producer.abort_transaction()
            # Third: prepare must end within its deadline, one way or another.
            producer.begin_transaction()
            producer.produce(topic, b"order-2", partition=0)
            outcome: list[Any] = []

            def prepare() -> None:
                try:
                    outcome.append(producer.prepare_transaction(timeout=5))
                except BaseException as exc:
                    outcome.append(exc)

            stuck = threading.Thread(target=prepare, daemon=True)
            stuck.start()
            stuck.join(30)  # a liveness bound, 6x the deadline: not a timing assertion
            assert not stuck.is_alive(), "prepare_transaction() never returned"
            stuck = None
            if isinstance(outcome[0], PreparedTxnState):
                producer.complete_transaction(outcome[0])
                expected = [(None, b"order-0")] * 2 + [(None, b"order-2")]
            else:
                assert isinstance(outcome[0], KafkaTxnError), outcome
                producer.abort_transaction()
                expected = [(None, b"order-0")] * 2
            assert broker.read_committed(topic, expected=len(expected)) == expected
        finally:
            if stuck is not None:  # let the waiting thread go: release the lost lock
                client = producer._twophase.coordinator._client  # type: ignore[union-attr]
                with contextlib.suppress(Exception):
                    client._coordinator._lock.release()  # type: ignore[union-attr]
                stuck.join(30)
            producer.close(timeout=5)
