"""The socket under a connection to one broker: TCP, then the TLS handshake when
security.protocol is SSL or SASL_SSL, each step bounded by the connection's deadline; and
what a TLS failure means for the caller: a certificate problem or a refusal is final, a
peer that does not speak TLS is not a Kafka listener, a dropped handshake is retried.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable

from kafka_txn.coordinator.errors import (
    AuthenticationError,
    DeadlineExceededError,
    NotKafkaError,
    ProtocolError,
    TlsDroppedError,
)
from kafka_txn.coordinator.settings import ConnectionSettings

__all__ = ["open_socket", "tls_failure"]


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


def open_socket(
    settings: ConnectionSettings, host: str, port: int, timeout: Callable[[], float]
) -> socket.socket:
    """A socket connected to ``host:port``, the TLS handshake done when security.protocol
    says so. ``timeout()`` gives the seconds each blocking step may take (and raises
    DeadlineExceededError once the deadline has passed). A failure is the error to raise:
    a TLS failure classified by ``tls_failure``, a peer that closes the connection on the
    ClientHello a TlsDroppedError, anything else a ProtocolError."""
    address = f"{host}:{port}"
    ctx = settings.ssl_context()
    try:
        raw = socket.create_connection((host, port), timeout=timeout())
    except OSError as exc:
        raise ProtocolError(f"cannot connect to {address}: {exc}") from exc
    if ctx is None:
        return raw
    try:
        # SNI and the host name check use the host connected to, as librdkafka's
        # rd_kafka_transport_ssl_set_endpoint_id (no SNI for an IP address).
        sock = ctx.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False)
    except (OSError, ValueError) as exc:
        raw.close()
        raise ProtocolError(f"TLS with {address}: {exc}") from exc
    try:
        sock.settimeout(timeout())
        sock.do_handshake()
    except DeadlineExceededError:
        sock.close()
        raise
    except OSError as exc:  # ssl.SSLError included
        sock.close()
        failure = tls_failure(exc, address) if isinstance(exc, ssl.SSLError) else None
        if failure is not None and type(failure) is not ProtocolError:
            raise failure from exc
        if _dropped(exc):
            # Apache Kafka's PLAINTEXT listener closes on every ClientHello: it reads
            # 0x16030100 as a request size above socket.request.max.bytes
            # (NetworkReceive's InvalidReceiveException). The client retries this
            # once (a TLS broker restarting or a proxy without backends does it too).
            raise TlsDroppedError(
                f"{address} closed the connection during the TLS handshake "
                f"({_reason(exc) or type(exc).__name__}): is it a TLS listener? check "
                f"security.protocol (it is {settings.security_protocol.upper()})"
            ) from exc
        raise ProtocolError(
            f"TLS handshake with {address} failed: "
            f"{_reason(exc) or type(exc).__name__} (is it a TLS listener? "
            f"security.protocol is {settings.security_protocol.upper()})"
        ) from exc
    return sock


def tls_failure(exc: ssl.SSLError, address: str) -> ProtocolError:
    """A TLS error as the error to raise: certificate problems and refusals are
    final (AuthenticationError), a peer that does not speak TLS is a NotKafkaError,
    anything else (a dropped connection) is retried."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = _VERIFY_HINTS.get(exc.verify_code, "")
        return AuthenticationError(
            f"kafka-txn does not trust the TLS certificate of {address} "
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
            f"TLS: {address} refused the connection ({reason.lower()}){hint}"
        )
    if any(w in upper for w in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER")):
        return NotKafkaError(
            f"{address} does not speak TLS ({reason.lower()}): it is probably a "
            "PLAINTEXT listener; check security.protocol and the port"
        )
    return ProtocolError(f"TLS with {address} failed: {reason}")
