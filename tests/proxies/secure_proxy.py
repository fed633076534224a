"""A loopback Kafka listener with the security the test broker lacks.

noida-db (the local test broker) has no TLS listener, accepts any SASL/PLAIN login and
has no SCRAM or OAUTHBEARER. ``SecureProxy`` sits in front of it on 127.0.0.1 and adds,
for any Kafka client (librdkafka and kafka-txn's coordinator client alike):

- TLS, with the server context the test gives (its certificate, and whether a client
  certificate is required);
- SASL checked here: PLAIN and SCRAM-SHA-256/512 against a user table (a SCRAM server
  written from RFC 5802, cross-checked by librdkafka's own SCRAM client in the tests),
  and OAUTHBEARER (KIP-255): the client-first message is parsed and its token checked;
  a refused token gets the RFC 7628 error challenge, as Apache Kafka answers. Until a
  connection has authenticated, anything but ApiVersions and the SASL requests closes it,
  as a broker does;
- the broker's address, wherever it appears in an answer (Metadata, FindCoordinator,
  DescribeCluster...), replaced by the proxy's, so that every later connection comes
  back through the proxy. The port is a fixed-width int32 right after the host string
  in every encoding, so the replacement keeps every length.

Every login, TLS failure and client certificate seen is recorded for the tests to check.
One request is forwarded at a time per connection (pipelined requests wait their turn;
answers keep their order). It stops with ``close()`` (or the ``with`` block).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import AdminClient
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

__all__ = ["Login", "SaslPolicy", "SecureProxy"]

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 17, 36, 18
UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED = 33, 58
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


@dataclass
class SaslPolicy:
    """What the proxy accepts: enabled mechanisms, PLAIN/SCRAM users and passwords, and
    a check of OAUTHBEARER tokens."""

    mechanisms: tuple[str, ...]
    users: dict[str, str] = field(default_factory=dict)
    accept_token: Callable[[str], bool] = lambda token: False


@dataclass(frozen=True)
class Login:
    """One successful SASL authentication."""

    client_id: str
    mechanism: str
    principal: str
    """The user name, or the OAUTHBEARER token."""
    extensions: dict[str, str] = field(default_factory=dict)


class _ClosedError(Exception):
    """Close the client connection (after sending what was already sent)."""


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def _read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _read_exact(sock, 4))
    if not 0 < size < 64 * 1024 * 1024:
        raise _ClosedError(f"not a Kafka request (size {size})")
    return _read_exact(sock, size)


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _request_header(frame: bytes, flexible: bool) -> tuple[int, int, int, str, int]:
    """(api key, version, correlation id, client id, offset of the body)."""
    api_key, version, correlation, id_len = struct.unpack(">hhih", frame[:10])
    pos = 10 + max(id_len, 0)
    client_id = frame[10:pos].decode("utf-8", "replace") if id_len >= 0 else ""
    if flexible:  # request header v2: tagged fields
        count, pos = _uvarint(frame, pos)
        for _ in range(count):
            _, pos = _uvarint(frame, pos)
            size, pos = _uvarint(frame, pos)
            pos += size
    return api_key, version, correlation, client_id, pos


class _ScramServer:
    """The server side of one SCRAM exchange (RFC 5802)."""

    def __init__(self, mechanism: str, users: dict[str, str]) -> None:
        self._hash = _HASHES[mechanism]
        self._users = users
        self.user = ""
        self._nonce = ""
        self._auth_message = b""
        self._stored_key = self._server_key = b""

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self._hash).digest()

    def first(self, client_first: bytes) -> bytes:
        text = client_first.decode()
        if not text.startswith("n,,"):
            raise _ClosedError("SCRAM: unexpected GS2 header")
        bare = text[3:]
        attrs = dict(item.split("=", 1) for item in bare.split(","))
        self.user = attrs["n"].replace("=2C", ",").replace("=3D", "=")
        password = self._users.get(self.user)
        if password is None:
            raise _ClosedError(f"SCRAM: unknown user {self.user!r}")
        salt, iterations = secrets.token_bytes(16), 4096
        salted = hashlib.pbkdf2_hmac(self._hash, password.encode(), salt, iterations)
        self._stored_key = hashlib.new(self._hash, self._hmac(salted, b"Client Key")).digest()
        self._server_key = self._hmac(salted, b"Server Key")
        nonce = attrs["r"] + secrets.token_urlsafe(18)
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        self._auth_message = f"{bare},{server_first}".encode()
        self._nonce = nonce
        return server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        text = client_final.decode()
        without_proof, _, proof_b64 = text.rpartition(",p=")
        attrs = dict(item.split("=", 1) for item in without_proof.split(","))
        if attrs.get("c") != "biws" or attrs.get("r") != self._nonce:
            raise _ClosedError("SCRAM: bad channel binding or nonce")
        auth_message = self._auth_message + b"," + without_proof.encode()
        signature = self._hmac(self._stored_key, auth_message)
        proof = base64.b64decode(proof_b64)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if hashlib.new(self._hash, client_key).digest() != self._stored_key:
            raise _ClosedError("SCRAM: wrong password")
        return b"v=" + base64.b64encode(self._hmac(self._server_key, auth_message))


def _parse_oauthbearer(message: bytes) -> tuple[str, dict[str, str]]:
    """(token, extensions) of a KIP-255 client-first message; ValueError if malformed."""
    text = message.decode("utf-8")
    gs2, sep, rest = text.partition("\x01")
    if not sep or not gs2.startswith("n,") or not rest.endswith("\x01\x01"):
        raise ValueError(f"not an OAUTHBEARER client-first message: {text!r}")
    pairs = dict(item.split("=", 1) for item in rest[:-2].split("\x01"))
    scheme, _, token = pairs.pop("auth", "").partition(" ")
    if scheme != "Bearer" or not token:
        raise ValueError(f"no 'auth=Bearer <token>' in {text!r}")
    return token, pairs


class _Session:
    """One client connection's SASL state."""

    def __init__(self, proxy: SecureProxy) -> None:
        self.proxy = proxy
        self.authenticated = proxy.sasl is None
        self.mechanism = ""
        self.scram: _ScramServer | None = None
        self.failed_oauth = ""

    def handshake(self, version: int, body: bytes) -> bytes:
        request = SaslHandshakeRequest[version].decode(body)
        enabled = self.proxy.sasl.mechanisms if self.proxy.sasl else ()
        error = 0 if request.mechanism in enabled else UNSUPPORTED_SASL_MECHANISM
        self.mechanism = request.mechanism if not error else ""
        if request.mechanism in _HASHES and self.proxy.sasl is not None:
            self.scram = _ScramServer(request.mechanism, self.proxy.sasl.users)
        answer = SaslHandshakeResponse[version](error_code=error, mechanisms=list(enabled))
        return bytes(answer.encode())

    def authenticate(self, client_id: str, auth: bytes) -> tuple[bytes, int, str]:
        """(auth bytes to answer, error code, error message)."""
        assert self.proxy.sasl is not None
        if self.failed_oauth:  # RFC 7628: the client acknowledged our error challenge
            return b"", SASL_AUTHENTICATION_FAILED, f"invalid token: {self.failed_oauth}"
        if self.mechanism == "PLAIN":
            _, user, password = auth.decode().split("\0")
            if self.proxy.sasl.users.get(user) != password:
                return b"", SASL_AUTHENTICATION_FAILED, "invalid user name or password"
            self._login(client_id, user, {})
            return b"", 0, ""
        if self.mechanism == "OAUTHBEARER":
            try:
                token, extensions = _parse_oauthbearer(auth)
            except ValueError as exc:
                return b"", SASL_AUTHENTICATION_FAILED, str(exc)
            if not self.proxy.sasl.accept_token(token):
                self.failed_oauth = "the token was not accepted"
                self.proxy.refused.append(token)
                return json.dumps({"status": "invalid_token"}).encode(), 0, ""
            self._login(client_id, token, extensions)
            return b"", 0, ""
        if self.scram is not None:
            try:
                if not self.scram._auth_message:
                    return self.scram.first(auth), 0, ""
                answer = self.scram.final(auth)
            except _ClosedError as exc:
                return b"", SASL_AUTHENTICATION_FAILED, str(exc)
            self._login(client_id, self.scram.user, {})
            return answer, 0, ""
        return b"", SASL_AUTHENTICATION_FAILED, "SaslAuthenticate before SaslHandshake"

    def _login(self, client_id: str, principal: str, extensions: dict[str, str]) -> None:
        self.authenticated = True
        self.proxy.logins.append(Login(client_id, self.mechanism, principal, extensions))


class SecureProxy:
    """TLS and SASL in front of a plaintext test broker, on 127.0.0.1 (see the module
    docstring). ``bootstrap_servers`` is the proxy's address."""

    def __init__(
        self,
        upstream: str,
        *,
        tls: ssl.SSLContext | None = None,
        sasl: SaslPolicy | None = None,
        stall: frozenset[int] = frozenset(),
    ) -> None:
        self.tls, self.sasl = tls, sasl
        self.stall = stall
        """API keys whose requests are never answered (the connection stays open)."""
        self.stalled: list[int] = []
        self._stop = threading.Event()
        self.logins: list[Login] = []
        self.refused: list[str] = []
        """OAUTHBEARER tokens refused."""
        self.tls_errors: list[str] = []
        self.client_certificates: list[dict[str, Any]] = []
        self.violations: list[str] = []
        """Requests sent before authenticating (the connection was closed)."""
        self._sockets: list[socket.socket] = []
        self._closed = False
        brokers = AdminClient({"bootstrap.servers": upstream}).list_topics(timeout=20).brokers
        self._listeners: list[tuple[socket.socket, tuple[str, int]]] = []
        self._rewrites: list[tuple[bytes, bytes]] = []
        for meta in brokers.values():
            address = socket.getaddrinfo(meta.host, meta.port, socket.AF_INET)[0][4][0]
            if not address.startswith("127."):
                raise RuntimeError(
                    f"broker {meta.host}:{meta.port} is not on loopback: SecureProxy "
                    "fronts local test brokers only"
                )
            listener = socket.create_server(("127.0.0.1", 0))
            port = listener.getsockname()[1]
            self._listeners.append((listener, (meta.host, meta.port)))
            host = meta.host.encode()
            self._rewrites.append(
                (host + struct.pack(">i", meta.port), host + struct.pack(">i", port))
            )
        self.bootstrap_servers = ",".join(
            f"127.0.0.1:{listener.getsockname()[1]}" for listener, _ in self._listeners
        )
        for listener, target in self._listeners:
            self._sockets.append(listener)
            threading.Thread(
                target=self._accept, args=(listener, target), name="secure-proxy", daemon=True
            ).start()

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> SecureProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self, listener: socket.socket, target: tuple[str, int]) -> None:
        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            threading.Thread(
                target=self._serve, args=(client, target), name="secure-proxy-conn", daemon=True
            ).start()

    def _serve(self, raw: socket.socket, target: tuple[str, int]) -> None:
        sock: socket.socket = raw
        upstream: socket.socket | None = None
        try:
            if self.tls is not None:
                try:
                    sock = self.tls.wrap_socket(raw, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    self.tls_errors.append(str(exc))
                    return
                self._sockets.append(sock)
                cert = sock.getpeercert()
                if cert:
                    self.client_certificates.append(cert)
            upstream = socket.create_connection(target, timeout=30)
            self._sockets.append(upstream)
            session = _Session(self)
            while not self._closed:
                self._one_request(sock, upstream, session)
        except (OSError, _ClosedError, ValueError, struct.error):
            pass
        finally:
            for s in (sock, raw, upstream):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.close()

    def _one_request(self, sock: socket.socket, upstream: socket.socket, session: _Session) -> None:
        frame = _read_frame(sock)
        api_key, version = struct.unpack(">hh", frame[:4])
        flexible = api_key == SASL_AUTHENTICATE and version >= 2
        _, _, correlation, client_id, body_at = _request_header(frame, flexible)
        body = frame[body_at:]
        if api_key in self.stall:
            self.stalled.append(api_key)
            self._stop.wait()
            raise _ClosedError("stopped")
        if api_key == SASL_HANDSHAKE:
            sock.sendall(_frame(struct.pack(">i", correlation) + session.handshake(version, body)))
            return
        if api_key == SASL_AUTHENTICATE and self.sasl is not None:
            request = SaslAuthenticateRequest[version].decode(body)
            auth, error, message = session.authenticate(client_id, bytes(request.auth_bytes))
            answer = SaslAuthenticateResponse[version](
                error_code=error,
                error_message=message or None,
                auth_bytes=auth,
                session_lifetime_ms=0,
            )
            header = struct.pack(">i", correlation) + (b"\x00" if flexible else b"")
            sock.sendall(_frame(header + bytes(answer.encode())))
            if error:
                raise _ClosedError(message)
            return
        if not session.authenticated and api_key != API_VERSIONS:
            self.violations.append(f"API {api_key} from {client_id!r} before authenticating")
            raise _ClosedError("unauthenticated request")
        upstream.sendall(_frame(frame))
        response = _read_frame(upstream)
        for old, new in self._rewrites:
            response = response.replace(old, new)
        sock.sendall(_frame(response))
