"""README's template, run as written, meets every kind of failure a caller can meet and
handles each in one of its branches: the transaction is never half there, the producer
stays usable after every failure that is not fatal, and what the template returns names
what became of the transaction. docs/index.md shows the same template."""

from __future__ import annotations

import ast
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kafka_txn import ProducerFencedError, TransactionalProducer
from kafka_txn.testing import ApiKey

ROOT = Path(__file__).resolve().parent.parent.parent
TEMPLATE_ADDRESS = "127.0.0.1:9092"


def _template(doc: str) -> str:
    text = (ROOT / doc).read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"{doc} shows no Python template"
    return blocks[0]


Publish = Callable[[TransactionalProducer, dict[bytes, bytes]], str]


def _publish(topic: str = "orders") -> Publish:
    """README's imports and ``publish`` function, exactly as written but for the topic."""
    source = _template("README.md").replace('"orders"', repr(topic))
    tree = ast.parse(source)
    kept = [n for n in tree.body if isinstance(n, (ast.ImportFrom, ast.Import, ast.FunctionDef))]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=kept, type_ignores=[]), "README.md", "exec"), namespace)
    return namespace["publish"]  # type: ignore[no-any-return]


@pytest.fixture
def publish() -> Publish:
    """The template's ``publish``, writing to "orders" (the mock cluster's topic)."""
    return _publish()


def test_docs_index_shows_the_readme_template():
    """docs/index.md's quick start is README's template, character for character."""
    assert _template("docs/index.md") == _template("README.md")


@pytest.mark.guarantee("1.19")
def test_the_template_runs_as_written(broker):
    """The whole template, its address pointed at the rig's broker, commits its order:
    a read_committed consumer of another client sees it once."""
    source = _template("README.md")
    assert TEMPLATE_ADDRESS in source
    txn_id = f"readme-{uuid.uuid4().hex[:8]}"
    topic = broker.create_topic(partitions=3)
    source = source.replace(TEMPLATE_ADDRESS, broker.bootstrap_servers)
    source = source.replace('"orders-writer-0"', repr(txn_id)).replace('"orders"', repr(topic))
    printed: list[str] = []
    exec(compile(source, "README.md", "exec"), {"print": printed.append})
    assert printed == ["committed"]
    assert broker.read_committed(topic, 1) == [(b"customer-7", b"order-1")]


def _refusals(topic: str) -> dict[str, Callable[[TransactionalProducer], None]]:
    """Bodies that send one good record, then one the client refuses."""

    def oversized(p: TransactionalProducer) -> None:
        p.produce(topic, b"x" * (2 * 1024 * 1024), key=b"big")

    def wrong_type(p: TransactionalProducer) -> None:
        p.produce(topic, 12345, key=b"int")

    def unknown_partition(p: TransactionalProducer) -> None:
        p.produce(topic, b"v", key=b"p99", partition=99)

    def invalid_topic(p: TransactionalProducer) -> None:
        p.produce("no spaces allowed!", b"v", key=b"bad-topic")

    return {
        "oversized": oversized,
        "wrong_type": wrong_type,
        "unknown_partition": unknown_partition,
        "invalid_topic": invalid_topic,
    }


_KEYS = {
    "oversized": b"big",
    "wrong_type": b"int",
    "unknown_partition": b"p99",
    "invalid_topic": b"bad-topic",
}


@pytest.mark.guarantee("1.19")
@pytest.mark.parametrize(
    ("kind", "failure_type"),
    [
        ("oversized", "MESSAGE_REJECTED"),
        ("wrong_type", "MESSAGE_REJECTED"),
        ("unknown_partition", "MESSAGE_REJECTED"),
        ("invalid_topic", "MESSAGE_REJECTED"),
    ],
)
def test_a_refused_record_is_the_refused_branch(broker, kind, failure_type):
    """A record produce() refuses makes the template return "refused <FailureType>":
    the transaction, with the good record sent before it, is aborted (another client
    sees nothing), and the same producer then commits the next transaction."""
    topic = broker.create_topic(partitions=3)
    publish = _publish(topic)
    body = _refusals(topic)[kind]
    conf = {
        "bootstrap.servers": broker.bootstrap_servers,
        "transactional.id": f"t-{kind}-{uuid.uuid4().hex[:8]}",
    }
    with TransactionalProducer(conf) as producer:
        producer.init_transactions()
        # Metadata for the topic is known (a partition count to refuse partition 99 by).
        assert publish(producer, {b"warm": b"up"}) == "committed"

        class Refusing(dict[bytes, bytes]):
            def items(self):  # type: ignore[override]
                yield b"good", b"sent before the refused one"
                body(producer)

        outcome = publish(producer, Refusing())
        assert outcome == f"refused {failure_type} {_KEYS[kind]!r}", outcome
        assert producer.state == "ready"
        assert publish(producer, {b"after": b"next"}) == "committed"
    seen = broker.read_committed(topic, 2)
    assert sorted(seen) == [(b"after", b"next"), (b"warm", b"up")]


@pytest.mark.guarantee("1.19")
def test_a_fenced_producer_is_the_fatal_branch(broker, txn_id):
    """A newer instance with the same transactional id fences the template's producer:
    publish() raises ProducerFencedError (a FatalError, re-raised as written), nothing
    of the fenced transaction is visible, and the newer instance's is."""
    topic = broker.create_topic(partitions=3)
    publish = _publish(topic)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": txn_id}
    with TransactionalProducer(conf) as old, TransactionalProducer(conf) as new:
        old.init_transactions()
        new.init_transactions()

        with pytest.raises(ProducerFencedError):
            publish(old, {b"zombie": b"write"})
        assert publish(new, {b"owner": b"write"}) == "committed"
    assert broker.read_committed(topic, 1) == [(b"owner", b"write")]


@pytest.mark.guarantee("1.19")
def test_a_commit_out_of_time_is_the_unknown_branch(mock_cluster, mock_config, publish):
    """Every EndTxn answered COORDINATOR_LOAD_IN_PROGRESS until the producer's
    operation_timeout: the template returns "unknown after commit_transaction", never
    aborts, and commit_transaction() called again, as its comment says, commits."""
    mock_cluster.create_topic("orders", partitions=1)
    with TransactionalProducer(mock_config(), operation_timeout=1.0) as producer:
        producer.init_transactions()
        mock_cluster.push_request_errors(
            ApiKey.END_TXN, *[KafkaError.COORDINATOR_LOAD_IN_PROGRESS] * 1000
        )
        assert publish(producer, {b"k": b"v"}) == "unknown after commit_transaction"
        assert producer.state == "committing"
        mock_cluster.clear_request_errors(ApiKey.END_TXN)
        producer.commit_transaction()
        assert producer.state == "ready"


@pytest.mark.guarantee("1.19")
@pytest.mark.parametrize("reported", ["at_commit", "before_the_next_send"])
def test_a_record_the_broker_refuses_is_the_aborted_branch(broker, reported):
    """The broker refuses a record larger than its topic's max.message.bytes (the
    client's message.max.bytes lets it through). Whether its refusal is known at the
    commit (CommitFailedException) or before a later produce() (that produce() raises
    the transaction's TransactionAbortableError, never a failure of its own innocent
    record), the template returns "aborted by MESSAGE_REJECTED" naming a record of the
    refused batch, nothing is visible, and the retry without the large one commits.
    librdkafka numbered the refused records, which the broker never stored, so the next
    transaction's first Produce fails with OUT_OF_ORDER_SEQUENCE_NUMBER and bumps the
    epoch (``rd_kafka_handle_Produce_error``, "skipped sequence numbers"): that one
    retry may be "aborted" too, and the one after it commits."""
    topic = broker.create_topic(config={"max.message.bytes": "2000"})
    publish = _publish(topic)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"big-{topic}"}
    with TransactionalProducer(conf) as producer:
        producer.init_transactions()

        class Orders(dict[bytes, bytes]):
            def items(self):  # type: ignore[override]
                yield b"small", b"s"
                yield b"large", b"x" * 20_000
                if reported == "before_the_next_send":
                    producer.flush(30)  # the broker's refusal is reported now
                    for i in range(3):
                        yield b"after-%d" % i, b"innocent"

        # librdkafka sent both records in one batch, which the broker refused whole:
        # either may be named, never a record sent after the refusal was reported.
        outcome = publish(producer, Orders())
        assert outcome in {f"aborted by MESSAGE_REJECTED {k!r}" for k in (b"small", b"large")}
        assert producer.state == "ready"
        retries = [publish(producer, {b"small": b"s"}) for _ in range(2)]
        assert retries in (["aborted", "committed"], ["committed", "committed"]), retries
        assert producer.state == "ready"
    expected = retries.count("committed")
    assert broker.read_committed(topic, expected) == [(b"small", b"s")] * expected
