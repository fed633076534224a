"""Which librdkafka security settings the coordinator client honours: the one table.

Two-phase commit talks to the transaction coordinator with kafka-txn's own client
(librdkafka does not expose DescribeTransactions or EndTxn for a given producer id), so
that client must reach the cluster exactly as the producer does. ``SECURITY_KEYS``
classifies every security property of librdkafka (``ssl.*``, ``sasl.*`` and the few
others that change how a connection is made) and confluent-kafka's ``oauth_cb``:

- ``supported``: the coordinator client does what librdkafka does with it;
- ``ignored``: librdkafka itself uses it only for something that is refused anyway
  (GSSAPI, its built-in OIDC client), so it changes nothing here;
- ``refused``: Python's ``ssl`` module cannot do it (or kafka-txn does not); setting it
  is a ``ConfigurationError`` naming the key when the producer is built, before anything
  connects, instead of a coordinator client that silently connects differently.

A refused key set to librdkafka's own default is accepted (it changes nothing), and an
``ssl.*``/``sasl.*`` key missing from the table (a newer librdkafka's) is refused. The
table was checked against librdkafka 2.16.0's CONFIGURATION.md; a test lists the
properties of the librdkafka actually loaded and fails on any the table does not name.
docs/guide/two-phase-commit.md's table is generated from it (``python -m kafka_txn._docs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from kafka_txn.errors import ConfigurationError

__all__ = [
    "LIBRDKAFKA_VERSION_CHECKED",
    "SECURITY_KEYS",
    "KeyRule",
    "check_security_keys",
    "render_markdown",
]

LIBRDKAFKA_VERSION_CHECKED: Final = "2.16.0"
"""The librdkafka release whose CONFIGURATION.md the table was written from."""

Status = Literal["supported", "ignored", "refused"]


@dataclass(frozen=True)
class KeyRule:
    """What the coordinator client does with one librdkafka property."""

    status: Status
    note: str
    """How it is honoured, or why not and what to do instead (shown in errors and docs)."""
    default: str | None = None
    """librdkafka's default, for a refused key: setting exactly this changes nothing."""


def _s(note: str) -> KeyRule:
    return KeyRule("supported", note)


def _ignored(note: str) -> KeyRule:
    return KeyRule("ignored", note)


def _refused(note: str, default: str | None = None) -> KeyRule:
    return KeyRule("refused", note, default)


_KERBEROS = "used by librdkafka only with `sasl.mechanism=GSSAPI`, which is refused"
_OIDC = (
    "used by librdkafka only with `sasl.oauthbearer.method=oidc`, which is refused "
    "(give an `oauth_cb` instead)"
)
_ONLY_C = "set through librdkafka's C API, which confluent-kafka does not expose"

SECURITY_KEYS: Final[Mapping[str, KeyRule]] = {
    # -- how to connect
    "security.protocol": _s("PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    # -- TLS: who the broker is
    "ssl.ca.location": _s(
        "CA file, or directory of hashed CA files, that verifies the broker; `probe`: "
        "the system's CAs. Without it and without `ssl.ca.pem`: the system's CAs"
    ),
    "ssl.ca.pem": _s("CA certificates as a PEM string (with or without `ssl.ca.location`)"),
    "ssl.crl.location": _s(
        "CRL file (PEM): a revoked broker certificate is refused (the broker's own "
        "certificate is checked, as librdkafka's `X509_V_FLAG_CRL_CHECK` does)"
    ),
    "enable.ssl.certificate.verification": _s(
        "`false` accepts any broker certificate (and any host name), as librdkafka does"
    ),
    "ssl.endpoint.identification.algorithm": _s(
        "`https` (default): the broker's certificate must name the host connected to; "
        "`none`: any name"
    ),
    "ssl.cipher.suites": _s(
        "OpenSSL cipher list for TLS 1.2 and older (`SSLContext.set_ciphers`, as "
        "librdkafka's `SSL_CTX_set_cipher_list`)"
    ),
    # -- TLS: who we are
    "ssl.certificate.location": _s("client certificate (PEM, may hold the chain)"),
    "ssl.certificate.pem": _s(
        "client certificate as a PEM string (loaded through a private temporary file, "
        "deleted at once)"
    ),
    "ssl.key.location": _s("client private key (PEM), encrypted or not"),
    "ssl.key.pem": _s(
        "client private key as a PEM string (loaded through a private temporary file, "
        "deleted at once)"
    ),
    "ssl.key.password": _s(
        "password of an encrypted `ssl.key.location` / `ssl.key.pem`; a wrong one is a "
        "ConfigurationError when the producer is built"
    ),
    "ssl.keystore.location": _refused(
        "PKCS#12 keystores cannot be loaded by Python's ssl module: convert it once "
        "(`openssl pkcs12 -in keystore.p12 -out client.pem`) and set "
        "`ssl.certificate.location`, `ssl.key.location` and `ssl.key.password`"
    ),
    "ssl.keystore.password": _refused(
        "belongs to `ssl.keystore.location` (PKCS#12), which is refused: use "
        "`ssl.key.password` with the converted PEM key"
    ),
    "ssl_key": _refused(_ONLY_C),
    "ssl_certificate": _refused(_ONLY_C),
    "ssl_ca": _refused(_ONLY_C),
    "ssl.certificate.verify_cb": _refused(
        "a certificate verification callback is not run by the coordinator client: use "
        "`ssl.ca.location`/`ssl.ca.pem` and `ssl.crl.location`"
    ),
    # -- TLS: OpenSSL tuning Python's ssl module does not expose
    "ssl.curves.list": _refused(
        "Python's ssl module cannot set the TLS supported-groups list (only a server's "
        "ECDH curve); remove it, or use a broker that accepts OpenSSL's defaults"
    ),
    "ssl.sigalgs.list": _refused(
        "Python's ssl module cannot set the TLS signature algorithms; remove it, or use "
        "a broker that accepts OpenSSL's defaults"
    ),
    "ssl.providers": _refused(
        "Python's ssl module cannot load OpenSSL 3 providers; keys that need the "
        "`legacy` provider must be converted to a current PEM format"
    ),
    "ssl.engine.location": _refused(
        "OpenSSL engines (hardware keys) cannot be loaded by Python's ssl module"
    ),
    "ssl.engine.id": _refused(
        "belongs to `ssl.engine.location`, which is refused", default="dynamic"
    ),
    "ssl_engine_callback_data": _refused(_ONLY_C),
    "ssl.ca.certificate.stores": _refused(
        "Windows certificate stores other than the default are not read: export the "
        "CA and set `ssl.ca.location`",
        default="Root",
    ),
    # -- SASL
    "sasl.mechanism": _s(
        "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (with `oauth_cb`); GSSAPI is refused"
    ),
    "sasl.mechanisms": _s("alias of `sasl.mechanism`"),
    "sasl.username": _s("PLAIN and SCRAM user name"),
    "sasl.password": _s("PLAIN and SCRAM password"),
    "oauth_cb": _s(
        "confluent-kafka's OAUTHBEARER token callback, called the same way: "
        "`oauth_cb(sasl.oauthbearer.config)` returns `(token, expiry_epoch_seconds[, "
        "principal, extensions])`; called again when 80% of the token's life has passed"
    ),
    "sasl.oauthbearer.config": _s("passed to `oauth_cb`, as confluent-kafka does"),
    "sasl.oauthbearer.method": _refused(
        "`oidc` (librdkafka's built-in OIDC client) is not available to the coordinator "
        "client: fetch the token in an `oauth_cb` (the same callback serves both clients)",
        default="default",
    ),
    "enable.sasl.oauthbearer.unsecure.jwt": _refused(
        "librdkafka's unsecured development JWTs are not made by the coordinator "
        "client: give an `oauth_cb` instead (librdkafka refuses the two together)",
        default="false",
    ),
    "oauthbearer_token_refresh_cb": _refused(_ONLY_C + ": use confluent-kafka's `oauth_cb`"),
    "sasl.kerberos.service.name": _ignored(_KERBEROS),
    "sasl.kerberos.principal": _ignored(_KERBEROS),
    "sasl.kerberos.kinit.cmd": _ignored(_KERBEROS),
    "sasl.kerberos.keytab": _ignored(_KERBEROS),
    "sasl.kerberos.min.time.before.relogin": _ignored(_KERBEROS),
    "sasl.oauthbearer.client.id": _ignored(_OIDC),
    "sasl.oauthbearer.client.credentials.client.id": _ignored(_OIDC),
    "sasl.oauthbearer.client.secret": _ignored(_OIDC),
    "sasl.oauthbearer.client.credentials.client.secret": _ignored(_OIDC),
    "sasl.oauthbearer.scope": _ignored(_OIDC),
    "sasl.oauthbearer.extensions": _ignored(
        _OIDC + "; an `oauth_cb` returns its extensions as the 4th element"
    ),
    "sasl.oauthbearer.token.endpoint.url": _ignored(_OIDC),
    "sasl.oauthbearer.sub.claim.name": _ignored(_OIDC),
    "sasl.oauthbearer.grant.type": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.algorithm": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.private.key.file": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.private.key.passphrase": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.private.key.pem": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.file": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.claim.aud": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.claim.exp.seconds": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.claim.iss": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.claim.jti.include": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.claim.nbf.seconds": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.claim.sub": _ignored(_OIDC),
    "sasl.oauthbearer.assertion.jwt.template.file": _ignored(_OIDC),
    "sasl.oauthbearer.metadata.authentication.type": _ignored(
        _OIDC + " (for AWS IAM, return the signed token from an `oauth_cb`)"
    ),
    "https.ca.location": _ignored(_OIDC),
    "https.ca.pem": _ignored(_OIDC),
}


def _unset(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _is_default(value: Any, default: str | None) -> bool:
    if default is None:
        return False
    return str(value).strip().lower() == default.lower()


def check_security_keys(conf: Mapping[str, Any]) -> None:
    """Raise ConfigurationError for the first key of ``conf`` that the coordinator client
    would not honour: a refused one (not at librdkafka's default), or an ``ssl.*`` /
    ``sasl.*`` key the table does not know. Looks at keys only: values are checked where
    they are used (``ConnectionSettings.from_librdkafka``)."""
    for key, value in conf.items():
        rule = SECURITY_KEYS.get(key)
        if rule is None:
            if key.startswith(("ssl.", "ssl_", "sasl.")) and not _unset(value):
                raise ConfigurationError(
                    f"{key} is not a setting kafka-txn's coordinator client knows (it was "
                    f"checked against librdkafka {LIBRDKAFKA_VERSION_CHECKED}): two-phase "
                    "commit cannot promise to connect as the producer does; remove it, or "
                    "ask for it to be supported"
                )
            continue
        if rule.status != "refused" or _unset(value) or _is_default(value, rule.default):
            continue
        raise ConfigurationError(
            f"{key} is not supported by kafka-txn's coordinator client (two-phase commit "
            f"connects to the transaction coordinator itself, with Python's ssl module): "
            f"{rule.note}"
        )


def render_markdown() -> str:
    """docs/guide/two-phase-commit.md's table of security settings, from ``SECURITY_KEYS``."""
    order = {"supported": 0, "refused": 1, "ignored": 2}
    rows = sorted(SECURITY_KEYS.items(), key=lambda item: order[item[1].status])
    out = ["| setting | coordinator client | notes |", "|---|---|---|"]
    for key, rule in rows:
        note = rule.note.replace("|", "\\|")
        if rule.default is not None:
            note += f" (librdkafka's default `{rule.default}` is accepted)"
        out.append(f"| `{key}` | {rule.status} | {note} |")
    return "\n".join(out) + "\n"
