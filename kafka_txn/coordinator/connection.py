"""One blocking connection to one broker: TLS, SASL, request/response framing.

Settings come from the producer's librdkafka configuration, so that the coordinator
client reaches the cluster exactly as the producer does. Supported: security.protocol
PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL; sasl.mechanism PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512; the ssl.* file locations. Anything else is a ConfigurationError when the
producer is built, not a surprise at recovery time.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError
from .codec import NULLABLE_STRING, Reader, Writer, decode, encode
from .messages import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE, Api
from .scram import ScramClient, ScramError

__all__ = ["AuthenticationError", "BrokerConnection", "ConnectionSettings", "ProtocolError"]

_PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
MAX_RESPONSE_BYTES = 100 * 1024 * 1024


class ProtocolError(Exception):
    """The connection failed or the broker answered something unreadable; the caller
    reconnects (and re-finds the coordinator) before retrying."""


class AuthenticationError(ProtocolError):
    """The broker refused our credentials or mechanism: retrying will not help."""


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

    @classmethod
    def from_librdkafka(cls, conf: Mapping[str, Any]) -> ConnectionSettings:
        """Settings from a producer's librdkafka dict; unsupported ones raise
        ConfigurationError naming the key."""
        servers = str(conf.get("bootstrap.servers") or conf.get("metadata.broker.list") or "")
        bootstrap = tuple(_host_port(item) for item in servers.split(",") if item.strip())
        if not bootstrap:
            raise ConfigurationError("bootstrap.servers is required for two-phase commit")
        protocol = str(conf.get("security.protocol", "plaintext")).lower()
        if protocol not in _PROTOCOLS:
            raise ConfigurationError(
                f"security.protocol={protocol!r} is not supported by kafka-txn's coordinator "
                f"client: use one of {', '.join(p.upper() for p in _PROTOCOLS)}"
            )
        mechanism = None
        if protocol.startswith("sasl"):
            mechanism = str(conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI")))
            if mechanism.upper() not in _MECHANISMS:
                raise ConfigurationError(
                    f"sasl.mechanism={mechanism!r} is not supported by kafka-txn's coordinator "
                    f"client (two-phase commit): use one of {', '.join(_MECHANISMS)}"
                )
            mechanism = mechanism.upper()
            for key in ("sasl.username", "sasl.password"):
                if not conf.get(key):
                    raise ConfigurationError(f"{key} is required with sasl.mechanism={mechanism}")
        verify = str(conf.get("enable.ssl.certificate.verification", "true")).lower()
        identification = str(conf.get("ssl.endpoint.identification.algorithm", "https"))
        return cls(
            bootstrap=bootstrap,
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=conf.get("sasl.username"),
            sasl_password=conf.get("sasl.password"),
            ssl_ca_location=conf.get("ssl.ca.location"),
            ssl_certificate_location=conf.get("ssl.certificate.location"),
            ssl_key_location=conf.get("ssl.key.location"),
            ssl_key_password=conf.get("ssl.key.password"),
            ssl_verify=verify not in ("false", "0"),
            ssl_check_hostname=identification.lower() == "https",
            client_id=str(conf.get("client.id", "kafka-txn")),
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.security_protocol.endswith("ssl"):
            return None
        ctx = ssl.create_default_context(cafile=self.ssl_ca_location)
        if self.ssl_certificate_location:
            ctx.load_cert_chain(
                self.ssl_certificate_location, self.ssl_key_location, self.ssl_key_password
            )
        if not self.ssl_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = self.ssl_check_hostname
        return ctx


def _host_port(item: str) -> tuple[str, int]:
    text = item.strip()
    for prefix in ("PLAINTEXT://", "SSL://", "SASL_PLAINTEXT://", "SASL_SSL://"):
        if text.upper().startswith(prefix):
            text = text[len(prefix) :]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigurationError(f"bootstrap.servers entry {item!r} is not host:port")
    return host.strip("[]"), int(port)


class BrokerConnection:
    """A connected, authenticated socket to one broker, and the API versions it speaks."""

    def __init__(self, settings: ConnectionSettings, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._settings = settings
        self._lock = threading.Lock()
        self._correlation = 0
        try:
            raw = socket.create_connection((host, port), timeout=settings.timeout_s)
            ctx = settings.ssl_context()
            self._sock = ctx.wrap_socket(raw, server_hostname=host) if ctx else raw
        except (OSError, ssl.SSLError) as exc:
            raise ProtocolError(f"cannot connect to {host}:{port}: {exc}") from exc
        try:
            self.versions = self._api_versions()
            if settings.sasl_mechanism:
                self._authenticate()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    def supports(self, api: Api, ceiling: int | None = None) -> int:
        """The version of ``api`` to send to this broker, or -1 if none fits."""
        low_high = self.versions.get(api.key)
        if low_high is None:
            return -1
        return api.pick(low_high[0], low_high[1], ceiling)

    def request(self, api: Api, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return its decoded response."""
        flexible = api.flexible(version)
        with self._lock:
            self._correlation += 1
            correlation = self._correlation
            header = Writer()
            header.raw(struct.pack(">hhi", api.key, version, correlation))
            NULLABLE_STRING.encode(header, self._settings.client_id, False)  # never compact
            if flexible:
                header.uvarint(0)  # request header v2: empty tagged fields
            payload = header.getvalue() + encode(api.requests[version], body, flexible)
            try:
                self._sock.sendall(struct.pack(">i", len(payload)) + payload)
                size = struct.unpack(">i", self._read(4))[0]
                if not 4 <= size <= MAX_RESPONSE_BYTES:
                    raise ProtocolError(f"response size {size} from {self.host}:{self.port}")
                data = self._read(size)
            except (OSError, ssl.SSLError) as exc:
                self.close()
                raise ProtocolError(f"{api.name} to {self.host}:{self.port}: {exc}") from exc
        got = struct.unpack(">i", data[:4])[0]
        if got != correlation:
            self.close()
            raise ProtocolError(f"correlation id {got} != {correlation} from {self.host}")
        # Response header v1 (tagged fields) for flexible versions, except ApiVersions,
        # whose response header is always v0 (KIP-511).
        try:
            tags = Reader(data[4:])
            if flexible and api.key != API_VERSIONS.key:
                tags.skip_tagged_fields()
            return decode(api.responses[version], data[4 + tags.pos :], flexible)
        except ValueError as exc:
            raise ProtocolError(f"unreadable {api.name} v{version} response: {exc}") from exc

    def _read(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self._sock.recv(min(size, 1 << 20))
            if not chunk:
                raise OSError("connection closed by the broker")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

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
            raise AuthenticationError(
                f"broker refused SASL mechanism {mechanism} (enabled: {answer['mechanisms']})"
            )
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
            raise AuthenticationError(f"SASL {mechanism} failed: {exc}") from exc

    def _sasl_round(self, token: bytes) -> bytes:
        answer = self.request(SASL_AUTHENTICATE, 1, {"auth_bytes": token})
        if answer["error_code"]:
            raise AuthenticationError(
                f"SASL authentication failed: {answer['error_message'] or answer['error_code']}"
            )
        return bytes(answer["auth_bytes"] or b"")
