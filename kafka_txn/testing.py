"""Fault injection for tests: librdkafka's built-in mock cluster, driven through ctypes,
and ``FaultProxy``, which injects errors into the coordinator requests of a real broker.

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

import collections
import contextlib
import ctypes
import enum
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import confluent_kafka

from kafka_txn.coordinator import codec
from kafka_txn.coordinator.messages import (
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
)

__all__ = ["ApiKey", "FaultProxy", "MockCluster", "librdkafka_path"]


class ApiKey(enum.IntEnum):
    """Kafka protocol API keys of the requests a transactional producer (and the
    consumer beside it) sends."""

    PRODUCE = 0
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
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
    i16 = ctypes.c_int16
    lib.rd_kafka_mock_set_apiversion.argtypes = [vp, i16, i16, i16]
    lib.rd_kafka_mock_start_request_tracking.argtypes = [vp]
    lib.rd_kafka_mock_get_requests.restype = ctypes.POINTER(vp)
    lib.rd_kafka_mock_get_requests.argtypes = [vp, ctypes.POINTER(ctypes.c_size_t)]
    lib.rd_kafka_mock_request_api_key.restype = i16
    lib.rd_kafka_mock_request_api_key.argtypes = [vp]
    lib.rd_kafka_mock_request_destroy_array.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t]
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

    def delay_replies(self, broker_id: int, api: ApiKey | int, ms: int, count: int = 1) -> None:
        """Have broker ``broker_id`` hold its answers to its next ``count`` requests of
        ``api`` for ``ms`` milliseconds each, then answer them without error: a slow
        coordinator, or a reply still in flight when the client's call times out."""
        pairs = [c for _ in range(count) for c in (ctypes.c_int(0), ctypes.c_int(ms))]
        err = self._lib.rd_kafka_mock_broker_push_request_error_rtts(  # variadic
            ctypes.c_void_p(self._cluster),
            ctypes.c_int32(broker_id),
            ctypes.c_int16(int(api)),
            ctypes.c_size_t(count),
            *pairs,
        )
        if err:
            raise RuntimeError(f"rd_kafka_mock_broker_push_request_error_rtts failed: error {err}")

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

    def set_api_version(self, api: ApiKey | int, min_version: int, max_version: int) -> None:
        """Announce only versions ``min_version``..``max_version`` of ``api`` in the
        brokers' ApiVersions answers (-1, -1: not at all), as an older or stripped-down
        broker would. A client learns it when it next connects to a broker."""
        err = self._lib.rd_kafka_mock_set_apiversion(
            self._cluster, int(api), min_version, max_version
        )
        if err:
            raise RuntimeError(f"rd_kafka_mock_set_apiversion({int(api)}) failed: error {err}")

    def track_requests(self) -> None:
        """Start counting the requests the cluster receives (see ``requests``)."""
        self._lib.rd_kafka_mock_start_request_tracking(self._cluster)

    def requests(self, api: ApiKey | int) -> int:
        """How many requests of ``api`` the brokers received since ``track_requests()``
        (each retry of a request counts): how often a client really tried."""
        count = ctypes.c_size_t()
        array = self._lib.rd_kafka_mock_get_requests(self._cluster, ctypes.byref(count))
        try:
            return sum(
                1
                for i in range(count.value)
                if self._lib.rd_kafka_mock_request_api_key(array[i]) == int(api)
            )
        finally:
            self._lib.rd_kafka_mock_request_destroy_array(array, count.value)

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


DescribeRewrite = Callable[[dict[str, Any]], dict[str, Any]]
"""Takes one ``transaction_states`` entry of a DescribeTransactions answer (the fields of
``DESCRIBE_TRANSACTIONS``' response schema) and returns the entry to answer instead."""


class FaultProxy:
    """A loopback TCP proxy in front of a real broker that answers chosen requests with an
    error code instead of forwarding them, for the requests of kafka-txn's coordinator
    client (FindCoordinator, DescribeTransactions, EndTxn, InitProducerId).

    The mock cluster cannot stand in here: it has no DescribeTransactions. Everything
    not injected goes to the real broker, and FindCoordinator answers are rewritten to
    point at the proxy, so the coordinator connection passes through it too::

        with FaultProxy(broker_bootstrap) as proxy:
            proxy.push_errors(ApiKey.END_TXN, KafkaError.PRODUCER_FENCED)
            settings = ConnectionSettings.from_librdkafka(
                {"bootstrap.servers": proxy.bootstrap_servers})

    It can also rewrite the broker's DescribeTransactions answers
    (``rewrite_describe``), to show what Apache Kafka would report where the local
    broker behaves differently (an epoch bump it does not do, an id it has not
    forgotten), and run a function just before a request goes on (``before``), to
    interleave another client's actions with the coordinator client's, deterministically.
    """

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.split(",", 1)[0].rpartition(":")
        self._upstream = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self._faults: dict[int, collections.deque[int]] = collections.defaultdict(collections.deque)
        self._hooks: dict[int, collections.deque[Callable[[], None]]] = collections.defaultdict(
            collections.deque
        )
        self._describe_rewrite: DescribeRewrite | None = None
        self.injected: list[tuple[int, int]] = []
        """(api key, error code) of every answer the proxy made up, in order."""
        self.hook_errors: list[Exception] = []
        """Exceptions raised by ``before`` functions (the request still goes on)."""
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self._server]
        self._closed = False
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    def push_errors(self, api: ApiKey | int, *codes: int) -> None:
        """Answer the next ``len(codes)`` requests of ``api`` with these error codes."""
        with self._lock:
            self._faults[int(api)].extend(codes)

    def rewrite_describe(self, rewrite: DescribeRewrite | None) -> None:
        """Pass every DescribeTransactions answer from the broker through ``rewrite``
        (None: forward them unchanged again) until this is called again."""
        with self._lock:
            self._describe_rewrite = rewrite

    def before(self, api: ApiKey | int, fn: Callable[[], None]) -> None:
        """Call ``fn`` (in the proxy's thread) when the next request of ``api`` arrives,
        before it is forwarded or answered with an injected error; the client waits
        meanwhile. Several calls queue up, one per request."""
        with self._lock:
            self._hooks[int(api)].append(fn)

    def close(self) -> None:
        self._closed = True
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._upstream, timeout=30)
        except OSError:
            client.close()
            return
        self._sockets.append(upstream)
        try:
            while not self._closed:
                request = _read_frame(client)
                api_key, version, correlation = struct.unpack(">hhi", request[:8])
                with self._lock:
                    hooks = self._hooks.get(api_key)
                    hook = hooks.popleft() if hooks else None
                if hook is not None:
                    try:
                        hook()
                    except Exception as exc:  # reported to the test (hook_errors)
                        self.hook_errors.append(exc)
                with self._lock:
                    queue = self._faults.get(api_key)
                    code = queue.popleft() if queue else None
                    rewrite = self._describe_rewrite
                if code is not None:
                    self.injected.append((api_key, code))
                    client.sendall(_frame(_error_response(api_key, version, correlation,
                                                          request, code)))  # fmt: skip
                    continue
                upstream.sendall(_frame(request))
                response = _read_frame(upstream)
                if api_key == FIND_COORDINATOR.key:
                    response = self._redirect(version, response)
                elif api_key == DESCRIBE_TRANSACTIONS.key and rewrite is not None:
                    response = _rewrite_describe(version, response, rewrite)
                client.sendall(_frame(response))
        except (OSError, ValueError):
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.close()

    def _redirect(self, version: int, response: bytes) -> bytes:
        """Point a FindCoordinator answer at the proxy."""
        header_len = 4 + (1 if FIND_COORDINATOR.flexible(version) else 0)
        schema = FIND_COORDINATOR.responses[version]
        flexible = FIND_COORDINATOR.flexible(version)
        body = codec.decode(schema, response[header_len:], flexible)
        entries = body["coordinators"] if version >= 4 else [body]
        for entry in entries:
            entry["host"], entry["port"] = "127.0.0.1", self.port
        return response[:header_len] + codec.encode(schema, body, flexible)


def _rewrite_describe(version: int, response: bytes, rewrite: DescribeRewrite) -> bytes:
    """A DescribeTransactions answer with each transaction state passed through
    ``rewrite`` (the API is flexible from v0: response header v1, one tagged-fields byte)."""
    header_len = 4 + (1 if DESCRIBE_TRANSACTIONS.flexible(version) else 0)
    schema = DESCRIBE_TRANSACTIONS.responses[version]
    flexible = DESCRIBE_TRANSACTIONS.flexible(version)
    body = codec.decode(schema, response[header_len:], flexible)
    body["transaction_states"] = [rewrite(dict(e)) for e in body["transaction_states"]]
    return response[:header_len] + codec.encode(schema, body, flexible)


def _read_frame(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", _read_exact(sock, 4))[0]
    return _read_exact(sock, size)


def _read_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise OSError("peer closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


_APIS = {
    api.key: api for api in (FIND_COORDINATOR, DESCRIBE_TRANSACTIONS, END_TXN, INIT_PRODUCER_ID)
}


def _blank(kind: codec.FieldType) -> Any:
    if isinstance(kind, codec.Struct):
        return {name: _blank(field) for name, field in kind.fields}
    if isinstance(kind, codec.Array):
        return []
    if kind is codec.NULLABLE_STRING:
        return None
    if kind is codec.STRING:
        return ""
    if kind is codec.BOOL:
        return False
    return -1 if kind in (codec.INT32, codec.INT64) else 0


def _item(schema: codec.Schema, name: str) -> codec.FieldType:
    """The element type of the array field ``name``."""
    kind = dict(schema)[name]
    assert isinstance(kind, codec.Array)
    return kind.item


def _error_response(
    api_key: int, version: int, correlation: int, request: bytes, code: int
) -> bytes:
    api = _APIS.get(api_key)
    if api is None or version not in api.responses:
        raise ValueError(f"cannot inject an error into API {api_key} v{version}")
    flexible = api.flexible(version)
    # Request header v1/v2: api key, version, correlation id, client id (int16 length).
    (client_id_len,) = struct.unpack(">h", request[8:10])
    offset = 10 + max(client_id_len, 0)
    if flexible:
        offset += 1  # empty tagged fields of request header v2
    req = codec.decode(api.requests[version], request[offset:], flexible)
    schema = api.responses[version]
    body = _blank(codec.Struct(schema))
    if api is DESCRIBE_TRANSACTIONS:
        entry = _blank(_item(schema, "transaction_states"))
        body["transaction_states"] = [
            {**entry, "error_code": code, "transactional_id": tid}
            for tid in req["transactional_ids"]
        ]
    elif api is FIND_COORDINATOR and version >= 4:
        entry = _blank(_item(schema, "coordinators"))
        body["coordinators"] = [
            {**entry, "key": key, "error_code": code} for key in req["coordinator_keys"]
        ]
    else:
        body["error_code"] = code
    header = struct.pack(">i", correlation) + (b"\x00" if flexible else b"")
    return header + codec.encode(api.responses[version], body, flexible)
