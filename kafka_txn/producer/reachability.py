"""Whether any bootstrap server can be reached: librdkafka's connection reports (its
error_cb) and a TCP probe of ``bootstrap.servers``, turned into ``BrokerUnreachableError``
when nothing was ever connected.

librdkafka never gives up on a broker it cannot reach: a blocking call such as
``rd_kafka_init_transactions()`` waits out its whole timeout and returns ``_TIMED_OUT``,
while error_cb reports why (``_TRANSPORT`` "Connect to ipv4#127.0.0.1:9 failed:
Connection refused (after 0ms in state CONNECT)", ``_RESOLVE`` "Failed to resolve",
``_ALL_BROKERS_DOWN`` "1/1 brokers are down"). Those reports are queued for ``poll()``
(confluent-kafka serves error_cb from the main queue), so the waiting call is run in
slices (``SLICE_S``) with the queue served between them.

The broker is declared unreachable only when all of these hold:

- librdkafka reported every broker down, or a connection or resolution failure;
- none of its reports shows a connection that was ever established (a broker state past
  ``CONNECT``: a request may have been sent, so the outcome would be unknown);
- ``GRACE_S`` seconds of the call passed (a broker that is starting gets that long to
  open its port; librdkafka reconnects every ``reconnect.backoff.ms``, 100 ms doubling),
  or the call's own timeout ran out first;
- a TCP connect to each bootstrap address fails right then (the probe also names the
  cause in the user's terms: "connection refused", "does not resolve").
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

from kafka_txn.errors import BrokerUnreachableError

__all__ = [
    "GRACE_S",
    "PROBE_TIMEOUT_S",
    "SLICE_S",
    "Reachability",
    "bootstrap_addresses",
    "restated",
]

SLICE_S = 1.0
"""Longest a blocking librdkafka call runs before the queued callbacks (error_cb's
reports, librdkafka's log lines) are served."""

GRACE_S = 5.0
"""Seconds of a call before an unreachable broker is declared (within the call's timeout)."""

PROBE_TIMEOUT_S = 1.0
"""Bound on each TCP connect of the probe."""

_CONNECTION_CODES = frozenset(
    {KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._ALL_BROKERS_DOWN}
)
# librdkafka's broker states before a connection exists (rdkafka_broker.h): a report
# "(after Nms in state S)" with any other S followed an established connection.
_NOT_CONNECTED_STATES = frozenset({"INIT", "DOWN", "TRY_CONNECT", "CONNECT"})
_STATE = re.compile(r"in state ([A-Z_]+)\)")
_SCHEME = re.compile(r"^[A-Za-z_]+://")


def bootstrap_addresses(servers: str) -> list[tuple[str, int]]:
    """``bootstrap.servers`` as (host, port) pairs: ``host:port`` or ``[v6]:port``, an
    optional ``PLAINTEXT://``-style prefix, default port 9092 (librdkafka's)."""
    found = []
    for entry in servers.split(","):
        item = _SCHEME.sub("", entry.strip())
        if not item:
            continue
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        found.append((host, int(port) if port.isdigit() else 9092))
    return found


def _probe(host: str, port: int) -> str | None:
    """Why a TCP connection to ``host:port`` fails, None if it succeeds."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except socket.gaierror as exc:
        return f"host {host!r} does not resolve ({exc.strerror})"
    except ConnectionRefusedError:
        return f"connection refused to {_address(host, port)}"
    except TimeoutError:
        return f"no answer from {_address(host, port)} within {PROBE_TIMEOUT_S:g}s"
    except OSError as exc:
        return f"cannot connect to {_address(host, port)} ({exc.strerror or exc})"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Reachability:
    """What librdkafka reported about reaching the brokers (fed by error_cb through
    ``observe``), and the verdict ``unreachable`` draws from it."""

    def __init__(self, servers: str, probe: Callable[[str, int], str | None] = _probe) -> None:
        self.servers = servers
        self._probe = probe
        self.last_report: KafkaError | None = None
        """librdkafka's latest connection failure (None: none since a connection)."""
        self.connected = False
        """librdkafka reported a connection that had been established: a request may
        have been sent, so a failure is no longer "nothing was sent"."""
        self._probed_at = -SLICE_S

    def observe(self, err: KafkaError) -> None:
        """One error_cb report."""
        if err.code() not in _CONNECTION_CODES:
            return
        state = _STATE.search(err.str())
        if state is not None and state.group(1) not in _NOT_CONNECTED_STATES:
            self.connected = True
        self.last_report = err

    def unreachable(
        self, call: str, started: float, *, final: bool, again: str
    ) -> BrokerUnreachableError | None:
        """``BrokerUnreachableError`` for ``call`` (which began at ``started``, monotonic),
        or None while a broker may still answer. ``final``: the call's time is up, so
        the grace period no longer applies. ``again`` says how to retry, in the terms of
        the API that was called."""
        report = self.last_report
        if report is None or self.connected:
            return None
        elapsed = time.monotonic() - started
        now = time.monotonic()
        if not final and (elapsed < GRACE_S or now - self._probed_at < SLICE_S):
            return None  # at most one probe a slice
        self._probed_at = now
        addresses = bootstrap_addresses(self.servers)
        causes = []
        for host, port in addresses:
            cause = self._probe(host, port)
            if cause is None:
                return None  # something listens: librdkafka may still get through
            causes.append(cause)
        if not causes:
            return None
        return _unreachable(f"{call}", self.servers, tuple(causes), report, again, elapsed)


def _unreachable(
    call: str,
    servers: str,
    causes: tuple[str, ...],
    report: KafkaError,
    again: str,
    elapsed: float | None = None,
) -> BrokerUnreachableError:
    within = "" if elapsed is None else f" in {elapsed:.1f}s"
    return BrokerUnreachableError(
        f"{call}: no Kafka broker could be reached{within}: {'; '.join(causes)} "
        f"(librdkafka: {report.str()}). Nothing was sent. Is the broker running? Check "
        f"bootstrap.servers ({servers!r}); {again}",
        kafka_error=report,
        servers=servers,
        causes=causes,
    )


def restated(exc: BrokerUnreachableError, call: str, again: str) -> BrokerUnreachableError:
    """``exc`` told in the terms of the API that was called (``DualWriter.start()``, the
    Spark sink...): the same servers, causes and root error; the caller raises it from
    ``root_exception(exc)``."""
    return _unreachable(call, exc.servers, exc.causes, exc.kafka_error, again)
