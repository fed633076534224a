"""One blocking connection to one broker: request/response framing, the reservation that
lets one request's round trip overlap other work (``send``/``Exchange``), and what an
answer that is not Kafka's means.

The socket (TCP, TLS) comes from ``transport``, the login from ``sasl``, the settings
from ``settings.ConnectionSettings``. Every blocking step (connect, TLS handshake, SASL,
each request) is bounded by the connection's ``deadline`` (set by the coordinator client
for each of its calls) and by ``ConnectionSettings.timeout_s``.
"""

from __future__ import annotations

import contextlib
import select
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from kafka_txn.coordinator.codec import NULLABLE_STRING, Reader, Writer, decode, encode
from kafka_txn.coordinator.errors import DeadlineExceededError, NotKafkaError, ProtocolError
from kafka_txn.coordinator.foreign import describe_answer
from kafka_txn.coordinator.messages import API_VERSIONS, Api
from kafka_txn.coordinator.sasl import SaslLogin
from kafka_txn.coordinator.settings import ConnectionSettings
from kafka_txn.coordinator.transport import open_socket, tls_failure

__all__ = ["BrokerConnection", "Exchange"]

MAX_RESPONSE_BYTES = 100 * 1024 * 1024
_SNIFF_BYTES = 512


class _Sent(NamedTuple):
    api: Api
    version: int
    correlation: int
    flexible: bool


class Exchange:
    """A request sent on a reserved connection whose answer is read later
    (``BrokerConnection.send``). Exactly one of ``answer()`` or ``abandon()`` must be
    called: both release the connection."""

    def __init__(self, conn: BrokerConnection, sent: _Sent) -> None:
        self._conn: BrokerConnection | None = conn
        self._sent = sent

    def answer(self) -> dict[str, Any]:
        """The decoded answer (waits for it, within the connection's deadline)."""
        conn = self._conn
        if conn is None:
            raise ProtocolError("the exchange was already read or abandoned")
        self._conn = None
        try:
            return conn._receive(self._sent)
        finally:
            conn._lock.release()

    def ready(self) -> bool:
        """Whether the answer has begun to arrive (reading it then blocks at most until
        the rest of it is in)."""
        conn = self._conn
        if conn is None:
            return True
        sock = conn._sock
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True  # closed: answer() reports it
        return bool(readable)

    def abandon(self) -> None:
        """Give up on the answer: the connection is closed (an unread answer would be
        read as the next request's) and released."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            finally:  # a signal's exception once close() returned must not keep the lock
                conn._lock.release()


class BrokerConnection:
    """A connected, authenticated socket to one broker, and the API versions it speaks.

    ``deadline`` (``time.monotonic()`` seconds, or None) bounds every blocking step; the
    coordinator client moves it forward for each of its calls."""

    def __init__(
        self,
        settings: ConnectionSettings,
        host: str,
        port: int,
        deadline: float | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.deadline = deadline
        self._settings = settings
        self._lock = threading.Lock()
        self._correlation = 0
        client_id = Writer()
        NULLABLE_STRING.encode(client_id, settings.client_id, False)  # never compact
        self._client_id = client_id.getvalue()
        """The request header's client id, encoded once."""
        self._answered = False
        self._answers = 0
        self._sock = open_socket(settings, host, port, self._timeout)
        try:
            self.versions = self._api_versions()
            if settings.sasl_mechanism:
                SaslLogin(self.request, settings, self.address).authenticate()
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    def supports(self, api: Api, ceiling: int | None = None) -> int:
        """The version of ``api`` to send to this broker, or -1 if none fits."""
        low_high = self.versions.get(api.key)
        if low_high is None:
            return -1
        return api.pick(low_high[0], low_high[1], ceiling)

    def request(self, api: Api, version: int, body: dict[str, Any] | bytes) -> dict[str, Any]:
        """Send one request and return its decoded response. ``body``: the request's
        fields, or its body already encoded for ``version`` (``encode``)."""
        self._reserve()
        try:
            return self._receive(self._send(api, version, body))
        finally:
            self._lock.release()

    def _reserve(self) -> None:
        """Take the connection for one request, waiting at most until ``deadline``.
        Still taken then means an exchange that nobody reads or abandons (its owner was
        interrupted, a signal's exception): the connection is closed and this raises
        ProtocolError, so the caller reconnects instead of waiting past its deadline."""
        deadline = self.deadline
        wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(timeout=wait):
            self.close()
            raise ProtocolError(
                f"{self.address}: the connection stayed taken by an earlier request whose "
                "answer nobody read; closed, to reconnect"
            )

    def send(self, api: Api, version: int, body: dict[str, Any] | bytes) -> Exchange:
        """Send one request now and read its response later (``Exchange.answer()``), so
        that the round trip overlaps other work. The connection is reserved until the
        answer is read or the exchange abandoned (``Exchange.abandon()``, which closes
        the connection: an unread answer would be taken for the next request's)."""
        self._reserve()
        try:
            return Exchange(self, self._send(api, version, body))
        except BaseException:
            self._lock.release()
            raise

    def _send(self, api: Api, version: int, body: dict[str, Any] | bytes) -> _Sent:
        flexible = api.flexible(version)
        self._correlation += 1
        correlation = self._correlation
        if not isinstance(body, bytes):
            body = encode(api.requests[version], body, flexible)
        # Request header v1, v2 (empty tagged fields) for a flexible version.
        payload = b"".join(
            (
                struct.pack(">ihhi", 8 + len(self._client_id) + flexible + len(body),
                            api.key, version, correlation),
                self._client_id,
                b"\0" if flexible else b"",
                body,
            )
        )  # fmt: skip
        sent = _Sent(api, version, correlation, flexible)
        with self._failures(sent):
            self._sock.settimeout(self._timeout())
            self._sock.sendall(payload)
        return sent

    def _receive(self, sent: _Sent) -> dict[str, Any]:
        api, version, correlation, flexible = sent
        with self._failures(sent):
            head = self._read(4)
            size = struct.unpack(">i", head)[0]
            if not 4 <= size <= MAX_RESPONSE_BYTES:
                raise self._not_kafka(head)
            data = self._read(size)
        got = struct.unpack(">i", data[:4])[0]
        if got != correlation:
            self.close()
            if not self._answered:
                raise self._not_kafka(struct.pack(">i", size) + data[:_SNIFF_BYTES], sniff=False)
            raise ProtocolError(f"correlation id {got} != {correlation} from {self.address}")
        # Response header v1 (tagged fields) for flexible versions, except ApiVersions,
        # whose response header is always v0 (KIP-511).
        try:
            tags = Reader(data[4:])
            if flexible and api.key != API_VERSIONS.key:
                tags.skip_tagged_fields()
            answer = decode(api.responses[version], data[4 + tags.pos :], flexible)
        except (ValueError, UnicodeDecodeError) as exc:
            if not self._answered:
                self.close()
                raise self._not_kafka(
                    struct.pack(">i", size) + data[:_SNIFF_BYTES], sniff=False
                ) from exc
            raise ProtocolError(f"unreadable {api.name} v{version} response: {exc}") from exc
        self._answered = True
        self._answers += 1
        return answer

    @contextlib.contextmanager
    def _failures(self, sent: _Sent) -> Iterator[None]:
        """Socket failures of one exchange as ProtocolError (the connection closed: a
        request may be half sent or its answer half read)."""
        try:
            yield
        except DeadlineExceededError:
            self.close()
            raise
        except ssl.SSLError as exc:
            self.close()
            raise tls_failure(exc, self.address) from exc
        except OSError as exc:
            self.close()
            raise ProtocolError(
                f"{sent.api.name} to {self.address}: {exc or type(exc).__name__}"
                + self._first_answer_hint()
                + self._sasl_listener_hint(sent)
            ) from exc

    # ------------------------------------------------------------------ the deadline
    def _timeout(self) -> float:
        """Seconds the next blocking step may take: ``timeout_s``, less near the
        deadline; DeadlineExceededError once it has passed."""
        limit = self._settings.timeout_s
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceededError(f"{self.address}: the deadline passed")
            limit = min(limit, left)
        return limit

    # ------------------------------------------------------------------ framing
    def _read(self, size: int) -> bytes:
        chunks = []
        while size:
            self._sock.settimeout(self._timeout())
            chunk = self._sock.recv(min(size, 1 << 20))
            if not chunk:
                raise OSError("connection closed by the broker")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _first_answer_hint(self) -> str:
        if self._answered:
            return ""
        return (
            " (nothing was answered: is this a Kafka listener, and does security.protocol="
            f"{self._settings.security_protocol.upper()} match it?)"
        )

    def _sasl_listener_hint(self, sent: _Sent) -> str:
        """For a client that does not log in (no sasl.mechanism) whose connection broke
        at its first request after ApiVersions: what an Apache Kafka SASL listener does,
        which answers ApiVersions before the login and closes the connection at any other
        request (``SaslServerAuthenticator``: "Unexpected Kafka request of type ...
        during SASL handshake"). A broker shutting down may do the same, so it is only a
        question, and the request is retried."""
        if self._settings.sasl_mechanism or self._answers != 1 or sent.api is API_VERSIONS:
            return ""
        return (
            "; it answered ApiVersions and then dropped the next request, as a SASL listener "
            "does to a client that does not log in: if it is one, set security.protocol="
            f"SASL_PLAINTEXT or SASL_SSL (not {self._settings.security_protocol.upper()}) "
            "and sasl.mechanism"
        )

    def _not_kafka(self, head: bytes, sniff: bool = True) -> NotKafkaError:
        """The error for a peer whose answer is not a Kafka response: what it sent,
        read a little further (briefly) to recognise it."""
        data = head
        if sniff:
            with contextlib.suppress(OSError, ProtocolError):
                self._sock.settimeout(min(0.5, self._timeout()))
                while len(data) < _SNIFF_BYTES:
                    chunk = self._sock.recv(_SNIFF_BYTES - len(data))
                    if not chunk:
                        break
                    data += chunk
                    if b"\r\n\r\n" in data or b"\0" in data[5:]:
                        break
        self.close()
        return NotKafkaError(
            f"{self.address} does not speak the Kafka protocol ({describe_answer(data)}); "
            "check bootstrap.servers and security.protocol"
        )

    # ------------------------------------------------------------------ ApiVersions
    def _api_versions(self) -> dict[int, tuple[int, int]]:
        response = self.request(API_VERSIONS, 0, {})
        if response["error_code"]:
            raise ProtocolError(f"ApiVersions failed with error {response['error_code']}")
        return {a["api_key"]: (a["min_version"], a["max_version"]) for a in response["api_keys"]}
