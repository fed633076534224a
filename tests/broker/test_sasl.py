"""The SASL rows of docs/guide/two-phase-commit.md's "Connection settings" table, on Apache
Kafka 4.4.0: what recovery, the coordinator client and ``kafka-txn`` do when the broker
refuses the login, and when a client that does not log in reaches a SASL listener.

The broker is ``tests/broker/test_acls.py``'s (its fixtures are this module's
too): SASL/SCRAM-SHA-256 only on its client listener, with ``StandardAuthorizer``. A
prepared transaction is left open by a producer logged in as a real SCRAM user with the
documented grants; a fresh process then recovers it with one setting wrong:

- a wrong password, and a user the broker does not know: Apache Kafka answers both
  alike, in a SaslAuthenticate error ("Authentication failed during authentication due
  to invalid credentials with SASL mechanism SCRAM-SHA-256":
  ``SaslServerAuthenticator.handleSaslToken`` sends that instead of the SCRAM server's
  reason, so as not to tell whether the user exists);
- ``sasl.mechanism=SCRAM-SHA-512``, which the broker does not enable: its SaslHandshake
  answers UNSUPPORTED_SASL_MECHANISM with the mechanisms it does enable;
- ``security.protocol=PLAINTEXT``: the SASL listener answers ApiVersions (allowed
  before the login) and closes the connection at the next request
  (``SaslServerAuthenticator``: "Unexpected Kafka request of type ... during SASL
  handshake").

librdkafka reports the first two only through error_cb (``_AUTHENTICATION``) and logs
in again and again meanwhile; recovery hears of it there and raises a ``FatalError`` at
once, with the broker's reason and the settings to fix, and settles nothing. The third
looks like a broker that drops connections: it is retried until the deadline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError
from sqlalchemy import create_engine, text

from kafka_txn import FatalError, TransactionOutcome
from kafka_txn.classification import AUTHENTICATION_CODES, exception_for
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.coordinator.errors import ProtocolError, SaslAuthenticationError
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.errors import TransactionOutcomeUnknownError
from kafka_txn.twophase.failures import coordinator_failure
from tests.broker import test_acls as acls
from tests.broker.test_acls import (
    MECHANISM,
    Principal,
    assert_aborted,
    assert_still_prepared,
    documented,
    prepare_and_crash,
    read,
)
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support.apache_kafka import ROOT

# The broker and the per-test principal, topic and transactional id of the ACL tests.
kafka = acls.kafka
admin = acls.admin
principal = acls.principal
topic = acls.topic
txn_id = acls.txn_id

INVALID_CREDENTIALS = (
    f"Authentication failed during authentication due to invalid credentials with SASL "
    f"mechanism {MECHANISM}"
)
"""Apache Kafka's SaslAuthenticate error message for a wrong password and for an unknown
user alike (``SaslServerAuthenticator.handleSaslToken``)."""

REFUSED_LOGINS: dict[str, dict[str, str]] = {
    "wrong-password": {"sasl.password": "not-the-password"},
    "unknown-user": {"sasl.username": "nobody-at-all"},
    "wrong-mechanism": {"sasl.mechanism": "SCRAM-SHA-512"},
}
"""The setting made wrong, over a principal's correct ones."""

LIBRDKAFKA_REASON = {
    "wrong-password": INVALID_CREDENTIALS,
    "unknown-user": INVALID_CREDENTIALS,
    "wrong-mechanism": "SASL SCRAM-SHA-512 mechanism handshake failed: Broker: Unsupported "
    f"SASL mechanism: broker's supported mechanisms: {MECHANISM}",
}
"""The broker's reason as librdkafka's error_cb reports it (``rd_kafka_broker_fail``
with ``_AUTHENTICATION``: "SASL authentication error: <the broker's message>", or the
SaslHandshake's error and the broker's mechanisms)."""

COORDINATOR_REASON = {
    "wrong-password": INVALID_CREDENTIALS,
    "unknown-user": INVALID_CREDENTIALS,
    "wrong-mechanism": f"does not offer SASL mechanism SCRAM-SHA-512 (enabled: {MECHANISM})",
}
"""The broker's reason in the coordinator client's ``SaslAuthenticationError``."""

SETTINGS_TO_FIX = ("sasl.username", "sasl.password", "sasl.mechanism")


def _refused(p: Principal, txn_id: str, case: str) -> dict[str, Any]:
    """``p``'s two-phase configuration with the setting of ``case`` made wrong."""
    return {**p.config(txn_id), **REFUSED_LOGINS[case]}


def _plaintext(p: Principal, txn_id: str) -> dict[str, Any]:
    """``p``'s two-phase configuration without SASL: a client that does not log in."""
    config = {**p.config(txn_id), "security.protocol": "PLAINTEXT"}
    for key in ("sasl.mechanism", "sasl.username", "sasl.password"):
        del config[key]
    return config


_RECOVER = """
import json, sys, time
from kafka_txn import PreparedTxnState, TransactionalProducer

job = json.load(sys.stdin)
producer = TransactionalProducer(job["config"], operation_timeout=job["timeout"])
started = time.monotonic()
try:
    producer.init_transactions(keep_prepared_txn=True)
    outcome = producer.complete_transaction(PreparedTxnState(job["stored"]))
    result = {"outcome": outcome.value}
except Exception as exc:
    err = getattr(exc, "kafka_error", None)
    result = {
        "error": type(exc).__name__,
        "code": None if err is None else err.name(),
        "message": str(exc),
        "state": producer.state,
    }
result["seconds"] = time.monotonic() - started
producer.close(timeout=5)
print(json.dumps(result))
"""


def recover(config: dict[str, Any], stored: str, timeout: float = 20.0) -> dict[str, Any]:
    """A new process's recovery of ``stored`` with ``operation_timeout=timeout``:
    ``{"outcome": ...}`` or ``{"error": class name, "code", "message", "state"}``, and
    ``"seconds"`` the recovery took (init_transactions(keep_prepared_txn=True) and
    complete_transaction())."""
    done = subprocess.run(
        [sys.executable, "-c", _RECOVER],
        input=json.dumps({"config": config, "stored": stored, "timeout": timeout}),
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"recovery process failed:\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def kafka_txn(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The ``kafka-txn`` console script, as ``python -m kafka_txn.cli``."""
    return subprocess.run(
        [sys.executable, "-m", "kafka_txn.cli", *argv],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _x(config: dict[str, Any]) -> list[str]:
    """``config``'s connection settings as ``-X key=value`` arguments."""
    keys = ("security.protocol", "sasl.mechanism", "sasl.username", "sasl.password")
    return [arg for k in keys if k in config for arg in ("-X", f"{k}={config[k]}")]


# ---------------------------------------------------------------------- recovery
@pytest.mark.parametrize("decision", ["commit", "abort"])
@pytest.mark.parametrize("case", list(REFUSED_LOGINS))
def test_recovery_with_a_refused_login_is_a_fatal_error_at_once_and_settles_nothing(
    kafka: acls.SecuredKafka,
    principal: Principal,
    topic: str,
    txn_id: str,
    case: str,
    decision: str,
) -> None:
    """The doc's row "the broker refuses our ... credentials": a ``FatalError``
    (``_AUTHENTICATION``) with the broker's reason and the settings to fix, well within
    ``operation_timeout``, and the prepared transaction still open as it was. Recovery
    first reads the cluster id through librdkafka (``ClusterId.require``), which
    hears of the refusal only through error_cb; an abort decision (the stored state
    ``""``) does too, before the init that would abort. The producer stays recovering.
    With the right settings, a fresh process then settles the transaction as decided."""
    principal.grant(*documented(principal, topic, txn_id))
    stored = prepare_and_crash(principal.config(txn_id), topic, b"prepared")
    decided = str(stored) if decision == "commit" else ""

    refused = recover(_refused(principal, txn_id, case), decided, timeout=20.0)

    assert refused["error"] == "FatalError", refused
    assert refused["code"] == "_AUTHENTICATION", refused
    assert LIBRDKAFKA_REASON[case] in refused["message"], refused
    assert all(key in refused["message"] for key in SETTINGS_TO_FIX), refused
    assert refused["state"] == "recovering", refused
    assert refused["seconds"] < 15, refused  # not the 20 s of operation_timeout
    assert_still_prepared(kafka, topic, stored)

    settled = recover(principal.config(txn_id), decided)

    if decision == "commit":
        assert settled["outcome"] == TransactionOutcome.COMMITTED.value, settled
        assert read(kafka, topic, expected=1) == [b"prepared"]
    else:
        assert settled["outcome"] == TransactionOutcome.NOTHING_TO_COMMIT.value, settled
        assert_aborted(kafka, topic, written=1)


@pytest.mark.parametrize("decision", ["commit", "abort"])
def test_recovery_by_a_client_that_does_not_log_in_is_retried_until_the_deadline(
    kafka: acls.SecuredKafka, principal: Principal, topic: str, txn_id: str, decision: str
) -> None:
    """The doc's row for a PLAINTEXT client at a SASL listener: the broker answers
    ApiVersions and drops every other request, which librdkafka's Metadata and the
    coordinator client cannot tell from a broker dropping connections. Recovery retries
    until ``operation_timeout`` and raises ``TransactionOutcomeUnknownError``, nothing
    settled; a stored state that names its cluster gets a message that asks whether
    security.protocol matches the listener. The empty state needs no broker to decide
    (nothing to commit), so its init waits out a second deadline."""
    principal.grant(*documented(principal, topic, txn_id))
    stored = prepare_and_crash(principal.config(txn_id), topic, b"prepared")
    decided = str(stored) if decision == "commit" else ""
    deadline = 3.0

    unknown = recover(_plaintext(principal, txn_id), decided, timeout=deadline)

    assert unknown["error"] == "TransactionOutcomeUnknownError", unknown
    assert unknown["state"] == "recovering", unknown
    if decision == "commit":
        assert "the id of the Kafka cluster could not be read" in unknown["message"], unknown
        assert "security.protocol" in unknown["message"], unknown
        assert deadline - 0.5 <= unknown["seconds"] < deadline + 30, unknown
    else:
        assert "init_transactions() did not complete" in unknown["message"], unknown
        assert 2 * deadline - 0.5 <= unknown["seconds"] < 2 * deadline + 30, unknown
    assert_still_prepared(kafka, topic, stored)


def test_recovery_reads_the_cluster_id_of_a_broker_slower_than_a_slice(
    kafka: acls.SecuredKafka, principal: Principal, topic: str, txn_id: str
) -> None:
    """Recovery reads the cluster id in slices only while no broker is usable (the time
    a refused login takes to be reported); a broker that is up and answers Metadata later
    than a slice (1.5 s here, through a proxy: a broker answers a connection's requests
    in turn, so each answer given up on delays the next) still has its answer read, and
    the transaction is committed."""
    principal.grant(*documented(principal, topic, txn_id))
    stored = prepare_and_crash(principal.config(txn_id), topic, b"prepared")
    with KafkaProxy(kafka.bootstrap_servers) as proxy:
        proxy.delay(ApiKey.METADATA, 1500)
        config = {**principal.config(txn_id), "bootstrap.servers": proxy.bootstrap_servers}
        settled = recover(config, str(stored))
    assert settled["outcome"] == TransactionOutcome.COMMITTED.value, settled
    assert read(kafka, topic, expected=1) == [b"prepared"]


# ---------------------------------------------------------------------- the coordinator client
@pytest.mark.parametrize("case", list(REFUSED_LOGINS))
def test_the_coordinator_client_is_refused_at_once_with_the_brokers_reason(
    principal: Principal, txn_id: str, case: str
) -> None:
    """The coordinator client (prepare's DescribeTransactions, recovery's EndTxn,
    ``kafka-txn``) raises ``SaslAuthenticationError`` at its first login, not retried,
    with the broker's reason; ``twophase.coordinator_failure`` makes it the same
    ``FatalError`` (``_AUTHENTICATION``, the settings to fix) while preparing and while
    recovering."""
    settings = ConnectionSettings.from_librdkafka(_refused(principal, txn_id, case))
    started = time.monotonic()
    with (
        pytest.raises(SaslAuthenticationError) as info,
        CoordinatorClient(settings, txn_id, deadline_s=20) as client,
    ):
        client.describe()
    assert time.monotonic() - started < 5
    assert COORDINATOR_REASON[case] in str(info.value)
    for recovering in (False, True):
        failure = coordinator_failure(
            info.value, "complete_transaction", recovering=recovering, deadline_s=20
        )
        assert isinstance(failure, FatalError)
        assert failure.kafka_error.code() == KafkaError._AUTHENTICATION
        assert COORDINATOR_REASON[case] in str(failure)
        assert all(key in str(failure) for key in SETTINGS_TO_FIX)


def test_the_coordinator_client_that_does_not_log_in_asks_about_security_protocol(
    principal: Principal, txn_id: str
) -> None:
    """A PLAINTEXT coordinator client at the SASL listener: ApiVersions answered, the
    connection closed at FindCoordinator, retried until the deadline; the error says that
    this is what a SASL listener does and which settings to set."""
    settings = ConnectionSettings.from_librdkafka(_plaintext(principal, txn_id))
    started = time.monotonic()
    with (
        pytest.raises(ProtocolError) as info,
        CoordinatorClient(settings, txn_id, deadline_s=2) as client,
    ):
        client.describe()
    assert time.monotonic() - started >= 2
    assert not isinstance(info.value, SaslAuthenticationError)
    message = str(info.value)
    assert "answered ApiVersions and then dropped the next request" in message, message
    assert "security.protocol=SASL_PLAINTEXT or SASL_SSL (not PLAINTEXT)" in message, message
    failure = coordinator_failure(info.value, "complete_transaction", recovering=True, deadline_s=2)
    assert isinstance(failure, TransactionOutcomeUnknownError)


# ---------------------------------------------------------------------- kafka-txn
@pytest.mark.parametrize("case", list(REFUSED_LOGINS))
def test_kafka_txn_describe_and_recover_name_the_refused_login(
    kafka: acls.SecuredKafka,
    principal: Principal,
    topic: str,
    txn_id: str,
    case: str,
    tmp_path: Path,
) -> None:
    """``kafka-txn describe`` and ``recover`` ask the coordinator client first: a refused
    login is exit code 1 at once, one line with the broker's reason and the ``-X``
    settings to fix; recover settles nothing (its state row holds a prepared
    transaction), and with the right settings it commits."""
    principal.grant(*documented(principal, topic, txn_id))
    jdbc_url = f"jdbc:sqlite:{tmp_path}/state.db"
    writer = DualWriter(principal.config(txn_id), jdbc_url)  # the state table and row
    writer.start()
    writer.close()
    stored = prepare_and_crash(principal.config(txn_id), topic, b"prepared")
    engine = create_engine(jdbc_to_sqlalchemy(jdbc_url))
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE kafka_transaction_state SET prepared_txn_state = :s "
                "WHERE transactional_id = :t"
            ),
            {"s": str(stored), "t": txn_id},
        )
    engine.dispose()
    common = ["--bootstrap-servers", kafka.bootstrap_servers, "--transactional-id", txn_id]
    refused = _x(_refused(principal, txn_id, case))

    for command in (["describe"], ["recover", "--jdbc-url", jdbc_url, "--yes"]):
        started = time.monotonic()
        done = kafka_txn(*command, *common, *refused, "--timeout", "20")
        assert time.monotonic() - started < 10, done.stderr
        assert done.returncode == 1, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert f"the broker at {kafka.bootstrap_servers} refused to authenticate" in line
        assert COORDINATOR_REASON[case] in line, line
        assert "check -X sasl.username, sasl.password and sasl.mechanism" in line, line
    assert_still_prepared(kafka, topic, stored)

    done = kafka_txn(
        "recover", "--jdbc-url", jdbc_url, "--yes", *common, *_x(principal.config(txn_id))
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{txn_id}: committed"
    assert read(kafka, topic, expected=1) == [b"prepared"]


def test_kafka_txn_describe_without_sasl_at_the_sasl_listener_names_security_protocol(
    kafka: acls.SecuredKafka, principal: Principal, txn_id: str
) -> None:
    """A ``kafka-txn describe`` without SASL at the SASL listener: retried until
    ``--timeout``, then one line saying what the broker did and that security.protocol
    and sasl.mechanism are to be set."""
    done = kafka_txn(
        "describe", "--bootstrap-servers", kafka.bootstrap_servers,
        "--transactional-id", txn_id, "--timeout", "2",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"no usable answer from a Kafka broker at {kafka.bootstrap_servers} within 2s" in line
    assert "as a SASL listener does to a client that does not log in" in line, line


# ---------------------------------------------------------------------- the table
@pytest.mark.parametrize("name", ["_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED"])
def test_a_refused_login_is_fatal_and_names_the_settings_to_fix(name: str) -> None:
    """``classification``: librdkafka's ``_AUTHENTICATION`` (how it reports every refused
    login) and the broker's SASL_AUTHENTICATION_FAILED are fatal, and their advice names
    the settings to fix; no broker needed."""
    code = getattr(KafkaError, name)
    assert code in AUTHENTICATION_CODES
    err = KafkaError(code, "SASL authentication error: Authentication failed")
    exc = exception_for(err, "complete_transaction")
    assert isinstance(exc, FatalError)
    assert exc.kafka_error.code() == code
    message = str(exc)
    assert "SASL authentication error: Authentication failed" in message
    assert all(key in message for key in SETTINGS_TO_FIX), message
