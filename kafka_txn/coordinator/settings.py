"""How the coordinator client reaches and authenticates to the cluster.

Settings come from the producer's librdkafka configuration, so that the coordinator
client reaches the cluster exactly as the producer does: security.protocol PLAINTEXT,
SSL, SASL_PLAINTEXT, SASL_SSL; sasl.mechanism PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and
OAUTHBEARER (through confluent-kafka's ``oauth_cb``); the ``ssl.*`` settings Python's
ssl module can honour (``security.SECURITY_KEYS`` lists every key and what is done with
it). Anything else is a ConfigurationError when the producer is built, not a surprise
at recovery time.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka_txn.coordinator.oauthbearer import OAuthBearerError, OAuthToken, TokenSource
from kafka_txn.coordinator.security import check_security_keys
from kafka_txn.coordinator.tls import TlsSettings
from kafka_txn.errors import ConfigurationError

__all__ = ["ConnectionSettings"]

_PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_TRUE, _FALSE = ("true", "1", "t"), ("false", "0", "f")


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
