"""Two-phase commit under Apache Kafka's ACLs: the grants docs/guide/two-phase-commit.md lists
("ACLs") are enough, and each one missing gives the error it documents, with nothing
committed and nothing lost.

The module starts one Apache Kafka 4.4.0 (``tests/support/apache_kafka.py``) with KRaft's
``StandardAuthorizer`` (``allow.everyone.if.no.acl.found=false``) and SASL/SCRAM-SHA-256
on its client listener, which is also the inter-broker listener; the controller
listener stays PLAINTEXT on loopback. Each test gets a principal of its own (a SCRAM user
made by the super user ``admin``), a topic and a transactional id of its own, and grants
that principal exactly what the test names (``AdminClient.create_acls``, as ``admin``).

A prepared transaction is left open by closing its producer, as a crash leaves it, and
is recovered by a fresh process (``python -c``, its state handed over as text), which
has nothing in memory of the transaction. What became of it is checked as ``admin`` by
independent clients: kafka-python's read_committed consumer for the records, and the
coordinator's DescribeTransactions for the transaction itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from kafka_txn import (
    FatalError,
    PreparedTxnState,
    ProduceFailedException,
    TransactionalProducer,
    TransactionOutcome,
)
from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from kafka_txn.coordinator.client import CoordinatorError, TransactionDescription
from kafka_txn.twophase.failures import coordinator_failure
from tests.support.apache_kafka import ROOT, ApacheKafka, require_java_and_maven

SUPER_USER = "admin"
SUPER_PASSWORD = "admin-secret"
MECHANISM = "SCRAM-SHA-256"
_JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    f'username="{SUPER_USER}" password="{SUPER_PASSWORD}";'
)
TXN_TIMEOUT_MS = 120_000
"""Longer than any test: no prepared transaction is aborted by its timeout here."""


class SecuredKafka(ApacheKafka):
    """Apache Kafka with ``StandardAuthorizer`` and SASL/SCRAM-SHA-256 on the client
    (and inter-broker) listener. ``admin`` is created at format time and is a super user.

    ``User:ANONYMOUS`` is a super user too: it is the principal of the PLAINTEXT
    controller listener, on which the broker registers with the controller
    (ControllerRegistration, BrokerRegistration, BrokerHeartbeat need CLUSTER_ACTION,
    ``ControllerApis``); without it the broker never finishes starting. No client can be
    ANONYMOUS: the only listener clients reach authenticates with SCRAM."""

    def __init__(self) -> None:
        super().__init__(
            listener_protocol="SASL_PLAINTEXT",
            properties={
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": f"User:{SUPER_USER};User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "false",
                "sasl.enabled.mechanisms": MECHANISM,
                "sasl.mechanism.inter.broker.protocol": MECHANISM,
                f"listener.name.plaintext.{MECHANISM.lower()}.sasl.jaas.config": _JAAS,
            },
            format_args=[
                "--add-scram",
                f"{MECHANISM}=[name={SUPER_USER},password={SUPER_PASSWORD}]",
            ],
        )

    def client_config(self, user: str, password: str) -> dict[str, Any]:
        """librdkafka's (and the coordinator client's) settings to connect as ``user``."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": MECHANISM,
            "sasl.username": user,
            "sasl.password": password,
        }

    def admin_config(self) -> dict[str, Any]:
        return self.client_config(SUPER_USER, SUPER_PASSWORD)


# ---------------------------------------------------------------------- the broker
@pytest.fixture(scope="module")
def kafka() -> Iterator[SecuredKafka]:
    require_java_and_maven()
    started = SecuredKafka()
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def admin(kafka: SecuredKafka) -> AdminClient:
    return AdminClient({**kafka.admin_config(), "log_level": 0})


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def topic(admin: AdminClient) -> str:
    name = _unique("acl-topic")
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
    return name


@pytest.fixture
def txn_id() -> str:
    return _unique("acl-txn")


# ---------------------------------------------------------------------- principals and ACLs
_BINDING_FIELDS = (
    "restype", "name", "resource_pattern_type", "principal", "host", "operation",
    "permission_type",
)  # fmt: skip


@dataclass
class Principal:
    """A SCRAM user with no ACLs but those a test grants it."""

    kafka: SecuredKafka
    admin: AdminClient
    user: str
    password: str

    @property
    def name(self) -> str:
        return f"User:{self.user}"

    def config(self, txn_id: str) -> dict[str, Any]:
        """A two-phase producer's configuration, connecting as this principal."""
        return {
            **self.kafka.client_config(self.user, self.password),
            "transactional.id": txn_id,
            "transaction.two.phase.commit.enable": True,
            "transaction.timeout.ms": TXN_TIMEOUT_MS,
        }

    def allow(self, resource: ResourceType, name: str, operation: AclOperation) -> AclBinding:
        return self._binding(resource, name, operation, AclPermissionType.ALLOW)

    def deny(self, resource: ResourceType, name: str, operation: AclOperation) -> AclBinding:
        return self._binding(resource, name, operation, AclPermissionType.DENY)

    def _binding(
        self,
        resource: ResourceType,
        name: str,
        operation: AclOperation,
        permission: AclPermissionType,
    ) -> AclBinding:
        return AclBinding(
            resource, name, ResourcePatternType.LITERAL, self.name, "*", operation, permission
        )

    def grant(self, *bindings: AclBinding) -> None:
        """Create the ACLs and wait until the broker's authorizer holds them."""
        for future in self.admin.create_acls(list(bindings)).values():
            future.result(timeout=30)
        self._await(bindings, present=True)

    def revoke(self, *bindings: AclBinding) -> None:
        """Delete the ACLs and wait until the broker's authorizer no longer holds them."""
        filters = [
            AclBindingFilter(*(getattr(b, field) for field in _BINDING_FIELDS)) for b in bindings
        ]
        for future in self.admin.delete_acls(filters).values():
            future.result(timeout=30)
        self._await(bindings, present=False)

    def acls(self) -> set[AclBinding]:
        """Every ACL of this principal, as the broker's authorizer holds them (KRaft's
        DescribeAcls is answered from the broker's own ``StandardAuthorizer``)."""
        everything = AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, self.name, None,
            AclOperation.ANY, AclPermissionType.ANY,
        )  # fmt: skip
        return set(self.admin.describe_acls(everything).result(timeout=30))

    def _await(self, bindings: Iterable[AclBinding], *, present: bool) -> None:
        wanted = set(bindings)
        deadline = time.monotonic() + 20
        while True:
            held = self.acls()
            if (wanted <= held) if present else not (wanted & held):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the ACLs {wanted} are still {'not ' * present}held")
            time.sleep(0.05)


@pytest.fixture
def principal(kafka: SecuredKafka, admin: AdminClient) -> Principal:
    """A new SCRAM-SHA-256 user, usable once the broker authenticates it."""
    user, password = _unique("writer"), uuid.uuid4().hex
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), password.encode()
    )
    admin.alter_user_scram_credentials([upsert])[user].result(timeout=30)
    probe = AdminClient({**kafka.client_config(user, password), "log_level": 0})
    deadline = time.monotonic() + 20
    while True:
        try:
            probe.list_topics(timeout=1)  # Metadata needs no ACL: authentication alone
            break
        except KafkaException:
            if time.monotonic() > deadline:
                raise
    return Principal(kafka, admin, user, password)


def documented(p: Principal, topic: str, txn_id: str) -> list[AclBinding]:
    """The grants docs/guide/two-phase-commit.md lists for a two-phase producer: WRITE on its
    topic, WRITE and DESCRIBE on its transactional id."""
    return [
        p.allow(ResourceType.TOPIC, topic, AclOperation.WRITE),
        p.allow(ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.WRITE),
        p.allow(ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.DESCRIBE),
    ]


# ---------------------------------------------------------------------- what Kafka shows
def describe(kafka: SecuredKafka, txn_id: str) -> TransactionDescription:
    """The coordinator's DescribeTransactions of ``txn_id``, asked as the super user."""
    settings = ConnectionSettings.from_librdkafka(kafka.admin_config())
    with CoordinatorClient(settings, txn_id, deadline_s=20) as client:
        return client.describe()


def _consumer(kafka: SecuredKafka, isolation: str) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=MECHANISM,
        sasl_plain_username=SUPER_USER,
        sasl_plain_password=SUPER_PASSWORD,
        isolation_level=isolation,
        enable_auto_commit=False,
        group_id=None,
    )


def offsets(kafka: SecuredKafka, topic: str) -> tuple[int, int]:
    """Partition 0's (last stable offset, high watermark): equal once every transaction
    that wrote there has ended, the LSO below while one is still open."""
    from kafka import TopicPartition as Tp

    ends = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = _consumer(kafka, isolation)
        try:
            ends.append(consumer.end_offsets([Tp(topic, 0)])[Tp(topic, 0)])
        finally:
            consumer.close()
    return ends[0], ends[1]


def read(
    kafka: SecuredKafka,
    topic: str,
    *,
    expected: int = 0,
    isolation: str = "read_committed",
    timeout: float = 15.0,
    linger: float = 0.5,
) -> list[bytes]:
    """The values of partition 0 a consumer of ``isolation`` sees, read from the
    beginning up to its end offset (the LSO under read_committed), waiting up to
    ``timeout`` for ``expected`` values, then ``linger`` more to catch any extra one.
    (A committed transaction's markers are written just after its EndTxn is answered.)"""
    from kafka import TopicPartition as Tp

    tp = Tp(topic, 0)
    consumer = _consumer(kafka, isolation)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        seen: list[bytes] = []
        deadline = time.monotonic() + timeout
        lingered: float | None = None
        while True:
            end = consumer.end_offsets([tp])[tp]
            while consumer.position(tp) < end:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{topic}: could not read to offset {end}")
                for records in consumer.poll(timeout_ms=100).values():
                    seen.extend(r.value for r in records)
            now = time.monotonic()
            if lingered is None and (len(seen) >= expected or now > deadline):
                lingered = now + linger
            if lingered is not None and now > lingered:
                return seen
            time.sleep(0.05)
    finally:
        consumer.close()


def assert_still_prepared(kafka: SecuredKafka, topic: str, stored: PreparedTxnState) -> None:
    """Nothing committed, nothing aborted: the coordinator still holds ``stored`` open
    (same producer id, epoch and start time) and read_committed sees none of it, while
    its records are in the log."""
    seen = describe(kafka, stored.transactional_id or "")
    assert (seen.state, seen.producer_id, seen.producer_epoch, seen.start_time_ms) == (
        "Ongoing", stored.producer_id, stored.producer_epoch, stored.txn_start_ms
    )  # fmt: skip
    assert read(kafka, topic) == []
    lso, high = offsets(kafka, topic)
    assert lso < high


def assert_aborted(kafka: SecuredKafka, topic: str, written: int) -> None:
    """The ``written`` records are in the log and the transaction that wrote them ended
    without making any of them visible."""
    assert read(kafka, topic) == []
    assert len(read(kafka, topic, isolation="read_uncommitted", expected=written)) == written
    lso, high = offsets(kafka, topic)
    assert lso == high


# ---------------------------------------------------------------------- the producers
def prepare_and_crash(config: dict[str, Any], topic: str, *values: bytes) -> PreparedTxnState:
    """Prepare a transaction of ``values`` and close the producer, leaving it prepared
    as a crash would; its state, as the decider stores it."""
    producer = TransactionalProducer(config, operation_timeout=20)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value, partition=0)
        return producer.prepare_transaction()
    finally:
        producer.close(timeout=5)


_RECOVER = """
import json, sys
from kafka_txn import PreparedTxnState, TransactionalProducer

job = json.load(sys.stdin)
producer = TransactionalProducer(job["config"], operation_timeout=20)
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
finally:
    producer.close(timeout=5)
print(json.dumps(result))
"""


def recover_in_fresh_process(config: dict[str, Any], stored: str) -> dict[str, Any]:
    """A new process's recovery of the ``stored`` state text:
    ``init_transactions(keep_prepared_txn=True)`` then ``complete_transaction(stored)``.
    ``{"outcome": ...}``, or ``{"error": class name, "code": ..., "message": ...,
    "state": ...}``."""
    done = subprocess.run(
        [sys.executable, "-c", _RECOVER],
        input=json.dumps({"config": config, "stored": stored}),
        capture_output=True, text=True, timeout=90, cwd=ROOT, check=False,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"recovery process failed:\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# ---------------------------------------------------------------------- the tests
@pytest.mark.parametrize("grants", ["documented", "write-only"])
def test_a_principal_with_the_documented_grants_prepares_and_a_fresh_process_commits(
    kafka: SecuredKafka, principal: Principal, topic: str, txn_id: str, grants: str
) -> None:
    """The documented grants are all a two-phase producer and its recovery need:
    FindCoordinator (DESCRIBE on the id, ``KafkaApis.getCoordinator``), InitProducerId,
    AddPartitionsToTxn and Produce (WRITE on the id and the topic,
    ``handleInitProducerIdRequest``, ``handleAddPartitionsToTxnRequest``,
    ``handleProduceRequest``), DescribeTransactions (DESCRIBE on the id,
    ``handleDescribeTransactionsRequest``) and EndTxn (WRITE on the id,
    ``handleEndTxnRequest``); no cluster permission. ``write-only`` leaves DESCRIBE out:
    ``StandardAuthorizerData.findResult`` lets an ALLOW of WRITE imply DESCRIBE
    (``IMPLIES_DESCRIBE``), as the doc says."""
    acls = documented(principal, topic, txn_id)
    if grants == "write-only":
        acls = [a for a in acls if a.operation != AclOperation.DESCRIBE]
    principal.grant(*acls)
    assert principal.acls() == set(acls)  # exactly these, nothing else
    stored = prepare_and_crash(principal.config(txn_id), topic, b"one", b"two")
    assert_still_prepared(kafka, topic, stored)

    result = recover_in_fresh_process(principal.config(txn_id), str(stored))

    assert result == {"outcome": TransactionOutcome.COMMITTED.value}
    assert read(kafka, topic, expected=2) == [b"one", b"two"]
    lso, high = offsets(kafka, topic)
    assert lso == high


def test_a_fresh_process_whose_database_holds_no_state_aborts_the_prepared_transaction(
    kafka: SecuredKafka, principal: Principal, topic: str, txn_id: str
) -> None:
    """The decider rolled back (it holds ``""``): recovery has nothing to commit and the
    init after it aborts what is open (InitProducerId: WRITE on the id,
    ``KafkaApis.handleInitProducerIdRequest``; the coordinator then writes the abort
    markers itself)."""
    principal.grant(*documented(principal, topic, txn_id))
    prepare_and_crash(principal.config(txn_id), topic, b"rolled-back")

    result = recover_in_fresh_process(principal.config(txn_id), "")

    assert result == {"outcome": TransactionOutcome.NOTHING_TO_COMMIT.value}
    assert_aborted(kafka, topic, written=1)


def test_a_prepared_producer_told_the_empty_state_aborts(
    kafka: SecuredKafka, principal: Principal, topic: str, txn_id: str
) -> None:
    """``complete_transaction("")`` on the prepared producer itself aborts through
    librdkafka (EndTxn(abort): WRITE on the id, ``KafkaApis.handleEndTxnRequest``)."""
    principal.grant(*documented(principal, topic, txn_id))
    producer = TransactionalProducer(principal.config(txn_id), operation_timeout=20)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(topic, b"decided-abort", partition=0)
        producer.prepare_transaction()
        assert producer.complete_transaction(PreparedTxnState("")) is TransactionOutcome.ABORTED
    finally:
        producer.close(timeout=5)
    assert_aborted(kafka, topic, written=1)


# What each grant's absence looks like. DESCRIBE on the id is taken away with a DENY:
# a missing ALLOW of DESCRIBE changes nothing while WRITE is granted (IMPLIES_DESCRIBE).
MISSING = {
    "topic-WRITE": (ResourceType.TOPIC, AclOperation.WRITE, "remove"),
    "transactional-id-WRITE": (ResourceType.TRANSACTIONAL_ID, AclOperation.WRITE, "remove"),
    "transactional-id-DESCRIBE": (ResourceType.TRANSACTIONAL_ID, AclOperation.DESCRIBE, "deny"),
}


def _without(
    p: Principal, topic: str, txn_id: str, missing: str
) -> tuple[list[AclBinding], Callable[[], None], Callable[[], None]]:
    """(the documented grants but ``missing``, a function that takes ``missing`` away
    from a principal holding them all, one that gives it back)."""
    resource, operation, how = MISSING[missing]
    name = topic if resource == ResourceType.TOPIC else txn_id
    if how == "deny":
        denied = p.deny(resource, name, operation)
        held = documented(p, topic, txn_id)
        return held, partial(p.grant, denied), partial(p.revoke, denied)
    allowed = p.allow(resource, name, operation)
    held = [a for a in documented(p, topic, txn_id) if a != allowed]
    return held, partial(p.revoke, allowed), partial(p.grant, allowed)


@pytest.mark.parametrize("missing", list(MISSING))
def test_a_producer_missing_a_grant_prepares_nothing(
    kafka: SecuredKafka, principal: Principal, topic: str, txn_id: str, missing: str
) -> None:
    """Each documented grant missing: a ``FatalError`` with the broker's code, and no
    transaction left that anything could commit. WRITE on the id: InitProducerId is
    refused (``KafkaApis.handleInitProducerIdRequest``); DESCRIBE on the id:
    FindCoordinator is refused (``KafkaApis.getCoordinator``), both at
    ``init_transactions()``; WRITE on the topic: AddPartitionsToTxn and Produce refuse it
    (``handleAddPartitionsToTxnRequest``, ``handleProduceRequest``), so the record fails
    and ``prepare_transaction()`` raises, naming the topic in its cause. Once granted,
    the same transactional id prepares and commits."""
    held, take_away, give_back = _without(principal, topic, txn_id, missing)
    principal.grant(*held)
    if MISSING[missing][2] == "deny":
        take_away()
    producer = TransactionalProducer(principal.config(txn_id), operation_timeout=20)
    steps = {
        "init_transactions": producer.init_transactions,
        "begin_transaction": producer.begin_transaction,
        "produce": partial(producer.produce, topic, b"refused", partition=0),
        "prepare_transaction": producer.prepare_transaction,
    }
    called: list[str] = []
    try:
        with pytest.raises(FatalError) as info:
            for name, step in steps.items():
                called.append(name)
                step()
        assert producer.state == "fatal error"
    finally:
        producer.close(timeout=5)
    raised_by = called[-1]

    err = info.value.kafka_error
    if missing == "topic-WRITE":
        assert raised_by == "prepare_transaction"
        assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        cause = info.value.__cause__
        assert isinstance(cause, ProduceFailedException) and cause.topic == topic
    else:
        assert raised_by == "init_transactions"
        assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in str(info.value)
    assert read(kafka, topic) == []
    lso, high = offsets(kafka, topic)
    assert lso == high  # nothing left open

    give_back()
    stored = prepare_and_crash(principal.config(txn_id), topic, b"granted")
    assert recover_in_fresh_process(principal.config(txn_id), str(stored)) == {
        "outcome": TransactionOutcome.COMMITTED.value
    }
    assert read(kafka, topic, expected=1) == [b"granted"]


@pytest.mark.parametrize("decision", ["commit", "abort"])
@pytest.mark.parametrize("missing", ["transactional-id-WRITE", "transactional-id-DESCRIBE"])
def test_recovery_missing_a_grant_settles_nothing_and_succeeds_once_granted(
    kafka: SecuredKafka,
    principal: Principal,
    topic: str,
    txn_id: str,
    missing: str,
    decision: str,
) -> None:
    """A fresh process recovering without WRITE on the id, or with DESCRIBE on it
    denied: a ``FatalError`` (TRANSACTIONAL_ID_AUTHORIZATION_FAILED) that names the
    grants; the prepared transaction stays open under its identity, nothing of it
    visible; a recovery once granted settles it as decided. Commit: recovery's EndTxn
    needs WRITE (``KafkaApis.handleEndTxnRequest``), its FindCoordinator and
    DescribeTransactions DESCRIBE (``getCoordinator``, ``handleDescribeTransactionsRequest``),
    and the coordinator client's error says which request was refused. Abort (the
    decider holds ``""``): the init after recovery is refused by librdkafka's
    FindCoordinator or InitProducerId (``handleInitProducerIdRequest``)."""
    _, take_away, give_back = _without(principal, topic, txn_id, missing)
    principal.grant(*documented(principal, topic, txn_id))
    stored = prepare_and_crash(principal.config(txn_id), topic, b"prepared")
    take_away()
    decided = str(stored) if decision == "commit" else ""

    refused = recover_in_fresh_process(principal.config(txn_id), decided)

    assert refused["error"] == "FatalError", refused
    assert refused["code"] == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", refused
    if decision == "commit":
        assert "grant WRITE and DESCRIBE" in refused["message"], refused
        request = "EndTxn" if missing == "transactional-id-WRITE" else "FindCoordinator"
        assert request in refused["message"], refused
        assert refused["state"] == "recovering", refused  # it may recover again
    assert_still_prepared(kafka, topic, stored)

    give_back()
    settled = recover_in_fresh_process(principal.config(txn_id), decided)

    if decision == "commit":
        assert settled == {"outcome": TransactionOutcome.COMMITTED.value}
        assert read(kafka, topic, expected=1) == [b"prepared"]
    else:
        assert settled == {"outcome": TransactionOutcome.NOTHING_TO_COMMIT.value}
        assert_aborted(kafka, topic, written=1)


def test_a_recovery_refused_for_want_of_a_grant_can_run_again_on_the_same_producer(
    kafka: SecuredKafka, principal: Principal, topic: str, txn_id: str
) -> None:
    """The doc's "if recovery raises, it committed nothing and the producer may recover
    again": the FatalError of a refused EndTxn leaves the fresh producer recovering, and
    its next ``complete_transaction()``, once WRITE is granted, commits."""
    acls = documented(principal, topic, txn_id)
    principal.grant(*acls)
    stored = prepare_and_crash(principal.config(txn_id), topic, b"retried")
    write_on_id = acls[1]
    principal.revoke(write_on_id)
    fresh = TransactionalProducer(principal.config(txn_id), operation_timeout=20)
    try:
        fresh.init_transactions(keep_prepared_txn=True)
        with pytest.raises(FatalError, match="EndTxn"):
            fresh.complete_transaction(stored)
        assert fresh.state == "recovering"
        assert_still_prepared(kafka, topic, stored)
        principal.grant(write_on_id)
        assert fresh.complete_transaction(stored) is TransactionOutcome.COMMITTED
    finally:
        fresh.close(timeout=5)
    assert read(kafka, topic, expected=1) == [b"retried"]


@pytest.mark.parametrize("decision", ["commit", "abort"])
def test_recovery_needs_no_grant_on_the_topic(
    kafka: SecuredKafka, principal: Principal, topic: str, txn_id: str, decision: str
) -> None:
    """Recovery sends no record: EndTxn and InitProducerId check only the transactional
    id (``KafkaApis.handleEndTxnRequest``, ``handleInitProducerIdRequest``), and the
    coordinator writes the markers as the broker. So a recovering process settles the
    transaction after WRITE on the topic is revoked."""
    acls = documented(principal, topic, txn_id)
    principal.grant(*acls)
    stored = prepare_and_crash(principal.config(txn_id), topic, b"markers")
    principal.revoke(acls[0])

    decided = str(stored) if decision == "commit" else ""
    result = recover_in_fresh_process(principal.config(txn_id), decided)

    if decision == "commit":
        assert result == {"outcome": TransactionOutcome.COMMITTED.value}
        assert read(kafka, topic, expected=1) == [b"markers"]
    else:
        assert result == {"outcome": TransactionOutcome.NOTHING_TO_COMMIT.value}
        assert_aborted(kafka, topic, written=1)


@pytest.mark.parametrize("refused", ["FindCoordinator", "DescribeTransactions"])
def test_describe_denied_during_a_transaction_fails_its_prepare_and_close_aborts_it(
    kafka: SecuredKafka, principal: Principal, topic: str, txn_id: str, refused: str
) -> None:
    """DESCRIBE on the id denied after ``init_transactions()`` (librdkafka already knows
    its coordinator): prepare's coordinator client is refused, a ``FatalError`` naming
    the refused request and the grants (``twophase.coordinator_failure``), and
    ``close()`` aborts the transaction (EndTxn(abort) needs only WRITE,
    ``KafkaApis.handleEndTxnRequest``). In the first prepare of a producer the client
    first looks up the coordinator (FindCoordinator, ``KafkaApis.getCoordinator``); in a
    later one it asks the coordinator it knows (DescribeTransactions,
    ``handleDescribeTransactionsRequest``)."""
    principal.grant(*documented(principal, topic, txn_id))
    denied = principal.deny(ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.DESCRIBE)
    producer = TransactionalProducer(principal.config(txn_id), operation_timeout=20)
    committed: list[bytes] = []
    try:
        producer.init_transactions()
        if refused == "DescribeTransactions":
            producer.begin_transaction()
            producer.produce(topic, b"first", partition=0)
            producer.complete_transaction(producer.prepare_transaction())
            committed.append(b"first")
        producer.begin_transaction()
        producer.send(topic, b"never-visible", partition=0).result(timeout=20)
        principal.grant(denied)
        with pytest.raises(FatalError, match=f"{refused} refused") as info:
            producer.prepare_transaction()
        assert info.value.kafka_error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert "grant WRITE and DESCRIBE" in str(info.value)
    finally:
        producer.close(timeout=10)
    assert read(kafka, topic, expected=len(committed)) == committed
    written = 1 + len(committed)
    assert len(read(kafka, topic, isolation="read_uncommitted", expected=written)) == written
    lso, high = offsets(kafka, topic)
    assert lso == high


# The grants send_offsets_to_transaction() adds: READ on the group (AddOffsetsToTxn,
# TxnOffsetCommit) and on the topic the offsets are of (TxnOffsetCommit).
OFFSET_GRANTS = {
    "group-READ": (ResourceType.GROUP, KafkaError.GROUP_AUTHORIZATION_FAILED),
    "input-topic-READ": (ResourceType.TOPIC, KafkaError.TOPIC_AUTHORIZATION_FAILED),
}


@pytest.mark.parametrize("missing", [None, *OFFSET_GRANTS])
def test_offsets_in_a_prepared_transaction_need_read_on_the_group_and_input_topic(
    kafka: SecuredKafka,
    admin: AdminClient,
    principal: Principal,
    topic: str,
    txn_id: str,
    missing: str | None,
) -> None:
    """``send_offsets_to_transaction()`` in a two-phase transaction: AddOffsetsToTxn
    needs READ on the group (``KafkaApis.handleAddOffsetsToTxnRequest``), TxnOffsetCommit
    READ on the group and on the offsets' topic (``handleTxnOffsetCommitRequest``). With
    both, a fresh process's recovery commits the offsets with the records; without one,
    a ``FatalError`` with the broker's code, and neither records nor offsets commit."""
    group, source = _unique("acl-group"), _unique("acl-input")
    admin.create_topics([NewTopic(source, 1, 1)])[source].result(timeout=30)
    reads = {
        "group-READ": principal.allow(ResourceType.GROUP, group, AclOperation.READ),
        "input-topic-READ": principal.allow(ResourceType.TOPIC, source, AclOperation.READ),
    }
    principal.grant(
        *documented(principal, topic, txn_id),
        *(acl for name, acl in reads.items() if name != missing),
    )
    client = principal.kafka.client_config(principal.user, principal.password)
    consumer = Consumer({**client, "group.id": group, "log_level": 0})
    producer = TransactionalProducer(principal.config(txn_id), operation_timeout=20)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"output", partition=0).result(timeout=20)
        sent = [TopicPartition(source, 0, 7)]
        if missing is None:
            producer.send_offsets_to_transaction(sent, consumer.consumer_group_metadata())
            stored = producer.prepare_transaction()
        else:
            with pytest.raises(FatalError) as info:
                producer.send_offsets_to_transaction(sent, consumer.consumer_group_metadata())
            assert info.value.kafka_error.code() == OFFSET_GRANTS[missing][1]
    finally:
        producer.close(timeout=10)
        consumer.close()

    if missing is None:
        result = recover_in_fresh_process(principal.config(txn_id), str(stored))
        assert result == {"outcome": TransactionOutcome.COMMITTED.value}
        assert read(kafka, topic, expected=1) == [b"output"]
        listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
        committed = listed[group].result(timeout=30).topic_partitions
        assert [(tp.topic, tp.partition, tp.offset) for tp in committed] == [(source, 0, 7)]
    else:
        assert_aborted(kafka, topic, written=1)
        listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
        committed = listed[group].result(timeout=30).topic_partitions or []
        assert [tp.offset for tp in committed if tp.offset >= 0] == []


@pytest.mark.parametrize("request_name", ["FindCoordinator", "DescribeTransactions", "EndTxn"])
def test_the_coordinator_clients_authorization_error_names_the_refused_request(
    request_name: str,
) -> None:
    """``twophase.coordinator_failure``: TRANSACTIONAL_ID_AUTHORIZATION_FAILED from any
    of the coordinator client's requests is a ``FatalError`` that names the request
    (EndTxn checks WRITE, the other two DESCRIBE) and the grants; no broker needed."""
    refused = CoordinatorError(request_name, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    for recovering in (False, True):
        exc = coordinator_failure(
            refused, "complete_transaction", recovering=recovering, deadline_s=1.0
        )
        assert isinstance(exc, FatalError)
        assert exc.kafka_error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert f"({request_name} refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED)" in str(exc)
        assert "grant WRITE and DESCRIBE" in str(exc)
