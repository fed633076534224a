"""A producer fenced by another instance of its transactional id (a zombie, KIP-98): its
send failing on the fence is reported as ProducerFencedError (guarantee 1.4); an init
whose answer came late says it may already have fenced the running instance; and a
successor initialising while the first producer's applied commit has its answer lost
(1.3/1.4) leaves both instances' records visible once, the zombie sending no abort. On
the real broker, through tests/proxies/kafka_proxy.py where the coordinator must answer
late or with an error; Kafka is read with an independent read_committed consumer
(kafka-python, tests/support/rig.py)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_txn import (
    FatalError,
    ProduceFailedException,
    ProducerFencedError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from tests.proxies.kafka_proxy import ApiKey, KafkaProxy
from tests.support import adversaries as support
from tests.support.adversaries import (
    committed_values,
    successor_initialises_before_the_answer,
    txn_config,
)
from tests.support.rig import Broker

pytestmark = pytest.mark.adversary

proxy = support.proxy


@pytest.mark.parametrize("call", ["flush", "prepare_transaction"])
@pytest.mark.guarantee("1.4")
def test_a_zombie_whose_send_fails_on_fencing_gets_producer_fenced_error(
    broker: Broker, topic: str, producer_config: dict[str, Any], call: str
) -> None:
    """A send after a successor's init fenced the producer, then flush() or prepare:
    ProducerFencedError (fatal), its cause wrapped once, and only the successor's
    transaction visible."""
    config = {**producer_config, "transaction.two.phase.commit.enable": True}
    zombie = TransactionalProducer(config)
    successor: TransactionalProducer | None = None
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.produce(topic, b"before-fencing")
        zombie.flush(10)
        successor = TransactionalProducer(producer_config)
        successor.init_transactions()  # fences the zombie, aborts its transaction
        zombie.send(topic, b"after-fencing")  # a future: a delivery callback
        raised: Exception | None = None
        try:
            if call == "flush":
                zombie.flush(10)
            else:
                zombie.prepare_transaction(timeout=10)
        except Exception as exc:  # checked below
            raised = exc
        state = zombie.state

        # Nothing of the zombie's transaction is visible; the successor commits.
        successor.begin_transaction()
        successor.produce(topic, b"successor")
        successor.commit_transaction()
        assert sorted(v for _, v in broker.read_committed(topic, expected=1)) == [b"successor"]

        # Promised: the zombie gets ProducerFencedError (fatal), a kafka-txn error
        # subclassing KafkaException; never a bare Python error.
        assert isinstance(raised, KafkaException), repr(raised)
        assert isinstance(raised, ProducerFencedError), repr(raised)
        assert state == "fatal error"
        # Wrapping rule: the cause is what brought the root error in, wrapped once:
        # confluent-kafka's KafkaException (_FENCED), or the fenced record's failure
        # (INVALID_PRODUCER_EPOCH) when its delivery report came first.
        cause = raised.__cause__
        assert isinstance(cause, KafkaException), repr(cause)
        if isinstance(cause, ProduceFailedException):
            assert cause.code() == KafkaError.INVALID_PRODUCER_EPOCH, repr(cause)
        else:
            assert type(cause) is KafkaException, repr(cause)
            assert cause.args[0].code() == KafkaError._FENCED, repr(cause)
        assert cause.__cause__ is None, repr(cause.__cause__)
        with pytest.raises(ProducerFencedError):
            zombie.begin_transaction() if call == "flush" else zombie.abort_transaction()
    finally:
        zombie.close()
        if successor is not None:
            successor.close()


def test_an_init_that_timed_out_says_it_may_have_fenced(
    broker: Broker, topic: str, proxy: KafkaProxy, txn_id: str
) -> None:
    """errors.md: the coordinator applied the InitProducerId and only its answer came
    late. The error says the init may already have fenced older instances (it did): the
    running instance's commit is refused as fenced and nothing of it is visible."""
    running = TransactionalProducer(
        txn_config(broker.bootstrap_servers, txn_id), operation_timeout=20
    )
    starting = TransactionalProducer(
        txn_config(proxy.bootstrap_servers, txn_id), operation_timeout=2
    )
    try:
        running.init_transactions()
        running.begin_transaction()
        running.send(topic, b"in-flight", partition=0).result(timeout=10)
        proxy.delay(ApiKey.INIT_PRODUCER_ID, 6000, times=1)  # its answer comes late
        with pytest.raises(TransactionOutcomeUnknownError, match="may already have fenced"):
            starting.init_transactions()
        with pytest.raises(FatalError):  # fenced, as the error warned
            running.commit_transaction()
        assert broker.read_committed(topic, expected=0) == []
    finally:
        starting.close(timeout=5)
        running.close(timeout=5)


def test_unknown_commit_outcome_with_a_successor_initialising_meanwhile_commits_once(
    broker: Broker, txn_id: str
) -> None:
    """1.3/1.4: the coordinator applied EndTxn(commit) and the answer is lost
    (REQUEST_TIMED_OUT); before it reaches the producer, a successor with the same
    transactional id initialises. The first producer's commit raises FatalError (outcome
    unknown, never CommitFailedException); as a zombie it then tries to abort and is
    closed, while the successor's own transaction is open: it sends no EndTxn(abort)
    (the proxy counts one EndTxn in all), the successor's transaction commits, and the
    records of both are visible exactly once; nothing the coordinator committed is
    aborted."""
    topic = broker.create_topic(partitions=2)
    started: list[TransactionalProducer] = []
    errors: list[BaseException] = []
    with KafkaProxy(broker.bootstrap_servers) as fault_proxy:
        zombie = TransactionalProducer(
            {"bootstrap.servers": fault_proxy.bootstrap_servers, "transactional.id": txn_id},
            operation_timeout=20,
        )
        try:
            zombie.init_transactions()
            lost = fault_proxy.fail(
                ApiKey.END_TXN, KafkaError.REQUEST_TIMED_OUT, forward=True, times=1,
                edit=successor_initialises_before_the_answer(broker, txn_id, started, errors),
            )  # fmt: skip
            zombie.begin_transaction()
            zombie.produce(topic, b"first-1", partition=0)
            zombie.produce(topic, b"first-2", partition=1)
            with pytest.raises(FatalError, match="whether it committed is unknown"):
                zombie.commit_transaction()
            assert lost.hits == 1
            assert not errors, errors
            (successor,) = started
            successor.begin_transaction()
            successor.produce(topic, b"successor-1", partition=0)
            successor.produce(topic, b"successor-2", partition=1)
            successor.flush()
            with pytest.raises(FatalError):  # the zombie acts while the successor's is open
                zombie.abort_transaction()
        finally:
            zombie.close(timeout=5)
        assert fault_proxy.count(ApiKey.END_TXN) == 1  # the commit only: no abort ever sent
    try:
        successor.commit_transaction()
        with successor.transaction():
            successor.produce(topic, b"successor-3")
    finally:
        for producer in started:
            producer.close(timeout=5)
    assert committed_values(broker, topic, expected=5) == [
        "first-1", "first-2", "successor-1", "successor-2", "successor-3",
    ]  # fmt: skip
    assert broker.open_partitions(topic) == {}
