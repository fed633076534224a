"""A tiny client for one transactional id's coordinator: FindCoordinator,
DescribeTransactions, EndTxn, and KIP-939's InitProducerId v6 behind a capability check.

librdkafka exposes none of these for an arbitrary producer id and epoch, which is what
recovery needs: the coordinator accepts EndTxn(transactional_id, producer_id, epoch,
commit) from any connection with WRITE on the transactional id (Flink's KafkaSink resumes
transactions the same way). Coordinator moves and loading (NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS), CONCURRENT_TRANSACTIONS and
dropped connections are retried with tenacity, re-finding the coordinator each time.

Each public call finishes within ``deadline_s``: every connect, TLS handshake, SASL
exchange and request gets only the time left (``BrokerConnection.deadline``), and no
retry starts once it is spent. Refusals that retrying cannot fix (authentication, TLS
certificates, a peer that is not Kafka) are raised at once; a connection dropped during
the TLS handshake is retried once, then taken for a PLAINTEXT listener. Each bootstrap
server gets only its share of the time left, so that a silent one cannot starve the
others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import tenacity
from confluent_kafka import KafkaError

from kafka_txn.coordinator.codec import encode
from kafka_txn.coordinator.connection import BrokerConnection, Exchange
from kafka_txn.coordinator.errors import (
    AuthenticationError,
    DeadlineExceededError,
    NotKafkaError,
    ProtocolError,
    TlsDroppedError,
)
from kafka_txn.coordinator.messages import (
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
)
from kafka_txn.coordinator.settings import ConnectionSettings
from kafka_txn.errors import UnsupportedBrokerError

__all__ = ["CoordinatorClient", "CoordinatorError", "DescribeAhead", "TransactionDescription"]

log = logging.getLogger("kafka_txn.coordinator")

T = TypeVar("T")

TRANSACTION_KEY_TYPE = 1
TRANSACTIONAL_ID_NOT_FOUND = 105  # Kafka's code; librdkafka does not name it
RETRIABLE_CODES = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.CONCURRENT_TRANSACTIONS,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
    }
)
_MOVED = frozenset(
    {KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR, KafkaError.NETWORK_EXCEPTION}
)


class CoordinatorError(Exception):
    """The coordinator answered with an error code (``code``)."""

    def __init__(self, operation: str, code: int, message: str | None = None) -> None:
        self.operation = operation
        self.code = code
        self.kafka_error = KafkaError(code)
        detail = f": {message}" if message else ""
        super().__init__(f"{operation}: {self.kafka_error.name()}{detail}")

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE_CODES


@dataclass(frozen=True)
class TransactionDescription:
    """What DescribeTransactions says of one transactional id. An id the coordinator
    does not know (``found`` false) is described as ``Empty`` with producer id, epoch
    and start time -1."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_time_ms: int
    partitions: dict[str, list[int]] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        """Whether the coordinator knows the transactional id. Apache Kafka answers
        TRANSACTIONAL_ID_NOT_FOUND for an id it never saw or forgot after
        ``transactional.id.expiration.ms`` (TransactionCoordinator.handleDescribeTransactions);
        noida-db answers ``Empty`` with producer id -1. A known id always has a producer id
        >= 0 (InitProducerId allocates one before the id is stored)."""
        return self.producer_id >= 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "found": self.found,
            "state": self.state,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "transaction_start_time_ms": self.start_time_ms,
            "transaction_timeout_ms": self.timeout_ms,
            "partitions": self.partitions,
        }


class DescribeAhead:
    """A DescribeTransactions in flight (``CoordinatorClient.describe_ahead``); call
    ``result()`` or ``abandon()`` exactly once."""

    def __init__(self, client: CoordinatorClient, exchange: Exchange) -> None:
        self._client = client
        self._exchange = exchange

    def result(self) -> TransactionDescription | None:
        """The coordinator's answer, or None if it failed in any way (a dropped
        connection, an error code): the caller then describes the ordinary way, with
        retries."""
        try:
            return self._client._description(self._exchange.answer())
        except ProtocolError:
            self._client._forget_coordinator()
            return None
        except CoordinatorError:
            return None

    def ready(self) -> bool:
        """Whether the answer has begun to arrive."""
        return self._exchange.ready()

    def abandon(self) -> None:
        """The answer is not wanted any more: drop the connection it would arrive on."""
        self._exchange.abandon()
        self._client._forget_coordinator()


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, (AuthenticationError, NotKafkaError)):
        return False
    return isinstance(exc, ProtocolError) or (isinstance(exc, CoordinatorError) and exc.retriable)


class CoordinatorClient:
    """Talks to the coordinator of one transactional id."""

    def __init__(
        self,
        settings: ConnectionSettings,
        transactional_id: str,
        *,
        deadline_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self.deadline_s = deadline_s
        self._sleep = sleep
        self._bootstrap: BrokerConnection | None = None
        self._coordinator: BrokerConnection | None = None
        self._deadline: float | None = None
        """``time.monotonic()`` by which the public call under way must end."""
        self._tls_dropped: set[tuple[str, int]] = set()
        """Servers that dropped a TLS handshake during the call under way."""
        self._server_errors: dict[tuple[str, int], ProtocolError] = {}
        """Each bootstrap server's latest failure during the call under way."""
        self._describe_request = encode(
            DESCRIBE_TRANSACTIONS.requests[0],
            {"transactional_ids": [transactional_id]},
            DESCRIBE_TRANSACTIONS.flexible(0),
        )
        """DescribeTransactions v0's body for this id, encoded once (prepare sends it for
        every transaction)."""

    # ------------------------------------------------------------------ public calls
    def describe(self) -> TransactionDescription:
        """DescribeTransactions for this transactional id (Kafka >= 3.0)."""
        return self._with_retries("DescribeTransactions", self._describe_once)

    def describe_ahead(self, deadline: float) -> DescribeAhead | None:
        """DescribeTransactions sent now and read later (``DescribeAhead.result()``),
        so that its round trip overlaps other work (prepare's flush). Only over a
        coordinator connection already open, and never retried: None if there is none
        or the request could not be sent; then, or when ``result()`` gives None, the
        caller calls ``describe()``. ``deadline`` (``time.monotonic()``) bounds the
        wait for the answer."""
        conn = self._coordinator
        if conn is None or conn.supports(DESCRIBE_TRANSACTIONS) < 0:
            return None
        conn.deadline = deadline
        try:
            exchange = conn.send(DESCRIBE_TRANSACTIONS, 0, self._describe_request)
        except ProtocolError:
            self._forget_coordinator()
            return None
        try:
            return DescribeAhead(self, exchange)
        except BaseException:  # a signal's exception: never leave the connection taken
            exchange.abandon()
            raise

    def end_txn(self, producer_id: int, producer_epoch: int, commit: bool) -> None:
        """EndTxn with the given identity; raises CoordinatorError for a refusal."""
        self._with_retries(
            "EndTxn", lambda: self._end_txn_once(producer_id, producer_epoch, commit)
        )

    def supports_kip939(self) -> bool:
        """True if the coordinator speaks InitProducerId v6 (KIP-939 2PC)."""
        conn = self._with_retries("FindCoordinator", self._coordinator_conn)
        return conn.supports(INIT_PRODUCER_ID) >= 6

    def init_producer_id_2pc(self, keep_prepared_txn: bool, timeout_ms: int) -> dict[str, Any]:
        """InitProducerId v6 (Enable2Pc, KeepPreparedTxn). Refused unless the broker
        advertises v6: a broker that ignored keepPreparedTxn would abort the transaction."""

        def once() -> dict[str, Any]:
            conn = self._coordinator_conn()
            if conn.supports(INIT_PRODUCER_ID) < 6:
                raise UnsupportedBrokerError(
                    "the broker does not offer InitProducerId v6 (KIP-939): "
                    "keepPreparedTxn is refused rather than risk an abort"
                )
            answer = conn.request(
                INIT_PRODUCER_ID,
                6,
                {
                    "transactional_id": self.transactional_id,
                    "transaction_timeout_ms": timeout_ms,
                    "producer_id": -1,
                    "producer_epoch": -1,
                    "enable_2pc": True,
                    "keep_prepared_txn": keep_prepared_txn,
                },
            )
            self._check("InitProducerId", answer)
            return answer

        return self._with_retries("InitProducerId", once)

    def close(self) -> None:
        for conn in (self._coordinator, self._bootstrap):
            if conn is not None:
                conn.close()
        self._coordinator = self._bootstrap = None

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _with_retries(self, operation: str, call: Callable[[], T]) -> T:
        """``call()`` retried with tenacity until ``deadline_s`` passes. A first attempt
        that succeeds (prepare's describe, nearly always) returns without building
        tenacity's ``Retrying``; a first attempt that fails is handed to tenacity as its
        first attempt (raised again, not called again), so that retrying, waiting,
        stopping and what is raised are tenacity's, as if it had made that attempt."""
        deadline = time.monotonic() + self.deadline_s
        self._deadline = deadline
        self._tls_dropped.clear()
        self._server_errors.clear()
        last: list[BaseException] = []
        try:
            try:
                return call()
            except Exception as exc:
                first: list[Exception] = [exc]

            def attempt() -> T:
                if first:
                    raise first.pop()
                return call()

            return self._retrying(operation, deadline, last)(attempt)
        except DeadlineExceededError:
            if last:  # what kept failing says more than "the deadline passed"
                raise last[0] from None
            raise
        finally:
            self._deadline = None

    def _retrying(
        self, operation: str, deadline: float, last: list[BaseException]
    ) -> tenacity.Retrying:
        """The tenacity ``Retrying`` of one public call: retriable errors (``_retriable``)
        until ``deadline``, exponential backoff with jitter, never sleeping past the
        deadline; the latest failure other than the deadline itself is kept in
        ``last``."""

        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if exc is not None and not isinstance(exc, DeadlineExceededError):
                last[:] = [exc]
            log.info("%s for %r: %s; retrying", operation, self.transactional_id, exc)
            if isinstance(exc, ProtocolError) or (
                isinstance(exc, CoordinatorError) and exc.code in _MOVED
            ):
                self._forget_coordinator()

        backoff = tenacity.wait_exponential(multiplier=0.05, max=1.0) + tenacity.wait_random(
            0, 0.05
        )

        def wait(state: tenacity.RetryCallState) -> float:
            # Never sleep past the deadline: the attempt after the sleep gets what is left.
            return min(backoff(state), max(0.0, deadline - time.monotonic()))

        def stop(state: tenacity.RetryCallState) -> bool:
            return time.monotonic() >= deadline

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retriable),
            stop=stop,
            wait=wait,
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )

    def _forget_coordinator(self) -> None:
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None

    def _connect(self, host: str, port: int, deadline: float | None = None) -> BrokerConnection:
        """A connection to ``host:port`` within ``deadline`` (default: the call's). A
        connection dropped during the TLS handshake is retried once in a call, then is a
        NotKafkaError (security.protocol does not match the listener)."""
        try:
            return BrokerConnection(self.settings, host, port, deadline=deadline or self._deadline)
        except TlsDroppedError as exc:
            if (host, port) in self._tls_dropped:
                raise NotKafkaError(str(exc)) from exc
            self._tls_dropped.add((host, port))
            raise

    def _any_broker(self) -> BrokerConnection:
        """A connection to the first bootstrap server that answers. Each server gets at
        most its share of the time left (at least 1 s), so that one that accepts and
        never answers cannot starve the others (librdkafka tries its bootstrap servers
        independently too); the error names every server tried with its own failure."""
        if self._bootstrap is not None:
            self._bootstrap.deadline = self._deadline
            return self._bootstrap
        servers = self.settings.bootstrap
        for index, (host, port) in enumerate(servers):
            share = self._share(len(servers) - index)
            try:
                conn = self._connect(host, port, share)
            except AuthenticationError:
                raise
            except DeadlineExceededError as exc:
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    # The call's own deadline: no time for this server or the others.
                    self._server_errors.setdefault((host, port), exc)
                    break
                self._server_errors[host, port] = DeadlineExceededError(
                    f"{host}:{port}: no answer in time"
                )
                continue
            except ProtocolError as exc:
                self._server_errors[host, port] = exc
                continue
            conn.deadline = self._deadline
            self._bootstrap = conn
            return conn
        # Each server's latest failure in this call (an earlier attempt's, for one the
        # deadline left no time to try again).
        errors = [self._server_errors[s] for s in servers if s in self._server_errors]
        if errors and all(isinstance(e, NotKafkaError) for e in errors):
            raise NotKafkaError("; ".join(str(e) for e in errors))
        if len(errors) == 1:
            raise errors[0]
        raise ProtocolError("no bootstrap server usable: " + "; ".join(map(str, errors)))

    def _share(self, remaining: int) -> float | None:
        """The deadline of one bootstrap attempt when ``remaining`` servers are still
        to be tried: min(time left, max(1 s, time left / remaining))."""
        if self._deadline is None:
            return None
        left = self._deadline - time.monotonic()
        return time.monotonic() + min(left, max(1.0, left / remaining))

    def _coordinator_conn(self) -> BrokerConnection:
        if self._coordinator is not None:
            self._coordinator.deadline = self._deadline
            return self._coordinator
        broker = self._any_broker()
        version = broker.supports(FIND_COORDINATOR)
        if version < 0:
            raise UnsupportedBrokerError("the broker offers no FindCoordinator version we speak")
        try:
            if version >= 4:
                answer = broker.request(
                    FIND_COORDINATOR,
                    version,
                    {"key_type": TRANSACTION_KEY_TYPE, "coordinator_keys": [self.transactional_id]},
                )
                coordinators = answer["coordinators"]
                if len(coordinators) != 1:  # one key was asked about
                    raise ProtocolError(
                        f"FindCoordinator for {self.transactional_id!r} was answered with "
                        f"{len(coordinators)} coordinators"
                    )
                found = coordinators[0]
            else:
                found = broker.request(
                    FIND_COORDINATOR,
                    version,
                    {"key": self.transactional_id, "key_type": TRANSACTION_KEY_TYPE},
                )
        except ProtocolError:
            self._bootstrap = None
            raise
        if found["error_code"]:
            raise CoordinatorError("FindCoordinator", found["error_code"], found["error_message"])
        host, port = found["host"], found["port"]
        if (host, port) == (broker.host, broker.port):
            self._coordinator = broker
        else:
            self._coordinator = self._connect(host, port)
        return self._coordinator

    def _describe_once(self) -> TransactionDescription:
        conn = self._coordinator_conn()
        if conn.supports(DESCRIBE_TRANSACTIONS) < 0:
            raise UnsupportedBrokerError(
                "the broker does not offer DescribeTransactions (Kafka >= 3.0 does): "
                "two-phase commit and recovery need it to identify a prepared transaction"
            )
        return self._description(conn.request(DESCRIBE_TRANSACTIONS, 0, self._describe_request))

    def _description(self, answer: dict[str, Any]) -> TransactionDescription:
        entries: list[Any] = answer["transaction_states"] or []  # null: no entry
        if len(entries) != 1 or entries[0]["transactional_id"] not in (self.transactional_id, None):
            # One id was asked about: any other answer is not Kafka's, and is never read
            # as some transaction's state (reconnect and ask again).
            raise ProtocolError(
                f"DescribeTransactions for {self.transactional_id!r} was answered with "
                f"{len(entries)} transaction states "
                f"({[e['transactional_id'] for e in entries]!r})"
            )
        [entry] = entries
        if entry["error_code"] == TRANSACTIONAL_ID_NOT_FOUND:
            # Described like noida-db's answer for an unknown id: ``found`` is false.
            return TransactionDescription(self.transactional_id, "Empty", -1, -1, 0, -1)
        if entry["error_code"]:
            raise CoordinatorError("DescribeTransactions", entry["error_code"])
        try:
            partitions = {t["topic"]: list(t["partitions"]) for t in entry["topics"]}
        except TypeError as exc:  # a null array where Kafka always sends one
            raise ProtocolError(f"DescribeTransactions answered a null array: {exc}") from exc
        return TransactionDescription(
            transactional_id=entry["transactional_id"],
            state=entry["transaction_state"],
            producer_id=entry["producer_id"],
            producer_epoch=entry["producer_epoch"],
            timeout_ms=entry["transaction_timeout_ms"],
            start_time_ms=entry["transaction_start_time_ms"],
            partitions=partitions,
        )

    def _end_txn_once(self, producer_id: int, producer_epoch: int, commit: bool) -> None:
        conn = self._coordinator_conn()
        version = conn.supports(END_TXN)
        if version < 0:
            raise UnsupportedBrokerError("the broker offers no EndTxn version <= 4")
        answer = conn.request(
            END_TXN,
            version,
            {
                "transactional_id": self.transactional_id,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "committed": commit,
            },
        )
        self._check("EndTxn", answer)

    @staticmethod
    def _check(operation: str, answer: dict[str, Any]) -> None:
        if answer["error_code"]:
            raise CoordinatorError(operation, answer["error_code"])
