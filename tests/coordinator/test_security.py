"""The coordinator client's security settings: TLS and SASL as librdkafka does
them, checked at construction, through the real client stack.

noida-db (the local test broker) has no TLS listener and no SCRAM or OAUTHBEARER, so
``tests/proxies/secure_proxy.py`` fronts the rig's broker with them (loopback only, stopped by
each test); certificates come from the openssl command line (``tests/support/certificates.py``).
librdkafka goes through the same proxy wherever a test builds a producer, which also
cross-checks the proxy's SCRAM and OAUTHBEARER servers against an independent client.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from kafka_txn import (
    ConfigurationError,
    FatalError,
    TransactionalProducer,
    TransactionOutcome,
)
from kafka_txn._docs import update_docs
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.coordinator.errors import AuthenticationError, NotKafkaError, ProtocolError
from kafka_txn.coordinator.foreign import describe_answer
from kafka_txn.coordinator.oauthbearer import (
    OAuthBearerError,
    OAuthToken,
    TokenSource,
    client_first_message,
)
from kafka_txn.coordinator.security import (
    LIBRDKAFKA_VERSION_CHECKED,
    SECURITY_KEYS,
    render_markdown,
)
from kafka_txn.testing import librdkafka_path
from kafka_txn.twophase.failures import coordinator_failure
from tests.proxies.secure_proxy import SASL_AUTHENTICATE, SaslPolicy, SecureProxy
from tests.support.certificates import Certificates, make_certificates

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJvcmRlcnMifQ.c2lnbmF0dXJl"


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def server_tls(
    certs: Certificates, *, cert: Path | None = None, key: Path | None = None,
    require_client: bool = False,
) -> ssl.SSLContext:  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert or certs.server_cert, key or certs.server_key)
    if require_client:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=certs.ca)
    return ctx


@pytest.fixture
def front(broker: Any) -> Iterator[Callable[..., SecureProxy]]:
    """Start SecureProxies in front of the rig's broker; all stop with the test."""
    started: list[SecureProxy] = []

    def start(**kwargs: Any) -> SecureProxy:
        proxy = SecureProxy(broker.bootstrap_servers, **kwargs)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.close()


class Sleeps:
    """A CoordinatorClient ``sleep`` that records retries (and sleeps for real)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        time.sleep(seconds)


def describe(conf: dict[str, Any], deadline_s: float = 20.0, sleep: Sleeps | None = None) -> str:
    """DescribeTransactions through the coordinator client with ``conf``: the state."""
    settings = ConnectionSettings.from_librdkafka(conf)
    with CoordinatorClient(
        settings, "security-probe", deadline_s=deadline_s, sleep=sleep or Sleeps()
    ) as client:
        return client.describe().state


def tls_conf(proxy: SecureProxy, **extra: Any) -> dict[str, Any]:
    conf = {"bootstrap.servers": proxy.bootstrap_servers, "security.protocol": "SSL"}
    conf.update(extra)
    return conf


# ---------------------------------------------------------------------- the table
def _librdkafka_properties() -> set[str]:
    """Every property name of the librdkafka actually loaded, from its own table
    (``rd_kafka_conf_properties_show``, the source of CONFIGURATION.md)."""
    lib = ctypes.CDLL(str(librdkafka_path()))
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_conf_properties_show.argtypes = [ctypes.c_void_p]
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "properties.md"
        handle = libc.fopen(str(path).encode(), b"w")
        assert handle, "fopen failed"
        lib.rd_kafka_conf_properties_show(handle)
        libc.fclose(handle)
        text = path.read_text()
    names = {m.group(1) for m in re.finditer(r"^([a-z][\w.]*)\s+\|", text, re.MULTILINE)}
    assert {"bootstrap.servers", "ssl.ca.location", "transactional.id"} <= names
    return names


_SECURITY = re.compile(r"^(ssl|sasl|https)[._]|^enable\.(ssl|sasl)\.|oauth|^security\.")


def test_every_security_property_of_the_loaded_librdkafka_is_classified():
    names = _librdkafka_properties()
    security = {n for n in names if _SECURITY.search(n)}
    assert len(security) > 50  # the filter does find them
    missing = sorted(security - set(SECURITY_KEYS))
    assert not missing, (
        f"librdkafka has security settings kafka_txn/coordinator/security.py does not "
        f"classify (it was checked against {LIBRDKAFKA_VERSION_CHECKED}): {missing}"
    )
    # ... and the table names no property librdkafka lacks (a typo would hide a key).
    assert set(SECURITY_KEYS) - names == {"oauth_cb"}  # confluent-kafka's, not librdkafka's


def test_docs_table_is_generated_from_the_classification():
    text = (DOCS / "guide" / "two-phase-commit.md").read_text()
    sections = {"coordinator security settings": render_markdown}
    assert update_docs(text, sections) == text, (
        "docs/guide/two-phase-commit.md's security table is stale: run python -m kafka_txn._docs"
    )
    for key, rule in SECURITY_KEYS.items():
        assert f"| `{key}` | {rule.status} |" in text


# ---------------------------------------------------------------------- at construction
_VALUES = {
    "sasl.oauthbearer.method": "oidc",
    "enable.sasl.oauthbearer.unsecure.jwt": "true",
    "ssl.engine.id": "pkcs11",
    "ssl.ca.certificate.stores": "MY",
}
REFUSED = sorted(key for key, rule in SECURITY_KEYS.items() if rule.status == "refused")


@pytest.fixture
def silent_listener() -> Iterator[tuple[str, Callable[[], int]]]:
    """A loopback listener that never accepts: the kernel still completes every TCP
    connection into its backlog, where ``connections()`` counts them."""
    server = socket.create_server(("127.0.0.1", 0))

    def connections() -> int:
        server.setblocking(False)
        count = 0
        while True:
            try:
                conn, _ = server.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    yield f"127.0.0.1:{server.getsockname()[1]}", connections
    server.close()


@pytest.mark.parametrize("key", REFUSED)
@pytest.mark.parametrize("protocol", ["SSL", "PLAINTEXT"])
def test_refused_key_is_a_configuration_error_before_anything_connects(
    key, protocol, silent_listener
):
    address, connections = silent_listener
    conf = {
        "bootstrap.servers": address,
        "transactional.id": "refused-key",
        "transaction.two.phase.commit.enable": True,
        "security.protocol": protocol,
        key: _VALUES.get(key, "some-value"),
    }
    with pytest.raises(ConfigurationError) as info:
        TransactionalProducer(conf)
    assert str(info.value).startswith(f"{key} is not supported by kafka-txn's coordinator")
    assert SECURITY_KEYS[key].note in str(info.value)  # says why, and what to do
    assert connections() == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [("ssl.engine.id", "dynamic"), ("ssl.ca.certificate.stores", "Root"),
     ("sasl.oauthbearer.method", "default"), ("enable.sasl.oauthbearer.unsecure.jwt", False),
     ("ssl.keystore.location", "")],
)  # fmt: skip
def test_a_refused_key_at_librdkafkas_default_changes_nothing(key, value):
    ConnectionSettings.from_librdkafka({"bootstrap.servers": "127.0.0.1:9", key: value})


def test_an_unknown_ssl_or_sasl_key_is_refused():
    for key in ("ssl.future.knob", "sasl.oauthbearer.new.thing"):
        with pytest.raises(ConfigurationError, match=re.escape(key)):
            ConnectionSettings.from_librdkafka({"bootstrap.servers": "127.0.0.1:9", key: "1"})


def test_ignored_keys_are_accepted():
    ConnectionSettings.from_librdkafka(
        {
            "bootstrap.servers": "127.0.0.1:9",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
            "sasl.kerberos.service.name": "kafka-other",
            "sasl.oauthbearer.client.id": "unused",
            "https.ca.location": "/nowhere",
        }
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"sasl.mechanism": "GSSAPI"}, "sasl.mechanism='GSSAPI' is not supported"),
        ({}, "sasl.mechanism='GSSAPI' is not supported"),  # librdkafka's default
        ({"sasl.mechanisms": "GSSAPI"}, "sasl.mechanisms='GSSAPI'"),
        ({"sasl.mechanism": "OAUTHBEARER"}, "OAUTHBEARER needs an oauth_cb"),
        ({"sasl.mechanism": "OAUTHBEARER", "oauth_cb": "not callable"},
         "oauth_cb must be callable"),
        ({"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
          "oauth_cb": lambda _: None}, "sasl.oauthbearer.method is not supported"),
    ],
)  # fmt: skip
def test_sasl_mechanisms_it_cannot_do_are_refused_at_construction(extra, needle, silent_listener):
    address, connections = silent_listener
    conf = {
        "bootstrap.servers": address,
        "transactional.id": "sasl-refused",
        "transaction.two.phase.commit.enable": True,
        "security.protocol": "SASL_SSL",
        **extra,
    }
    with pytest.raises(ConfigurationError, match=re.escape(needle)):
        TransactionalProducer(conf)
    assert connections() == 0


def test_settings_files_are_loaded_at_construction(certs, tmp_path):
    base = {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SSL"}
    client = {"ssl.certificate.location": str(certs.client_cert)}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"ssl.ca.location": str(tmp_path / "missing.pem")}, "ssl.ca.location="),
        ({"ssl.ca.pem": "not a certificate"}, "ssl.ca.pem is not a PEM certificate"),
        ({"ssl.crl.location": str(tmp_path / "missing-crl.pem")}, "ssl.crl.location="),
        ({**client, "ssl.key.location": str(certs.client_key_encrypted)},
         "ssl.key.location is an encrypted key: set ssl.key.password"),
        ({**client, "ssl.key.location": str(certs.client_key_encrypted),
          "ssl.key.password": "wrong"}, "ssl.key.password does not decrypt ssl.key.location"),
        ({**client, "ssl.key.location": str(certs.server_key)},
         "ssl.key.location is not the key of ssl.certificate.location"),
        ({"ssl.key.location": str(certs.client_key)}, "without a client certificate"),
        ({**client, "ssl.key.location": str(tmp_path / "nokey.pem")}, "ssl.key.location="),
        ({**client, "ssl.certificate.pem": certs.client_cert.read_text(),
          "ssl.key.location": str(certs.client_key)}, "not both"),
        ({"ssl.cipher.suites": "NO-SUCH-CIPHER"}, "ssl.cipher.suites="),
        ({"ssl.endpoint.identification.algorithm": "dns"},
         "ssl.endpoint.identification.algorithm='dns'"),
        ({"enable.ssl.certificate.verification": "maybe"},
         "enable.ssl.certificate.verification='maybe' is not a boolean"),
    ]  # fmt: skip
    for extra, needle in cases:
        with pytest.raises(ConfigurationError) as info:
            ConnectionSettings.from_librdkafka({**base, **extra})
        assert needle in str(info.value), (extra, str(info.value))
    # The same keys are not loaded without TLS, as librdkafka ignores them then.
    ConnectionSettings.from_librdkafka({**cases[0][0], "bootstrap.servers": "127.0.0.1:9"})


def test_secrets_stay_out_of_repr(certs):
    settings = ConnectionSettings.from_librdkafka(
        {
            "bootstrap.servers": "127.0.0.1:9",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": lambda _: (TOKEN, time.time() + 60),
            "ssl.ca.location": str(certs.ca),
            "ssl.certificate.pem": certs.client_cert.read_text(),
            "ssl.key.pem": certs.client_key_encrypted.read_text(),
            "ssl.key.password": certs.key_password,
        }
    )
    shown = repr(settings)
    assert "PRIVATE KEY" not in shown and certs.key_password not in shown
    assert "lambda" not in shown


# ---------------------------------------------------------------------- TLS
@pytest.mark.broker
def test_inline_pem_ca_and_ca_file_both_verify_the_broker(front, certs):
    proxy = front(tls=server_tls(certs))
    assert describe(tls_conf(proxy, **{"ssl.ca.pem": certs.ca.read_text()})) == "Empty"
    assert describe(tls_conf(proxy, **{"ssl.ca.location": str(certs.ca)})) == "Empty"


@pytest.mark.broker
def test_a_broker_signed_by_another_ca_is_refused_at_once(front, certs):
    proxy = front(tls=server_tls(certs))
    sleeps = Sleeps()
    with pytest.raises(AuthenticationError) as info:
        describe(tls_conf(proxy, **{"ssl.ca.pem": certs.other_ca.read_text()}), sleep=sleeps)
    message = str(info.value)
    assert message.startswith("kafka-txn does not trust the TLS certificate of 127.0.0.1:")
    assert "ssl.endpoint.identification.algorithm" in message and "refused" not in message
    assert "set ssl.ca.location or ssl.ca.pem" in message
    assert sleeps.calls == []  # not retried: it cannot get better
    # Through two-phase commit it is a fatal configuration problem, not "try again".
    failure = coordinator_failure(info.value, "recover", recovering=True, deadline_s=20)
    assert isinstance(failure, FatalError) and "ssl" in str(failure)


@pytest.mark.broker
def test_host_name_verification_follows_endpoint_identification(front, certs):
    proxy = front(tls=server_tls(certs, cert=certs.wrong_name_cert, key=certs.wrong_name_key))
    ca = {"ssl.ca.location": str(certs.ca)}
    with pytest.raises(AuthenticationError) as info:
        describe(tls_conf(proxy, **ca))
    assert "ssl.endpoint.identification.algorithm=none" in str(info.value)
    for https in ("https", "HTTPS"):
        with pytest.raises(AuthenticationError):
            describe(tls_conf(proxy, **ca, **{"ssl.endpoint.identification.algorithm": https}))
    assert (
        describe(tls_conf(proxy, **ca, **{"ssl.endpoint.identification.algorithm": "none"}))
        == "Empty"
    )


@pytest.mark.broker
def test_certificate_verification_can_be_turned_off(front, certs):
    proxy = front(tls=server_tls(certs, cert=certs.wrong_name_cert, key=certs.wrong_name_key))
    other = {"ssl.ca.pem": certs.other_ca.read_text()}
    with pytest.raises(AuthenticationError):
        describe(tls_conf(proxy, **other))
    off = {**other, "enable.ssl.certificate.verification": "false"}
    assert describe(tls_conf(proxy, **off)) == "Empty"


@pytest.mark.broker
def test_client_certificate_with_an_encrypted_key(front, certs):
    proxy = front(tls=server_tls(certs, require_client=True))
    ca = {"ssl.ca.location": str(certs.ca)}
    with pytest.raises(AuthenticationError) as info:
        describe(tls_conf(proxy, **ca))
    assert "wants a client certificate" in str(info.value)
    assert "ssl.certificate.location" in str(info.value)
    assert proxy.client_certificates == []
    from_files = {
        **ca,
        "ssl.certificate.location": str(certs.client_cert),
        "ssl.key.location": str(certs.client_key_encrypted),
        "ssl.key.password": certs.key_password,
    }
    assert describe(tls_conf(proxy, **from_files)) == "Empty"
    inline = {
        "ssl.ca.pem": certs.ca.read_text(),
        "ssl.certificate.pem": certs.client_cert.read_text(),
        "ssl.key.pem": certs.client_key_encrypted.read_text(),
        "ssl.key.password": certs.key_password,
    }
    assert describe(tls_conf(proxy, **inline)) == "Empty"
    subjects = [dict(pair[0] for pair in c["subject"]) for c in proxy.client_certificates]
    assert subjects and all(s["commonName"] == "client" for s in subjects)


@pytest.mark.broker
def test_crl_refuses_a_revoked_broker_certificate(front, certs):
    good = front(tls=server_tls(certs))
    revoked = front(tls=server_tls(certs, cert=certs.revoked_cert, key=certs.revoked_key))
    ca = {"ssl.ca.location": str(certs.ca)}
    assert describe(tls_conf(revoked, **ca)) == "Empty"  # no CRL: accepted
    assert describe(tls_conf(revoked, **ca, **{"ssl.crl.location": str(certs.crl_empty)}))
    with_crl = {**ca, "ssl.crl.location": str(certs.crl_revoking)}
    assert describe(tls_conf(good, **with_crl)) == "Empty"
    with pytest.raises(AuthenticationError, match="revoked"):
        describe(tls_conf(revoked, **with_crl))


@pytest.mark.broker
def test_tls_client_at_a_plaintext_listener_and_the_reverse(front, broker, certs):
    """A PLAINTEXT listener closes on a ClientHello (Apache Kafka reads it as an absurd
    request size): retried once (a TLS broker in trouble may drop one handshake), then a
    NotKafkaError well before the deadline, not a retry loop until it."""
    sleeps = Sleeps()
    with pytest.raises(NotKafkaError) as info:
        describe(
            {"bootstrap.servers": broker.bootstrap_servers, "security.protocol": "SSL",
             "ssl.ca.location": str(certs.ca)},
            deadline_s=30, sleep=sleeps,
        )  # fmt: skip
    assert "closed the connection during the TLS handshake" in str(info.value)
    assert "is it a TLS listener? check security.protocol (it is SSL)" in str(info.value)
    assert len(sleeps.calls) == 1
    # Python's TLS server resets a plaintext client without a word (a listener that
    # answers with a TLS alert is named as such: test_describe_answer).
    proxy = front(tls=server_tls(certs))
    with pytest.raises(ProtocolError) as plain:
        describe({"bootstrap.servers": proxy.bootstrap_servers}, deadline_s=3, sleep=sleeps)
    assert "does security.protocol=PLAINTEXT match it?" in str(plain.value)


@pytest.mark.broker
def test_a_silent_bootstrap_server_does_not_starve_a_healthy_one(broker, silent_listener):
    """A bootstrap server that accepts and never answers gets only its share of the
    deadline: the healthy server after it still answers within the same call."""
    silent, _ = silent_listener
    conf = {"bootstrap.servers": f"{silent},{broker.bootstrap_servers}"}
    started = time.monotonic()
    assert describe(conf, deadline_s=10) == "Empty"
    assert time.monotonic() - started < 60  # hang guard only


def test_every_unusable_bootstrap_server_is_named_with_its_own_error(silent_listener):
    silent, _ = silent_listener
    with socket.create_server(("127.0.0.1", 0)) as closed:
        refused = f"127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(ProtocolError) as info:
        describe({"bootstrap.servers": f"{silent},{refused}"}, deadline_s=3)
    message = str(info.value)
    assert f"ApiVersions to {silent}: timed out" in message
    assert f"cannot connect to {refused}" in message


# ---------------------------------------------------------------------- SASL
@pytest.mark.broker
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_plain_and_scram_still_work(front, mechanism):
    proxy = front(sasl=SaslPolicy((mechanism,), users={"alice": "s3cret,=pw"}))
    conf = {
        "bootstrap.servers": proxy.bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": "alice",
        "sasl.password": "s3cret,=pw",
    }
    assert describe(conf) == "Empty"
    # librdkafka's own client logs in through the same proxy (checks the test server).
    AdminClient({**conf, "client.id": "librdkafka-check"}).list_topics(timeout=20)
    logins = {(login.client_id, login.mechanism, login.principal) for login in proxy.logins}
    assert ("kafka-txn", mechanism, "alice") in logins
    assert ("librdkafka-check", mechanism, "alice") in logins
    assert proxy.violations == []
    with pytest.raises(AuthenticationError):
        describe({**conf, "sasl.password": "wrong"})


class OAuthCallback:
    """An ``oauth_cb`` handing out numbered tokens that live ``lifetime`` seconds."""

    def __init__(self, lifetime: float = 3600.0, extensions: dict[str, str] | None = None):
        self.lifetime = lifetime
        self.extensions = extensions
        self.configs: list[str | None] = []

    def __call__(self, config: str | None) -> tuple[Any, ...]:
        self.configs.append(config)
        token = f"{TOKEN}.{len(self.configs)}"
        expiry = time.time() + self.lifetime
        if self.extensions is None:
            return token, expiry
        return token, expiry, "orders-app", self.extensions


def _oauth_conf(proxy: SecureProxy, cb: OAuthCallback, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": proxy.bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": cb,
        **extra,
    }


@pytest.mark.broker
def test_oauthbearer_token_from_oauth_cb_reaches_the_broker(front):
    proxy = front(sasl=SaslPolicy(("OAUTHBEARER",), accept_token=lambda t: t.startswith(TOKEN)))
    cb = OAuthCallback(extensions={"logicalCluster": "lkc-1", "traceId": "t 1"})
    conf = _oauth_conf(proxy, cb, **{"sasl.oauthbearer.config": "scope=orders"})
    settings = ConnectionSettings.from_librdkafka(conf)
    assert cb.configs == []  # nothing is asked for before a connection needs it
    for _ in range(2):  # two clients, four connections: one token while it is fresh
        with CoordinatorClient(settings, "oauth-probe", deadline_s=20) as client:
            assert client.describe().state == "Empty"
    assert cb.configs == ["scope=orders"]
    assert {(x.client_id, x.mechanism, x.principal) for x in proxy.logins} == {
        ("kafka-txn", "OAUTHBEARER", f"{TOKEN}.1")
    }
    assert all(x.extensions == {"logicalCluster": "lkc-1", "traceId": "t 1"} for x in proxy.logins)


@pytest.mark.broker
def test_oauthbearer_token_is_refreshed_when_it_expires_between_connections(front):
    proxy = front(sasl=SaslPolicy(("OAUTHBEARER",), accept_token=lambda t: t.startswith(TOKEN)))
    cb = OAuthCallback(lifetime=0.2)
    settings = ConnectionSettings.from_librdkafka(_oauth_conf(proxy, cb))
    for _ in range(2):
        with CoordinatorClient(settings, "oauth-probe", deadline_s=20) as client:
            client.describe()
        time.sleep(0.3)  # the token has expired before the next connection
    assert [x.principal for x in proxy.logins][::-1][:1] == [f"{TOKEN}.{len(cb.configs)}"]
    assert len(cb.configs) == 2
    assert {x.principal for x in proxy.logins} == {f"{TOKEN}.1", f"{TOKEN}.2"}


@pytest.mark.broker
def test_a_refused_token_is_a_clear_error_and_is_asked_for_again(front):
    proxy = front(sasl=SaslPolicy(("OAUTHBEARER",), accept_token=lambda t: t.endswith(".2")))
    cb = OAuthCallback()
    settings = ConnectionSettings.from_librdkafka(_oauth_conf(proxy, cb))
    sleeps = Sleeps()
    with (
        CoordinatorClient(settings, "oauth-probe", deadline_s=20, sleep=sleeps) as client,
        pytest.raises(AuthenticationError) as info,
    ):
        client.describe()
    assert "refused the token from oauth_cb" in str(info.value)
    assert "invalid_token" in str(info.value)
    assert sleeps.calls == [] and proxy.refused == [f"{TOKEN}.1"]
    with CoordinatorClient(settings, "oauth-probe", deadline_s=20) as client:
        assert client.describe().state == "Empty"  # the next call asked for a new token
    assert [x.principal for x in proxy.logins] == [f"{TOKEN}.2"]


@pytest.mark.broker
def test_a_failing_oauth_cb_is_an_authentication_error(front):
    proxy = front(sasl=SaslPolicy(("OAUTHBEARER",), accept_token=lambda t: True))

    def broken(config: str | None) -> tuple[str, float]:
        raise RuntimeError("identity provider down")

    with pytest.raises(AuthenticationError, match="identity provider down"):
        describe(_oauth_conf(proxy, broken))
    with pytest.raises(AuthenticationError, match="expired token"):
        describe(_oauth_conf(proxy, lambda _: (TOKEN, time.time() - 5)))


def test_token_source_refreshes_after_80_percent_of_the_life():
    now = [1000.0]
    answers = iter([("a", 1100.0), ("b", 1300.0, "p", {"k": "v"})])
    calls: list[str | None] = []

    def cb(config: str | None) -> Any:
        calls.append(config)
        return next(answers)

    source = TokenSource(cb, "cfg", clock=lambda: now[0])
    assert source.token().value == "a"
    now[0] = 1079.0
    assert source.token().value == "a" and calls == ["cfg"]
    now[0] = 1080.0  # 80% of 100 s
    token = source.token()
    assert (token.value, token.principal, dict(token.extensions)) == ("b", "p", {"k": "v"})


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        ("just-a-token", "must return (token, expiry"),
        (("", 2e9), "empty token"),
        (("tok", "2030"), "seconds since the epoch"),
        (("tok", 60), "expired token"),
        (("tok\x01", 2e9), "visible ASCII"),
        (("tok", 2e9, "p", {"auth": "x"}), "'auth'"),
        (("tok", 2e9, "p", {"trace-id": "x"}), "letters only"),
        (("tok", 2e9, "p", {"trace": "\x00"}), "visible ASCII"),
    ],
)
def test_oauth_cb_answers_are_checked_like_librdkafka(answer, needle):
    with pytest.raises(OAuthBearerError, match=re.escape(needle)):
        TokenSource(lambda _: answer, None, clock=lambda: 100.0).token()


def test_client_first_message_is_kip_255s():
    token = OAuthToken("abc.def.ghi", 2e9, "p", {"a": "1", "b": "x y"})
    assert client_first_message(token) == b"n,,\x01auth=Bearer abc.def.ghi\x01a=1\x01b=x y\x01\x01"
    assert client_first_message(OAuthToken("t", 2e9)) == b"n,,\x01auth=Bearer t\x01\x01"


# ---------------------------------------------------------------------- end to end
@pytest.mark.broker
def test_two_phase_commit_over_sasl_ssl_with_oauthbearer_and_client_certificate(
    front, broker, topic, txn_id, certs
):
    proxy = front(
        tls=server_tls(certs, require_client=True),
        sasl=SaslPolicy(("OAUTHBEARER",), accept_token=lambda t: t.startswith(TOKEN)),
    )
    cb = OAuthCallback(extensions={"logicalCluster": "lkc-1"})
    conf = {
        "bootstrap.servers": proxy.bootstrap_servers,
        "transactional.id": txn_id,
        "transaction.two.phase.commit.enable": True,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.config": "principal=orders",
        "oauth_cb": cb,
        "ssl.ca.pem": certs.ca.read_text(),
        "ssl.certificate.pem": certs.client_cert.read_text(),
        "ssl.key.pem": certs.client_key_encrypted.read_text(),
        "ssl.key.password": certs.key_password,
    }
    producer = TransactionalProducer(conf, operation_timeout=30)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"over-tls-and-oauth")
        state = producer.prepare_transaction()  # DescribeTransactions through the proxy
        assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
    finally:
        producer.close()
    assert broker.read_committed(topic, expected=1) == [(None, b"over-tls-and-oauth")]
    clients = {x.client_id for x in proxy.logins}
    assert {"kafka-txn", "rdkafka"} <= clients  # both clients, one callback
    assert all(x.principal.startswith(TOKEN) for x in proxy.logins)
    assert all(x.extensions == {"logicalCluster": "lkc-1"} for x in proxy.logins)
    assert set(cb.configs) == {"principal=orders"}
    assert proxy.violations == [] and proxy.tls_errors == []


# ---------------------------------------------------------------------- not Kafka
@pytest.fixture
def http_server() -> Iterator[str]:
    """A tiny HTTP server on loopback that answers bytes it cannot parse at once with
    400, as nginx does (Python's http.server would wait for a newline first)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(
                    b"HTTP/1.1 400 Bad Request\r\nServer: tiny\r\nContent-Length: 0\r\n"
                    b"Connection: close\r\n\r\n"
                )

    threading.Thread(target=serve, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_an_http_port_is_named_as_not_kafka(http_server):
    sleeps = Sleeps()
    with pytest.raises(NotKafkaError) as info:
        describe({"bootstrap.servers": http_server}, sleep=sleeps)
    message = str(info.value)
    assert message.startswith(f"{http_server} does not speak the Kafka protocol (answered like")
    assert "HTTP/1.1 400 Bad Request" in message
    assert "1213486160" not in message
    assert sleeps.calls == []
    failure = coordinator_failure(info.value, "describe", recovering=True, deadline_s=5)
    assert isinstance(failure, ConfigurationError)
    assert "does not speak the Kafka protocol" in str(failure)


@pytest.mark.parametrize(
    ("port", "needle"),
    [(5432, "answered like PostgreSQL: FATAL: unsupported frontend protocol"),
     (3306, "answered like MySQL/MariaDB, server version")],
)  # fmt: skip
def test_a_database_port_is_named_as_not_kafka(port, needle):
    with pytest.raises(NotKafkaError) as info:
        describe({"bootstrap.servers": f"127.0.0.1:{port}"})
    assert f"127.0.0.1:{port} does not speak the Kafka protocol ({needle}" in str(info.value)


def test_the_cli_names_a_port_that_is_not_kafka(http_server, capsys):
    from kafka_txn.cli.main import main

    code = main(
        ["describe", "--bootstrap-servers", http_server, "--transactional-id", "x",
         "--timeout", "5"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"kafka-txn: error: {http_server} is not a usable Kafka broker: ")
    assert "does not speak the Kafka protocol (answered like HTTP/1.1 400" in err
    assert "response size" not in err and err.count(http_server) == 1


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (
            b"HTTP/1.1 400 Bad Request\r\nServer: x\r\n\r\n",
            "answered like HTTP/1.1 400 Bad Request",
        ),
        (b"\x15\x03\x03\x00\x02\x02\x46", "answered with TLS"),
        (b"-ERR unknown command\r\n", "answered like Redis: -ERR unknown command"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "answered 'SSH-2.0-OpenSSH_9.6'"),
        (b"\x7f\x00\x01\x02\x03", "answered bytes 7f 00 01 02 03 (read as a Kafka size: "),
    ],
)
def test_describe_answer(head, expected):
    assert describe_answer(head).startswith(expected)


# ---------------------------------------------------------------------- deadlines
def _bounded(call: Callable[[], Any], limit_s: float = 60.0) -> BaseException | None:
    """Run ``call`` in a thread; fail if it has not ended within ``limit_s`` (a hang, not
    a slow run: the deadlines here are a fraction of a second); return what it raised."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), "the coordinator client did not honour its deadline"
    return outcome[0]


def _patient(conf: dict[str, Any]) -> ConnectionSettings:
    """Settings whose per-step timeout is an hour: only the deadline can end a wait."""
    return dataclasses.replace(ConnectionSettings.from_librdkafka(conf), timeout_s=3600.0)


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
def test_deadline_bounds_a_broker_that_never_answers_or_handshakes(
    protocol, silent_listener, certs
):
    address, _ = silent_listener
    settings = _patient(
        {"bootstrap.servers": address, "security.protocol": protocol,
         "ssl.ca.location": str(certs.ca)}
    )  # fmt: skip

    def call() -> None:
        with CoordinatorClient(settings, "deadline", deadline_s=0.5) as client:
            client.describe()

    raised = _bounded(call)
    assert isinstance(raised, ProtocolError) and not isinstance(raised, NotKafkaError)


@pytest.mark.broker
def test_deadline_bounds_a_stalled_sasl_exchange(front):
    proxy = front(
        sasl=SaslPolicy(("PLAIN",), users={"u": "p"}), stall=frozenset({SASL_AUTHENTICATE})
    )
    settings = _patient(
        {"bootstrap.servers": proxy.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
         "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    )  # fmt: skip

    def call() -> None:
        with CoordinatorClient(settings, "deadline", deadline_s=0.5) as client:
            client.describe()

    raised = _bounded(call)
    assert isinstance(raised, ProtocolError)
    assert proxy.stalled and set(proxy.stalled) == {SASL_AUTHENTICATE}
