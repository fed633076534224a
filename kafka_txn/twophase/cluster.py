"""The id of the Kafka cluster the producer is connected to, which two-phase commit
stores in every prepared state and checks a stored state against
(``decisions.check_belongs``): a state of another cluster could otherwise commit or abort
a transaction of this one, since producer ids and transactional ids are only unique
within a cluster.

librdkafka reads it with a Metadata request (``list_topics()``; Kafka's
MetadataResponse carries ``ClusterId``, KIP-78). Read once per producer. In recovery it is
the first thing asked of a broker, so it is also where a SASL login the broker refuses
shows: librdkafka reports that only through error_cb (``ClusterId._read_while_recovering``).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException

from kafka_txn.classification import exception_for
from kafka_txn.errors import TransactionOutcomeUnknownError
from kafka_txn.producer.handle import Handle
from kafka_txn.producer.librdkafka import Driver
from kafka_txn.producer.lifecycle import Lifecycle, State
from kafka_txn.state import PreparedTxnState

__all__ = ["ClusterId"]

log = logging.getLogger("kafka_txn.twophase")

_METADATA_SLICE_S = 0.25
"""While no broker is usable, the cluster id is read with librdkafka Metadata calls this
long, librdkafka's callbacks served between them: a SASL login the broker refuses is
reported only through error_cb (``classification.AUTHENTICATION_CODES``) while a Metadata
call waits for a usable broker, so one call as long as the deadline would hear of the
refusal only at the end (``ClusterId._read_while_recovering``)."""


class ClusterId:
    """This cluster's id for one TransactionalProducer's two-phase commit (read once),
    and why librdkafka's last Metadata for it failed (``failure``, for the message)."""

    def __init__(self, life: Lifecycle, io: Driver, deadline_s: float) -> None:
        self._life = life
        self._io = io
        self._deadline_s = deadline_s
        self.cluster_id: str | None = None
        self.failure: KafkaError | None = None
        """Why librdkafka's last Metadata for the cluster id failed (for the message)."""

    def read(
        self, producer: Handle, deadline: float, operation: str = "prepare_transaction"
    ) -> str | None:
        """The cluster id (read once), to refuse a state from another cluster; None when
        librdkafka's Metadata got no answer by ``deadline`` (at least 1 s from now).
        Before the first init (recovery, ``_read_while_recovering``) a refused SASL
        login is a ``FatalError`` at once."""
        if self.cluster_id is None:
            end = max(deadline, time.monotonic() + 1.0)
            if self._life.state is State.RECOVERING:
                self.cluster_id = self._read_while_recovering(producer, end, operation)
            else:
                try:
                    metadata = producer.list_topics(timeout=end - time.monotonic())
                    self.cluster_id = metadata.cluster_id
                except KafkaException as exc:
                    self.failure = exc.args[0]
            if self.cluster_id is None:
                log.warning("could not read the cluster id: %s", self.failure)
        return self.cluster_id

    def _read_while_recovering(self, producer: Handle, end: float, operation: str) -> str | None:
        """The cluster id read by a producer that has not reached a broker yet, which is
        where a SASL login the broker refuses (wrong password, unknown user, a mechanism
        it does not enable) shows: librdkafka reports it only through error_cb and logs
        in again with the same settings until ``end``. So while no broker is usable
        (Metadata fails with ``_TRANSPORT``: ``rd_kafka_metadata`` found no broker up and
        asked none), Metadata is called for ``_METADATA_SLICE_S`` at a time with error_cb
        served between the calls, and a report of a refused login (any since the producer
        was built: nothing reached a broker since) is a ``FatalError`` with the broker's
        reason (``classification.exception_for``), consuming the report. Once a broker was
        asked and has not answered (``_TIMED_OUT``: it is up, so logged in), the next call
        waits for all the time left: a broker answers a connection's requests in turn, so
        every answer given up on delays the next one."""
        io = self._io
        sliced = True
        started = time.monotonic()
        while True:
            began = time.monotonic()
            wait = min(_METADATA_SLICE_S, end - began) if sliced else end - began
            try:
                metadata = producer.list_topics(timeout=max(0.001, wait))
            except KafkaException as exc:
                self.failure = exc.args[0]
            else:
                return metadata.cluster_id  # type: ignore[no-any-return]
            sliced = self.failure.code() == KafkaError._TRANSPORT
            # Served until the slice ends, also when Metadata failed at once (a SASL
            # listener closes the connection of a client that does not log in).
            until = min(began + _METADATA_SLICE_S, end) if sliced else 0.0
            while True:
                io.serve_error_callbacks(max(0.0, until - time.monotonic()))
                refused, io.refused_login = io.refused_login, None
                if refused is not None:
                    raise exception_for(refused, operation) from KafkaException(refused)
                # No bootstrap server reachable at all: said within the grace period
                # rather than at the deadline (producer.reachability).
                unreachable = io.reachability.unreachable(
                    f"{operation}()", started, final=time.monotonic() >= end,
                    again=f"then call {operation}() again",
                )  # fmt: skip
                if unreachable is not None:
                    raise unreachable from KafkaException(unreachable.kafka_error)
                if time.monotonic() >= until:
                    break
            if time.monotonic() >= end:
                return None

    def require(self, state: PreparedTxnState, operation: str) -> str | None:
        """This cluster's id, to check ``state`` against: a state that names a cluster
        is never decided while this one's id cannot be read (librdkafka's metadata did
        not answer in time), since a state of another cluster could otherwise commit or
        abort a transaction of this one. Nothing is decided then: call again. In
        recovery a SASL login the broker refuses is a ``FatalError`` at once
        (``_read_while_recovering``): reading the id is the first thing recovery asks
        of a broker."""
        cluster_id = self.read(self._io.producer, time.monotonic() + self._deadline_s, operation)
        if state.cluster_id and cluster_id is None:
            failure = self.failure
            why = "" if failure is None else f" (librdkafka: {failure.str()})"
            raise TransactionOutcomeUnknownError(
                f"{operation}(): the id of the Kafka cluster could not be read within "
                f"{self._deadline_s:g}s{why}, so whether the state (prepared on cluster "
                f"{state.cluster_id!r}) belongs to this cluster is unknown. Nothing was "
                "committed or aborted: call it again once the brokers answer (if they "
                "run, check bootstrap.servers, and that security.protocol matches their "
                "listener)",
                kafka_error=KafkaError(KafkaError._TIMED_OUT),
                operation=operation,
            )
        return cluster_id
