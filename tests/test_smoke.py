from kafka_txn import TransactionalProducer


def test_commit_visible_abort_invisible(broker, topic, producer_config):
    with TransactionalProducer(producer_config) as p:
        p.init_transactions()
        with p.transaction():
            p.produce(topic, b"committed", key=b"k")
        p.begin_transaction()
        p.produce(topic, b"aborted")
        p.flush()
        p.abort_transaction()
    assert broker.read_committed(topic) == [(b"k", b"committed")]
