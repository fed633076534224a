"""A broker that cannot be reached at all is named, with its address and cause, well within
the call's timeout, by ``BrokerUnreachableError`` (not an outcome-unknown error: nothing
was sent), in the terms of the API that was called; librdkafka's log lines arrive while
``init_transactions()`` waits; and the same call succeeds once the broker runs."""

from __future__ import annotations

import logging
import socket
import time
import uuid
from pathlib import Path

import pytest

from kafka_txn import (
    BrokerUnreachableError,
    DualWriter,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from kafka_txn.producer.reachability import GRACE_S, SLICE_S, bootstrap_addresses
from tests.support.apache_kafka import ApacheKafka, require_java_and_maven

BOUND_S = GRACE_S + SLICE_S + 2.0
"""docs/guide/producer.md 1.18: the error comes GRACE_S (5 s) into the call, or at its
timeout if that is shorter, plus at most one slice (1 s) and the probe; 2 s of slack for
a loaded machine."""


def _refused_port() -> int:
    """A loopback port nothing listens on: bound by the kernel's choice, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _producer(servers: str) -> TransactionalProducer:
    return TransactionalProducer(
        {"bootstrap.servers": servers, "transactional.id": f"unreachable-{uuid.uuid4().hex}"}
    )


def _init_failure(producer: TransactionalProducer, timeout: float) -> tuple[Exception, float]:
    started = time.monotonic()
    with pytest.raises(BrokerUnreachableError) as caught:
        producer.init_transactions(timeout=timeout)
    return caught.value, time.monotonic() - started


@pytest.mark.guarantee("1.18")
def test_a_refused_port_is_named_well_within_the_timeout() -> None:
    """init_transactions(timeout=30) against a port nothing listens on raises
    BrokerUnreachableError within the documented bound, naming the address, "refused"
    and bootstrap.servers; it is retriable and no outcome-unknown error."""
    port = _refused_port()
    with _producer(f"127.0.0.1:{port}") as producer:
        exc, elapsed = _init_failure(producer, timeout=30)
    assert elapsed < BOUND_S, elapsed
    message = str(exc)
    assert f"connection refused to 127.0.0.1:{port}" in message
    assert "bootstrap.servers" in message and "Is the broker running?" in message
    assert "init_transactions() again" in message
    assert "fenced" not in message and "complete_transaction" not in message
    assert not isinstance(exc, TransactionOutcomeUnknownError)
    assert isinstance(exc, BrokerUnreachableError)
    assert exc.retriable() and not exc.fatal()
    assert exc.servers == f"127.0.0.1:{port}"
    assert exc.causes == (f"connection refused to 127.0.0.1:{port}",)


@pytest.mark.guarantee("1.18")
def test_a_timeout_shorter_than_the_grace_still_names_the_cause() -> None:
    """With timeout=2 (shorter than the grace period) the error at the timeout is still
    BrokerUnreachableError naming the refused address, not an outcome-unknown error."""
    port = _refused_port()
    with _producer(f"127.0.0.1:{port}") as producer:
        exc, elapsed = _init_failure(producer, timeout=2)
    assert elapsed < 2 + SLICE_S + 2.0, elapsed
    assert f"connection refused to 127.0.0.1:{port}" in str(exc)


@pytest.mark.guarantee("1.18")
def test_a_host_that_does_not_resolve_is_named() -> None:
    """A bootstrap host that does not resolve (the reserved .invalid domain) is named as
    such within the bound."""
    with _producer("kafka-txn-no-such-host.invalid:9092") as producer:
        exc, elapsed = _init_failure(producer, timeout=30)
    assert elapsed < BOUND_S, elapsed
    assert "'kafka-txn-no-such-host.invalid' does not resolve" in str(exc)


@pytest.mark.guarantee("1.18")
def test_librdkafka_log_lines_arrive_while_init_waits() -> None:
    """librdkafka's log lines ("Connection refused") reach the kafka_txn.librdkafka
    logger within about a second of the call's start, not when it returns."""
    logger = logging.getLogger("kafka_txn.librdkafka")
    arrivals: list[float] = []

    class Stamp(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            arrivals.append(time.monotonic())

    handler = Stamp()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with _producer(f"127.0.0.1:{_refused_port()}") as producer:
            started = time.monotonic()
            _, elapsed = _init_failure(producer, timeout=30)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert arrivals, "no librdkafka log line was logged"
    assert arrivals[0] - started < SLICE_S + 1.0 < elapsed, (arrivals[0] - started, elapsed)


@pytest.mark.guarantee("1.18")
def test_dual_writer_start_names_the_broker_in_its_own_terms(tmp_path: Path) -> None:
    """DualWriter.start() against a refused port fails about as fast as the producer,
    saying DualWriter.start() and "call start() again", never complete_transaction()."""
    port = _refused_port()
    writer = DualWriter(
        {"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "unreachable-dw"},
        f"jdbc:sqlite:{tmp_path / 'dw.db'}",
    )
    try:
        started = time.monotonic()
        with pytest.raises(BrokerUnreachableError) as caught:
            writer.start()
        elapsed = time.monotonic() - started
    finally:
        writer.close()
    assert elapsed < BOUND_S, elapsed
    message = str(caught.value)
    assert message.startswith("DualWriter.start() for 'unreachable-dw'")
    assert f"connection refused to 127.0.0.1:{port}" in message
    assert "call start() again" in message and "bootstrap.servers" in message
    assert "complete_transaction" not in message and "init_transactions" not in message


def test_bootstrap_addresses_are_parsed_as_librdkafka_reads_them() -> None:
    """host:port lists, IPv6 brackets, a PLAINTEXT:// prefix and the default port 9092."""
    assert bootstrap_addresses(" a:1, PLAINTEXT://b:2,[::1]:3,c ,") == [
        ("a", 1), ("b", 2), ("::1", 3), ("c", 9092),
    ]  # fmt: skip


@pytest.mark.guarantee("1.18")
def test_a_stopped_apache_kafka_is_named_and_init_succeeds_once_it_runs() -> None:
    """A real Apache Kafka, stopped: init_transactions() names its refused address within
    the bound; once the same broker runs again on that port, init_transactions() on the
    same producer succeeds (nothing was wedged) and a transaction commits."""
    require_java_and_maven()
    server = ApacheKafka().start()
    try:
        server.terminate()  # a controlled shutdown; data and ports kept for start()
        with _producer(server.bootstrap_servers) as producer:
            exc, elapsed = _init_failure(producer, timeout=30)
            assert elapsed < BOUND_S, elapsed
            assert f"connection refused to {server.bootstrap_servers}" in str(exc)
            server.start()
            producer.init_transactions(timeout=60)
            with producer.transaction():
                producer.produce("unreachable-then-up", b"v")
    finally:
        server.stop()
