"""Adversarial tests of the producer, two-phase commit and the
coordinator client, written from the promises only (README, docs/guarantees.md,
docs/reference/errors.md, docs/guide/two-phase-commit.md).

Each test runs on the local broker (``broker`` fixture), through tests/proxies/kafka_proxy.py
where the coordinator must answer something the broker would not (a well-framed
DescribeTransactions or FindCoordinator answer whose content is not what was asked), and
checks Kafka with kafka-python's read_committed consumer (tests/support/rig.py).

Some tests guard a promise against a malformed coordinator answer or a badly timed
signal; the others show an adversary under which the promise holds.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_txn import CommitFailedException, PreparedTxnState, TransactionalProducer
from kafka_txn.coordinator import codec, messages
from kafka_txn.coordinator.connection import BrokerConnection
from kafka_txn.eos import ExactlyOnceProcessor
from kafka_txn.errors import (
    FatalError,
    KafkaTxnError,
    TransactionAbortableError,
    TransactionOutcomeUnknownError,
)
from kafka_txn.twophase.recovery import TransactionOutcome
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support import adversaries as support
from tests.support.adversaries import (
    Interrupted,
    prefixing_processor,
    profiled,
    three_inputs,
    txn_config,
)
from tests.support.rig import Broker

proxy = support.proxy


def _no_states(request: Any, response: Any) -> None:
    """A DescribeTransactions answer listing no transaction (a broker or gateway bug):
    well framed, every field readable."""
    response.transaction_states = []


def _two_states(request: Any, response: Any) -> None:
    """An answer listing the asked id twice."""
    response.transaction_states = list(response.transaction_states) * 2


def _null_topics(request: Any, response: Any) -> None:
    """An answer whose transaction has a null topics array (KIP-482 compact null)."""
    for state in response.transaction_states:
        state.topics = None


def _prepared_on_proxy(
    broker: Broker, proxy: KafkaProxy, topic: str, txn_id: str
) -> tuple[TransactionalProducer, Any]:
    crashed = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=20
    )
    crashed.init_transactions()
    crashed.begin_transaction()
    crashed.produce(topic, b"order-1", partition=0)
    return crashed, crashed.prepare_transaction()


# --------------------------------------------------------------------------- 3.9 / errors.md
_NULL_TOPICS = pytest.param(_null_topics, id="null_topics")


@pytest.mark.parametrize(
    "edit",
    [pytest.param(_no_states, id="none"), pytest.param(_two_states, id="two"), _NULL_TOPICS],
)
@pytest.mark.guarantee("3.9")
def test_recovery_with_a_describe_answer_of_the_wrong_length_is_unknown(
    broker: Broker, proxy: KafkaProxy, topic: str, txn_id: str, edit: Any
) -> None:
    """Guarantee 3.9 and errors.md: a DescribeTransactions answer listing no transaction,
    two, or one with null topics makes recovery raise TransactionOutcomeUnknownError (not
    a bare ValueError), and the same call settles the transaction once the coordinator
    answers."""
    crashed, state = _prepared_on_proxy(broker, proxy, topic, txn_id)
    crashed.close(timeout=5)  # leaves the prepared transaction open, as a crash would
    fresh = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=3
    )
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        rule = proxy.rewrite(ApiKey.DESCRIBE_TRANSACTIONS, edit)
        try:
            with pytest.raises(TransactionOutcomeUnknownError):
                fresh.complete_transaction(state)
        finally:
            proxy.remove(rule)
        # Nothing was decided: the same call settles it once the coordinator answers.
        assert fresh.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    finally:
        fresh.close(timeout=5)


@pytest.mark.guarantee("2.2")
def test_prepare_with_a_describe_answer_listing_nothing_is_abortable(
    broker: Broker, proxy: KafkaProxy, topic: str, txn_id: str
) -> None:
    """errors.md / two-phase-commit.md: a DescribeTransactions answer listing nothing makes
    prepare raise TransactionAbortableError (not a bare ValueError)."""
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=3
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"order-1", partition=0)
        rule = proxy.rewrite(ApiKey.DESCRIBE_TRANSACTIONS, _no_states)
        try:
            with pytest.raises(TransactionAbortableError):
                producer.prepare_transaction()
        finally:
            proxy.remove(rule)
        producer.abort_transaction()
        assert broker.read_committed(topic, expected=0) == []
    finally:
        producer.close(timeout=5)


def _no_coordinators(request: Any, response: Any) -> None:
    if hasattr(response, "coordinators"):
        response.coordinators = []
    else:  # pragma: no cover - older FindCoordinator: nothing to empty
        pass


@pytest.mark.guarantee("3.9")
def test_recovery_with_a_find_coordinator_answer_listing_nothing_is_unknown(
    broker: Broker, proxy: KafkaProxy, topic: str, txn_id: str
) -> None:
    """Guarantee 3.9: a FindCoordinator answer listing no coordinator makes recovery raise
    a KafkaTxnError (not a bare IndexError), and the same call settles it later."""
    crashed, state = _prepared_on_proxy(broker, proxy, topic, txn_id)
    crashed.close(timeout=5)
    fresh = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id, two_phase=True), operation_timeout=3
    )
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        rule = proxy.rewrite(ApiKey.FIND_COORDINATOR, _no_coordinators, versions=range(4, 99))
        try:
            with pytest.raises(KafkaTxnError):
                fresh.complete_transaction(state)
        finally:
            proxy.remove(rule)
        assert rule.hits, "the coordinator client sent no FindCoordinator v4+"
        assert fresh.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    finally:
        fresh.close(timeout=5)


# --------------------------------------------------------------------------- signals
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
                client = producer._twophase._client  # type: ignore[union-attr]
                with contextlib.suppress(Exception):
                    client._coordinator._lock.release()  # type: ignore[union-attr]
                stuck.join(30)
            producer.close(timeout=5)


# --------------------------------------------------------------------------- 1.3 / 1.9
@pytest.mark.parametrize(
    "code",
    [KafkaError.UNKNOWN, KafkaError.REQUEST_TIMED_OUT],
    ids=["unknown_server_error", "request_timed_out"],
)
def test_a_resumed_commit_whose_late_answer_follows_an_applied_commit_is_never_failed(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str, code: int
) -> None:
    """The EndTxn(commit) answer arrives after commit_transaction() gave up (its outcome
    unknown), and says an error though the coordinator applied the commit; the caller
    calls commit_transaction() again (errors.md) and, on CommitFailedException, follows
    the README's abort-and-retry."""
    producer = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id), operation_timeout=20
    )
    try:
        producer.init_transactions()
        proxy.delay(ApiKey.END_TXN, 4000, times=1)
        proxy.fail(ApiKey.END_TXN, code, forward=True, times=1)
        producer.begin_transaction()
        producer.produce(topic, b"order-1", partition=0)
        try:
            producer.commit_transaction(timeout=1)
        except TransactionOutcomeUnknownError:
            time.sleep(5)  # the late answer arrives meanwhile (not a timing assertion)
            try:
                producer.commit_transaction()
            except CommitFailedException:
                producer.abort_transaction()
                with producer.transaction():
                    producer.produce(topic, b"order-1", partition=0)
            except FatalError as exc:
                assert "unknown" in str(exc)
        except FatalError as exc:
            assert "unknown" in str(exc)
        assert broker.read_committed(topic, expected=1) == [(None, b"order-1")]
    finally:
        producer.close(timeout=5)


# --------------------------------------------------------------------------- decoder
_APIS = [
    (api, version)
    for api in (
        messages.API_VERSIONS,
        messages.FIND_COORDINATOR,
        messages.DESCRIBE_TRANSACTIONS,
        messages.END_TXN,
        messages.INIT_PRODUCER_ID,
        messages.SASL_HANDSHAKE,
        messages.SASL_AUTHENTICATE,
    )
    for version in api.responses
]

_DESCRIBED = {
    "throttle_time_ms": 0,
    "transaction_states": [
        {
            "error_code": 0,
            "transactional_id": "tx-é",
            "transaction_state": "Ongoing",
            "transaction_timeout_ms": 60000,
            "transaction_start_time_ms": 1_700_000_000_123,
            "producer_id": 1000,
            "producer_epoch": 3,
            "topics": [{"topic": "orders", "partitions": [0, 1, 2]}],
        }
    ],
}


def _decodes_or_refuses(api: Any, version: int, data: bytes) -> dict[str, Any] | None:
    """The coordinator client's decoder on ``data``: a value, or None for a refusal the
    connection turns into ProtocolError (DecodeError; UnicodeDecodeError, both
    ValueErrors). Anything else escapes the documented errors."""
    try:
        return codec.decode(api.responses[version], data, api.flexible(version))
    except ValueError:
        return None


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(_APIS), data=st.binary(max_size=300))
@pytest.mark.guarantee("3.9")
def test_the_decoder_refuses_arbitrary_bytes_with_its_documented_error(
    case: tuple[Any, int], data: bytes
) -> None:
    """Random, truncated and oversized bodies (lengths and counts up to 2**63) for every
    response this client reads: decoded or refused with DecodeError, never another
    exception, never a hang (arrays are bounded by the bytes left)."""
    api, version = case
    _decodes_or_refuses(api, version, data)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cut=st.integers(min_value=0, max_value=200),
    flips=st.lists(st.tuples(st.integers(0, 199), st.integers(1, 255)), max_size=3),
    tail=st.binary(max_size=8),
)
@pytest.mark.guarantee("3.9")
def test_a_mangled_describe_answer_never_decodes_into_another_transaction_silently(
    cut: int, flips: list[tuple[int, int]], tail: bytes
) -> None:
    """A DescribeTransactions answer truncated, with bytes changed or with bytes
    appended: refused, or (bytes changed) decoded into values that encode back to
    exactly the bytes read - nothing is read past a field or skipped."""
    api = messages.DESCRIBE_TRANSACTIONS
    good = codec.encode(api.responses[0], _DESCRIBED, True)
    assert codec.decode(api.responses[0], good, True) == _DESCRIBED
    data = bytearray(good[:cut] if cut < len(good) else good)
    for at, xor in flips:
        if at < len(data):
            data[at] ^= xor
    data += tail
    if cut < len(good) and not flips and not tail:
        assert _decodes_or_refuses(api, 0, bytes(data)) is None  # truncated
        return
    if tail and not flips and cut >= len(good):
        assert _decodes_or_refuses(api, 0, bytes(data)) is None  # trailing bytes
        return
    decoded = _decodes_or_refuses(api, 0, bytes(data))
    if decoded is not None and all(xor for _, xor in flips):
        # Canonical forms only: BOOL is absent here; varints/tags re-encode minimal.
        again = codec.encode(api.responses[0], decoded, True)
        if again != bytes(data):
            # Only a non-minimal varint or a skipped tagged field may differ.
            assert len(again) < len(data)


# --------------------------------------------------------------------------- 6.1
def test_processor_outputs_once_when_a_commit_not_applied_is_answered_unknown(
    broker: Broker, proxy: KafkaProxy, txn_id: str
) -> None:
    """The reverse of the applied-then-failed commit: the coordinator refuses EndTxn
    with UNKNOWN without applying it (not one of librdkafka's listed refusals), so
    commit_transaction() says the outcome is unknown (FatalError). run() stops; the
    successor with the same transactional id aborts the open transaction on its init,
    resumes from the offsets committed before it, and the output holds every input
    once (6.1, docs/guide/eos.md)."""
    source, sink = three_inputs(broker, txn_id)

    def processor(bootstrap: str) -> ExactlyOnceProcessor:
        return prefixing_processor(broker, bootstrap, txn_id, source, sink)

    rule = proxy.fail(ApiKey.END_TXN, KafkaError.UNKNOWN, times=1)
    try:
        processor(proxy.bootstrap_servers).run(idle_timeout=5)
    except FatalError as exc:
        assert "unknown" in str(exc)
        processor(broker.bootstrap_servers).run(idle_timeout=5)
    assert rule.hits == 1
    assert sorted(broker.read_committed(sink, expected=3)) == [
        (None, b"out-in-0"),
        (None, b"out-in-1"),
        (None, b"out-in-2"),
    ]
