"""One blocking connection to one broker: TLS, SASL, request/response framing.

Settings come from the producer's librdkafka configuration, so that the coordinator
client reaches the cluster exactly as the producer does: security.protocol PLAINTEXT,
SSL, SASL_PLAINTEXT, SASL_SSL; sasl.mechanism PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and
OAUTHBEARER (through confluent-kafka's ``oauth_cb``); the ``ssl.*`` settings Python's
ssl module can honour (``security.SECURITY_KEYS`` lists every key and what is done with
it). Anything else is a ConfigurationError when the producer is built, not a surprise
at recovery time.

Every blocking step (connect, TLS handshake, SASL, each request) is bounded by the
connection's ``deadline`` (set by the coordinator client for each of its calls) and by
``ConnectionSettings.timeout_s``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kafka_txn.coordinator.codec import NULLABLE_STRING, Reader, Writer, decode, encode
from kafka_txn.coordinator.foreign import describe_answer
from kafka_txn.coordinator.messages import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE, Api
from kafka_txn.coordinator.oauthbearer import (
    OAuthBearerError,
    OAuthToken,
    TokenSource,
    client_first_message,
)
from kafka_txn.coordinator.scram import ScramClient, ScramError
from kafka_txn.coordinator.security import check_security_keys
from kafka_txn.coordinator.tls import TlsSettings
from kafka_txn.errors import ConfigurationError

__all__ = [
    "AuthenticationError",
    "BrokerConnection",
    "ConnectionSettings",
    "DeadlineExceededError",
    "Exchange",
    "NotKafkaError",
    "ProtocolError",
    "SaslAuthenticationError",
    "TlsDroppedError",
]

_PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
MAX_RESPONSE_BYTES = 100 * 1024 * 1024
_SNIFF_BYTES = 512
_TRUE, _FALSE = ("true", "1", "t"), ("false", "0", "f")


class ProtocolError(Exception):
    """The connection failed or the broker answered something unreadable; the caller
    reconnects (and re-finds the coordinator) before retrying."""


class AuthenticationError(ProtocolError):
    """The broker refused our credentials, mechanism or TLS certificate, or we refused
    the broker's certificate: retrying will not help."""


class SaslAuthenticationError(AuthenticationError):
    """The broker refused the SASL login (SaslHandshake: a mechanism it does not enable;
    SaslAuthenticate: the credentials or the token), or ``oauth_cb`` gave no usable
    token: the fix is in the ``sasl.*`` settings (librdkafka's ``_AUTHENTICATION``)."""


class DeadlineExceededError(ProtocolError):
    """The deadline of the call under way passed before this step could start."""


class TlsDroppedError(ProtocolError):
    """The peer closed or reset the connection during the TLS handshake: what a
    PLAINTEXT listener does to a TLS client, and rarely a TLS broker in trouble; the
    coordinator client retries it once, then calls it a NotKafkaError."""


class NotKafkaError(ProtocolError):
    """The peer does not speak the Kafka protocol (an HTTP server, a database...) or
    does not speak TLS where security.protocol says it should: a configuration error,
    not retried."""


@dataclass(frozen=True)
class ConnectionSettings:
    """How to reach and authenticate to the cluster, taken from librdkafka settings."""

    bootstrap: tuple[tuple[str, int], ...]
    security_protocol: str = "plaintext"
    sasl_mechanism: str | None = None
    sasl_username: str | None = field(default=None, repr=False)
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_verify: bool = True
    ssl_check_hostname: bool = True
    client_id: str = "kafka-txn"
    timeout_s: float = 10.0
    """Upper bound of each blocking step (connect, handshake, one request)."""
    ssl_ca_pem: str | None = field(default=None, repr=False)
    ssl_certificate_pem: str | None = field(default=None, repr=False)
    ssl_key_pem: str | None = field(default=None, repr=False)
    ssl_crl_location: str | None = None
    ssl_cipher_suites: str | None = None
    oauth_cb: Callable[[str | None], Any] | None = field(default=None, repr=False, compare=False)
    """confluent-kafka's ``oauth_cb``, for sasl.mechanism=OAUTHBEARER."""
    oauthbearer_config: str | None = field(default=None, repr=False)
    """``sasl.oauthbearer.config``, the argument ``oauth_cb`` is called with."""
    _tokens: TokenSource | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.sasl_mechanism == "OAUTHBEARER":
            if not callable(self.oauth_cb):
                raise ConfigurationError(
                    "sasl.mechanism=OAUTHBEARER needs an oauth_cb for kafka-txn's "
                    "coordinator client (two-phase commit): give the producer the "
                    "oauth_cb you would give confluent-kafka; it serves both clients"
                )
            tokens = TokenSource(self.oauth_cb, self.oauthbearer_config)
            object.__setattr__(self, "_tokens", tokens)

    @classmethod
    def from_librdkafka(cls, conf: Mapping[str, Any]) -> ConnectionSettings:
        """Settings from a producer's librdkafka dict; what the coordinator client
        cannot honour raises ConfigurationError naming the key, before anything
        connects (the TLS context is built once here, so that unreadable files, a
        wrong key password or a bad cipher list are reported now)."""
        servers = str(conf.get("bootstrap.servers") or conf.get("metadata.broker.list") or "")
        bootstrap = tuple(_host_port(item) for item in servers.split(",") if item.strip())
        if not bootstrap:
            raise ConfigurationError("bootstrap.servers is required for two-phase commit")
        check_security_keys(conf)
        protocol = str(conf.get("security.protocol", "plaintext")).lower()
        if protocol not in _PROTOCOLS:
            raise ConfigurationError(
                f"security.protocol={protocol!r} is not supported by kafka-txn's coordinator "
                f"client: use one of {', '.join(p.upper() for p in _PROTOCOLS)}"
            )
        mechanism = None
        if protocol.startswith("sasl"):
            mechanism = _mechanism(conf)
        oauth_cb = conf.get("oauth_cb")
        if oauth_cb is not None and not callable(oauth_cb):
            raise ConfigurationError(f"oauth_cb must be callable, got {type(oauth_cb).__name__}")
        settings = cls(
            bootstrap=bootstrap,
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=conf.get("sasl.username"),
            sasl_password=conf.get("sasl.password"),
            ssl_ca_location=_text(conf, "ssl.ca.location"),
            ssl_certificate_location=_text(conf, "ssl.certificate.location"),
            ssl_key_location=_text(conf, "ssl.key.location"),
            ssl_key_password=_text(conf, "ssl.key.password"),
            ssl_verify=_flag(conf, "enable.ssl.certificate.verification"),
            ssl_check_hostname=_identification(conf),
            client_id=str(conf.get("client.id", "kafka-txn")),
            ssl_ca_pem=_text(conf, "ssl.ca.pem"),
            ssl_certificate_pem=_text(conf, "ssl.certificate.pem"),
            ssl_key_pem=_text(conf, "ssl.key.pem"),
            ssl_crl_location=_text(conf, "ssl.crl.location"),
            ssl_cipher_suites=_text(conf, "ssl.cipher.suites"),
            oauth_cb=oauth_cb if mechanism == "OAUTHBEARER" else None,
            oauthbearer_config=conf.get("sasl.oauthbearer.config"),
        )
        settings.ssl_context()  # loads every file now: errors name their key
        return settings

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol.endswith("ssl")

    @property
    def tls(self) -> TlsSettings:
        return TlsSettings(
            ca_location=self.ssl_ca_location,
            ca_pem=self.ssl_ca_pem,
            crl_location=self.ssl_crl_location,
            certificate_location=self.ssl_certificate_location,
            certificate_pem=self.ssl_certificate_pem,
            key_location=self.ssl_key_location,
            key_pem=self.ssl_key_pem,
            key_password=self.ssl_key_password,
            cipher_suites=self.ssl_cipher_suites,
            verify=self.ssl_verify,
            check_hostname=self.ssl_check_hostname,
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """A fresh TLS context for a connection, or None without TLS."""
        return self.tls.context() if self.uses_tls else None

    def oauth_token(self) -> OAuthToken:
        """The current OAUTHBEARER token (from ``oauth_cb``, refreshed when due)."""
        if self._tokens is None:
            raise OAuthBearerError("sasl.mechanism is not OAUTHBEARER")
        return self._tokens.token()

    def forget_oauth_token(self) -> None:
        """Ask ``oauth_cb`` again next time (after the broker refused the token)."""
        if self._tokens is not None:
            self._tokens.forget()


def _text(conf: Mapping[str, Any], key: str) -> str | None:
    value = conf.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return str(value)


def _flag(conf: Mapping[str, Any], key: str) -> bool:
    value = conf.get(key, True)
    text = str(value).strip().lower()
    if isinstance(value, bool) or text in _TRUE + _FALSE:
        return text in _TRUE
    raise ConfigurationError(f"{key}={value!r} is not a boolean: use true or false")


def _identification(conf: Mapping[str, Any]) -> bool:
    key = "ssl.endpoint.identification.algorithm"
    value = str(conf.get(key, "https")).strip().lower()
    if value not in ("https", "none"):
        raise ConfigurationError(f"{key}={value!r}: use https (check the host name) or none")
    return value == "https"


def _mechanism(conf: Mapping[str, Any]) -> str:
    unset = "sasl.mechanism" not in conf and "sasl.mechanisms" not in conf
    key = "sasl.mechanisms" if "sasl.mechanisms" in conf else "sasl.mechanism"
    mechanism = str(conf.get(key, "GSSAPI")).strip()  # librdkafka's default is GSSAPI
    if mechanism.upper() not in _MECHANISMS:
        hint = ""
        if mechanism.upper() == "GSSAPI":
            hint = " (Kerberos" + (", librdkafka's default when it is unset)" if unset else ")")
        raise ConfigurationError(
            f"{key}={mechanism!r} is not supported by kafka-txn's coordinator client "
            f"(two-phase commit){hint}: use one of {', '.join(_MECHANISMS)}"
        )
    mechanism = mechanism.upper()
    if mechanism != "OAUTHBEARER":
        for name in ("sasl.username", "sasl.password"):
            if not conf.get(name):
                raise ConfigurationError(f"{name} is required with {key}={mechanism}")
    return mechanism


def _host_port(item: str) -> tuple[str, int]:
    text = item.strip()
    for prefix in ("PLAINTEXT://", "SSL://", "SASL_PLAINTEXT://", "SASL_SSL://"):
        if text.upper().startswith(prefix):
            text = text[len(prefix) :]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigurationError(f"bootstrap.servers entry {item!r} is not host:port")
    return host.strip("[]"), int(port)


def _dropped(exc: OSError) -> bool:
    """Whether ``exc`` is the peer closing or resetting the connection (not a timeout,
    not a TLS alert)."""
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError)):
        return True
    return "UNEXPECTED_EOF" in _reason(exc).upper()


def _reason(exc: OSError) -> str:
    """OpenSSL's reason (``UNEXPECTED_EOF_WHILE_READING``...), else the error's text."""
    return str(getattr(exc, "reason", None) or exc)


# OpenSSL verification codes (x509_vfy.h) worth a hint of their own.
_VERIFY_HINTS = {
    62: "the certificate does not name this host: fix the broker's certificate, or set "
    "ssl.endpoint.identification.algorithm=none",
    64: "the certificate does not name this IP address: fix the broker's certificate, "
    "or set ssl.endpoint.identification.algorithm=none",
    18: "it is self-signed: put it (or its CA) in ssl.ca.location or ssl.ca.pem",
    19: "its CA is not trusted: set ssl.ca.location or ssl.ca.pem to the CA that signed it",
    20: "its CA is not trusted: set ssl.ca.location or ssl.ca.pem to the CA that signed it",
    21: "its CA is not trusted: set ssl.ca.location or ssl.ca.pem to the CA that signed it",
    23: "it is revoked (ssl.crl.location)",
    10: "it has expired",
    3: "ssl.crl.location has no CRL from the certificate's CA",
}


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
        self._sock = self._connect()
        try:
            self.versions = self._api_versions()
            if settings.sasl_mechanism:
                self._authenticate()
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
            raise self._tls_failure(exc) from exc
        except OSError as exc:
            self.close()
            raise ProtocolError(
                f"{sent.api.name} to {self.address}: {exc or type(exc).__name__}"
                + self._first_answer_hint()
                + self._sasl_listener_hint(sent)
            ) from exc

    # ------------------------------------------------------------------ connecting
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

    def _connect(self) -> socket.socket:
        ctx = self._settings.ssl_context()
        try:
            raw = socket.create_connection((self.host, self.port), timeout=self._timeout())
        except OSError as exc:
            raise ProtocolError(f"cannot connect to {self.address}: {exc}") from exc
        if ctx is None:
            return raw
        try:
            # SNI and the host name check use the host connected to, as librdkafka's
            # rd_kafka_transport_ssl_set_endpoint_id (no SNI for an IP address).
            sock = ctx.wrap_socket(raw, server_hostname=self.host, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            raw.close()
            raise ProtocolError(f"TLS with {self.address}: {exc}") from exc
        try:
            sock.settimeout(self._timeout())
            sock.do_handshake()
        except DeadlineExceededError:
            sock.close()
            raise
        except OSError as exc:  # ssl.SSLError included
            sock.close()
            failure = self._tls_failure(exc) if isinstance(exc, ssl.SSLError) else None
            if failure is not None and type(failure) is not ProtocolError:
                raise failure from exc
            if _dropped(exc):
                # Apache Kafka's PLAINTEXT listener closes on every ClientHello: it reads
                # 0x16030100 as a request size above socket.request.max.bytes
                # (NetworkReceive's InvalidReceiveException). The client retries this
                # once (a TLS broker restarting or a proxy without backends does it too).
                raise TlsDroppedError(
                    f"{self.address} closed the connection during the TLS handshake "
                    f"({_reason(exc) or type(exc).__name__}): is it a TLS listener? check "
                    f"security.protocol (it is {self._settings.security_protocol.upper()})"
                ) from exc
            raise ProtocolError(
                f"TLS handshake with {self.address} failed: "
                f"{_reason(exc) or type(exc).__name__} (is it a TLS listener? "
                f"security.protocol is {self._settings.security_protocol.upper()})"
            ) from exc
        return sock

    def _tls_failure(self, exc: ssl.SSLError) -> ProtocolError:
        """A TLS error as the error to raise: certificate problems and refusals are
        final (AuthenticationError), a peer that does not speak TLS is a NotKafkaError,
        anything else (a dropped connection) is retried."""
        if isinstance(exc, ssl.SSLCertVerificationError):
            hint = _VERIFY_HINTS.get(exc.verify_code, "")
            return AuthenticationError(
                f"kafka-txn does not trust the TLS certificate of {self.address} "
                f"({exc.verify_message}" + (f"; {hint}" if hint else "") + "): check "
                "ssl.ca.location / ssl.ca.pem / ssl.endpoint.identification.algorithm"
            )
        reason = _reason(exc)
        upper = reason.upper()
        if "ALERT" in upper:
            hint = ""
            if any(w in upper for w in ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA")):
                hint = (
                    "; the broker wants a client certificate it trusts: set "
                    "ssl.certificate.location and ssl.key.location (or ssl.certificate.pem "
                    "and ssl.key.pem)"
                )
            return AuthenticationError(
                f"TLS: {self.address} refused the connection ({reason.lower()}){hint}"
            )
        if any(w in upper for w in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER")):
            return NotKafkaError(
                f"{self.address} does not speak TLS ({reason.lower()}): it is probably a "
                "PLAINTEXT listener; check security.protocol and the port"
            )
        return ProtocolError(f"TLS with {self.address} failed: {reason}")

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

    # ------------------------------------------------------------------ handshakes
    def _api_versions(self) -> dict[int, tuple[int, int]]:
        response = self.request(API_VERSIONS, 0, {})
        if response["error_code"]:
            raise ProtocolError(f"ApiVersions failed with error {response['error_code']}")
        return {a["api_key"]: (a["min_version"], a["max_version"]) for a in response["api_keys"]}

    def _authenticate(self) -> None:
        s = self._settings
        mechanism = s.sasl_mechanism or ""
        answer = self.request(SASL_HANDSHAKE, 1, {"mechanism": mechanism})
        if answer["error_code"]:
            raise SaslAuthenticationError(
                f"{self.address} does not offer SASL mechanism {mechanism} (enabled: "
                f"{', '.join(answer['mechanisms']) or 'none'})"
            )
        if mechanism == "OAUTHBEARER":
            self._oauthbearer()
            return
        user, password = s.sasl_username or "", s.sasl_password or ""
        if mechanism == "PLAIN":
            self._sasl_round(f"\0{user}\0{password}".encode())
            return
        scram = ScramClient(mechanism, user, password)
        try:
            server_first = self._sasl_round(scram.first())
            server_final = self._sasl_round(scram.final(server_first))
            scram.verify(server_final)
        except ScramError as exc:
            raise SaslAuthenticationError(f"SASL {mechanism} failed: {exc}") from exc

    def _oauthbearer(self) -> None:
        """KIP-255: the client-first message with the token; an empty answer is success.
        A non-empty one is the broker's error (a JSON object, RFC 7628 3.2.2): the client
        answers a lone kvsep, and the broker then fails the authentication."""
        try:
            token = self._settings.oauth_token()
        except OAuthBearerError as exc:
            raise SaslAuthenticationError(f"SASL OAUTHBEARER: {exc}") from exc
        challenge = self._sasl_round(client_first_message(token))
        if not challenge:
            return
        self._settings.forget_oauth_token()
        detail = challenge.decode("utf-8", "replace")
        try:
            self._sasl_round(b"\x01")
        except AuthenticationError as exc:
            raise SaslAuthenticationError(
                f"SASL OAUTHBEARER: {self.address} refused the token from oauth_cb: {detail} "
                f"({exc})"
            ) from exc
        raise SaslAuthenticationError(
            f"SASL OAUTHBEARER: {self.address} refused the token from oauth_cb: {detail}"
        )

    def _sasl_round(self, token: bytes) -> bytes:
        answer = self.request(SASL_AUTHENTICATE, 1, {"auth_bytes": token})
        if answer["error_code"]:
            raise SaslAuthenticationError(
                f"SASL authentication with {self.address} failed: "
                f"{answer['error_message'] or answer['error_code']}"
            )
        return bytes(answer["auth_bytes"] or b"")
