"""The three-broker cluster the fault schedules run on (tests/support/kafka_cluster.py):
configured as production runs transactions, its helpers finding what the brokers find,
and its faults doing what they say."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from kafka_txn.coordinator import ConnectionSettings, CoordinatorClient
from tests.support.kafka_cluster import BROKERS, REPLICA_LAG_S, KafkaCluster, java_string_hash
from tests.support.rig import Broker

pytestmark = [pytest.mark.cluster]


def test_java_string_hash_is_javas() -> None:
    """Values of Java's String.hashCode, as jshell prints them (a character outside the
    BMP counts as its two UTF-16 code units)."""
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("transactional-id-0") == 1051133890
    assert java_string_hash("é✓") == 17226
    assert java_string_hash("\U0001f600x") == 54959989


def test_internal_and_data_topics_have_three_replicas_and_min_isr_two(
    cluster: KafkaCluster, cluster_broker: Broker
) -> None:
    """``__transaction_state``, ``__consumer_offsets`` and a data topic the rig creates:
    three replicas, all in sync; ``min.insync.replicas`` 2 on every broker and in effect
    on the data topic and the transaction log."""
    topic = cluster_broker.create_topic(partitions=3)
    md = cluster.admin().list_topics(timeout=10)
    for name in ("__transaction_state", "__consumer_offsets", topic):
        for partition in md.topics[name].partitions.values():
            assert sorted(partition.replicas) == list(BROKERS), (name, partition)
            assert sorted(partition.isrs) == list(BROKERS), (name, partition)
    admin = cluster.admin()  # must outlive its futures
    for broker_id in BROKERS:  # one broker resource per DescribeConfigs (librdkafka)
        resource = ConfigResource(ResourceType.BROKER, str(broker_id))
        (future,) = admin.describe_configs([resource]).values()
        config = future.result(timeout=30)
        assert config["min.insync.replicas"].value == "2"
        assert config["transaction.state.log.min.isr"].value == "2"
        assert config["unclean.leader.election.enable"].value == "false"
    # What the partitions enforce: the topics' effective settings (a cluster-level
    # value the controller wrote would show here, whatever the brokers' files say).
    for name in (topic, "__transaction_state"):
        (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)]).values()
        assert future.result(timeout=30)["min.insync.replicas"].value == "2", name


def test_coordinators_are_where_the_brokers_say(cluster: KafkaCluster) -> None:
    """The transaction coordinator the helper computes is the broker FindCoordinator
    names (kafka-txn's coordinator client connects to it); the group coordinator is the
    one DescribeGroups reports."""
    for _ in range(4):
        txn_id = f"where-{uuid.uuid4().hex[:8]}"
        settings = ConnectionSettings.from_librdkafka(
            {"bootstrap.servers": cluster.bootstrap_servers}
        )
        with CoordinatorClient(settings, txn_id, deadline_s=30) as client:
            client.describe()
            assert client._coordinator is not None
            port = client._coordinator.port
        assert cluster.nodes[cluster.transaction_coordinator(txn_id)].port == port
    group = f"where-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition("__consumer_offsets", 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    admin = cluster.admin()
    described = admin.describe_consumer_groups([group])[group].result(timeout=30)
    assert described.coordinator.id == cluster.group_coordinator(group)


def test_two_brokers_paused_put_a_partition_below_min_isr(
    cluster: KafkaCluster, cluster_broker: Broker
) -> None:
    """With the two followers of a partition paused past the replica lag, its ISR shrinks
    to the leader and an acks=all produce waits (NOT_ENOUGH_REPLICAS, retried by
    librdkafka); once they are back, the record is written once."""
    topic = cluster_broker.create_topic(partitions=1)
    leader = cluster.leader(topic, 0)
    followers = [b for b in BROKERS if b != leader]
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "enable.idempotence": True,
         "log_level": 0}
    )  # fmt: skip
    delivered: list[object] = []
    with cluster.paused(followers):
        producer.produce(topic, b"during", on_delivery=lambda err, msg: delivered.append(err))
        deadline = time.monotonic() + REPLICA_LAG_S + 10
        isr: list[int] = []
        while time.monotonic() < deadline:
            producer.poll(0.2)
            isr = cluster.admin().list_topics(topic, timeout=5).topics[topic].partitions[0].isrs
            if isr == [leader]:
                break
        assert isr == [leader]
        producer.poll(1.0)
        assert delivered == [], "an acks=all record was acknowledged below min.insync.replicas"
    assert producer.flush(120) == 0
    assert delivered == [None]
    cluster.wait_healed()
    assert cluster_broker.read_committed(topic, expected=1) == [(None, b"during")]


def test_a_hard_bounce_moves_the_leadership_and_heals(
    cluster: KafkaCluster, cluster_broker: Broker
) -> None:
    """SIGKILL of a partition's leader: another broker leads it, the killed one comes
    back into the ISR after its start."""
    topic = cluster_broker.create_topic(partitions=1)
    leader = cluster.leader(topic, 0)
    cluster.take_down(leader, "hard")
    try:
        deadline = time.monotonic() + 60
        while cluster.leader(topic, 0) == leader:
            assert time.monotonic() < deadline, "the leadership did not move"
            time.sleep(0.5)
    finally:
        cluster.bring_up(leader)
    cluster.wait_healed()
