"""What can go wrong on a connection to a broker, as the coordinator client tells it apart:
a failure it retries after reconnecting (``ProtocolError``), and the ones retrying cannot
help (a refused login or certificate, a peer that is not a Kafka broker).
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "DeadlineExceededError",
    "NotKafkaError",
    "ProtocolError",
    "SaslAuthenticationError",
    "TlsDroppedError",
]


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
