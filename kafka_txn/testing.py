"""Fault injection for tests: librdkafka's built-in mock cluster, driven through ctypes.

The mock cluster lives inside the librdkafka that ships in the confluent-kafka wheel, so
it needs no server and no network beyond loopback. It can make any request fail with any
error code, which no real broker does on demand; it does not hide aborted records, fence
producers or honour send_offsets_to_transaction, so use it for error paths only::

    with MockCluster(brokers=3) as cluster:
        cluster.create_topic("orders", partitions=3)
        cluster.push_request_errors(ApiKey.END_TXN, KafkaError.PRODUCER_FENCED)
        producer = TransactionalProducer({"bootstrap.servers": cluster.bootstrap_servers,
                                          "transactional.id": "t"})
"""

from __future__ import annotations

import ctypes
import enum
from pathlib import Path
from types import TracebackType

import confluent_kafka

__all__ = ["ApiKey", "MockCluster", "librdkafka_path"]


class ApiKey(enum.IntEnum):
    """Kafka protocol API keys of the requests a transactional producer sends."""

    PRODUCE = 0
    METADATA = 3
    OFFSET_COMMIT = 8
    FIND_COORDINATOR = 10
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_TRANSACTIONS = 65


def librdkafka_path() -> Path:
    """The librdkafka shared library bundled in the installed confluent-kafka wheel."""
    package = Path(confluent_kafka.__file__).parent
    for folder in (package.parent / "confluent_kafka.libs", package / ".dylibs", package):
        if folder.is_dir():
            for entry in sorted(folder.iterdir()):
                if entry.name.startswith("librdkafka"):
                    return entry
    raise RuntimeError(
        "no librdkafka library found next to confluent_kafka "
        f"({package}): the mock cluster needs confluent-kafka installed from its wheel"
    )


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(librdkafka_path()))
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    lib.rd_kafka_conf_new.restype = vp
    lib.rd_kafka_conf_set.argtypes = [vp, cp, cp, cp, ctypes.c_size_t]
    lib.rd_kafka_new.restype = vp
    lib.rd_kafka_new.argtypes = [ctypes.c_int, vp, cp, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [vp]
    lib.rd_kafka_mock_cluster_new.restype = vp
    lib.rd_kafka_mock_cluster_new.argtypes = [vp, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [vp]
    lib.rd_kafka_mock_cluster_bootstraps.restype = cp
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [vp]
    lib.rd_kafka_mock_topic_create.argtypes = [vp, cp, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [
        vp,
        ctypes.c_int16,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.rd_kafka_mock_clear_request_errors.argtypes = [vp, ctypes.c_int16]
    lib.rd_kafka_mock_coordinator_set.argtypes = [vp, cp, cp, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_down.argtypes = [vp, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_up.argtypes = [vp, ctypes.c_int32]
    return lib


class MockCluster:
    """A librdkafka mock cluster of ``brokers`` brokers on loopback ports."""

    def __init__(self, brokers: int = 3) -> None:
        self._lib = _load()
        conf = self._lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(512)
        # The handle only hosts the cluster: silence its "no bootstrap.servers" warning.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"0", errstr, len(errstr))
        self._rk = self._lib.rd_kafka_new(1, conf, errstr, len(errstr))  # RD_KAFKA_CONSUMER
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new failed: {errstr.value.decode()}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._cluster:
            self._lib.rd_kafka_destroy(self._rk)
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap_servers: str = self._lib.rd_kafka_mock_cluster_bootstraps(
            self._cluster
        ).decode()

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1) -> None:
        """Create ``name`` (the mock also auto-creates topics on first use)."""
        err = self._lib.rd_kafka_mock_topic_create(
            self._cluster, name.encode(), partitions, replication_factor
        )
        if err:
            raise RuntimeError(f"rd_kafka_mock_topic_create({name!r}) failed: error {err}")

    def push_request_errors(self, api: ApiKey | int, *codes: int) -> None:
        """Answer the next ``len(codes)`` requests of ``api`` with these error codes,
        in order, whichever broker receives them."""
        array = (ctypes.c_int * len(codes))(*codes)
        self._lib.rd_kafka_mock_push_request_errors_array(
            self._cluster, int(api), len(codes), array
        )

    def clear_request_errors(self, api: ApiKey | int) -> None:
        """Forget errors pushed for ``api`` that no request consumed yet."""
        self._lib.rd_kafka_mock_clear_request_errors(self._cluster, int(api))

    def set_coordinator(self, key_type: str, key: str, broker_id: int) -> None:
        """Make ``broker_id`` the coordinator for a "transaction" or "group" key."""
        self._lib.rd_kafka_mock_coordinator_set(
            self._cluster, key_type.encode(), key.encode(), broker_id
        )

    def set_broker_down(self, broker_id: int, down: bool = True) -> None:
        """Disconnect (or reconnect) one broker's clients."""
        lib = self._lib
        fn = lib.rd_kafka_mock_broker_set_down if down else lib.rd_kafka_mock_broker_set_up
        fn(self._cluster, broker_id)

    def close(self) -> None:
        """Stop the cluster's threads and free it; idempotent."""
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._cluster = None
        if self._rk:
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None

    def __enter__(self) -> MockCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
