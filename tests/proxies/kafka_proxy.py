"""A Kafka-aware TCP proxy for tests and benchmarks.

``KafkaProxy`` sits between any Kafka client (librdkafka, kafka-python, kafka-txn's
coordinator client) and a real broker:

- it carries pipelined connections: a client may have many requests in flight on one
  connection, and the answers go back in request order (the Kafka protocol's promise);
- it rewrites every broker address in Metadata, FindCoordinator (v0-v3 and KIP-699's
  batched v4+), DescribeCluster and KIP-951's ``node_endpoints`` (Produce v10+, Fetch
  v16+), each upstream broker getting its own listening port on 127.0.0.1, so that every
  connection a client makes after bootstrapping passes through the proxy too;
- it lets a test delay, fail or rewrite the answer to any request, chosen by API key,
  version and a predicate over the decoded request (``Rule``s, added and removed at
  run time from any thread), or run a function before a request goes on;
- ``delay_ms`` delays every byte one way, in both directions (a per-direction queue of
  timestamped writes, no sleeping per byte), for latency benchmarks.

Bodies are decoded and encoded with kafka-python's protocol classes, which are generated
from Apache Kafka's JSON message specs (clients/src/main/resources/common/message), so
every version and tagged field of every API they know is handled. Only what a rule or
the address rewrite needs is decoded; everything else is forwarded as bytes.

Usage::

    with KafkaProxy(broker.bootstrap_servers) as proxy:
        rule = proxy.fail(ApiKey.END_TXN, KafkaError.CONCURRENT_TRANSACTIONS, times=2)
        producer = TransactionalProducer({"bootstrap.servers": proxy.bootstrap_servers, ...})
        ...
        assert rule.hits == 2

Exceptions raised by a rule's functions, or by a response the proxy could not decode,
are collected in ``errors`` and raised by ``close()`` (so by the ``with`` block), so a
broken rule fails its test instead of silently not applying.

Not handled: TLS and SASL between client and proxy (the proxy speaks PLAINTEXT to both
sides), and the pre-KIP-152 unframed SASL handshake.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import importlib
import itertools
import struct
import threading
from collections.abc import Awaitable, Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any, Union

from kafka.protocol.api_message import ApiMessage

__all__ = [
    "ApiKey",
    "Before",
    "Delay",
    "Fail",
    "KafkaProxy",
    "ProxyError",
    "Request",
    "Rewrite",
    "Rule",
    "message_class",
]

Message = Any
"""A decoded request or response body: a kafka-python ``DataContainer`` whose
attributes are the spec's field names in snake_case (``error_code``, ``partition_responses``)."""

MAX_FRAME = 256 * 1024 * 1024


class ApiKey(enum.IntEnum):
    """The API keys the tests name (any other key works as a plain int)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    SYNC_GROUP = 14
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CLUSTER = 60
    DESCRIBE_TRANSACTIONS = 65


# ---------------------------------------------------------------- kafka-python's classes
def _subclasses(cls: Any) -> Iterator[Any]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _load_classes() -> dict[tuple[int, bool], Any]:
    for module in ("metadata", "producer", "consumer", "admin"):
        importlib.import_module(f"kafka.protocol.{module}")
    found: dict[tuple[int, bool], Any] = {}
    for cls in _subclasses(ApiMessage):
        if getattr(cls, "_class_version", None) is None and getattr(cls, "_json", None):
            found[(int(cls.API_KEY), bool(cls.is_request()))] = cls
    return found


_CLASSES = _load_classes()


def message_class(api_key: int, request: bool) -> Any:
    """kafka-python's class for one API's request or response body (None if unknown)."""
    return _CLASSES.get((int(api_key), request))


def _flexible(api_key: int, version: int) -> bool:
    cls = message_class(api_key, request=True)
    return bool(cls is not None and cls.flexible_version_q(version))


def _item_class(container: Any, name: str) -> Any:
    """The element class of the struct array ``name`` of a message or struct class."""
    return container._struct.fields[name].data_class


# ---------------------------------------------------------------- requests and rules
class Request:
    """One request as the proxy saw it; ``body`` decodes it on first use."""

    __slots__ = ("_body", "api_key", "client_id", "connection", "correlation_id", "raw", "version")

    def __init__(self, raw: bytes, connection: int) -> None:
        self.raw = raw
        """Everything after the size prefix: request header and body."""
        self.connection = connection
        """Which client connection it came on (numbered from 1 in accept order)."""
        self.api_key, self.version, self.correlation_id = struct.unpack_from(">hhi", raw)
        size = struct.unpack_from(">h", raw, 8)[0]
        self.client_id: str | None = None if size < 0 else raw[10 : 10 + size].decode()
        self._body: Message | None = None

    @property
    def body(self) -> Message:
        """The decoded request body (kafka-python ``DataContainer``)."""
        if self._body is None:
            cls = message_class(self.api_key, request=True)
            if cls is None:
                raise ProxyError(f"no kafka-python class for API key {self.api_key}")
            size = max(0, struct.unpack_from(">h", self.raw, 8)[0])
            offset = 10 + size
            if cls.flexible_version_q(self.version):  # request header v2: tagged fields
                offset = _skip_tagged_fields(self.raw, offset)
            self._body = cls.decode(self.raw[offset:], version=self.version)
        return self._body

    def expects_response(self) -> bool:
        """False only for Produce with acks=0, which the broker never answers."""
        if self.api_key != ApiKey.PRODUCE:
            return True
        size = max(0, struct.unpack_from(">h", self.raw, 8)[0])
        offset = 10 + size
        flexible = _flexible(self.api_key, self.version)
        if flexible:
            offset = _skip_tagged_fields(self.raw, offset)
        if self.version >= 3:  # transactional_id: nullable (compact) string
            if flexible:
                length, offset = _uvarint(self.raw, offset)
                offset += max(0, length - 1)
            else:
                offset += 2 + max(0, struct.unpack_from(">h", self.raw, offset)[0])
        return bool(struct.unpack_from(">h", self.raw, offset)[0] != 0)

    def __repr__(self) -> str:
        return f"Request(api_key={self.api_key}, version={self.version}, conn={self.connection})"


@dataclass(frozen=True)
class Fail:
    """Answer with ``code`` in every error-code field of the response, in the response's
    own shape for that version. Unless ``forward`` is set the broker never sees the
    request (a broker refusing it); with ``forward`` the broker acts and the client is
    told it failed. ``edit(request, response)`` may then add what Apache Kafka puts
    beside the code (KIP-467's ``record_errors``, an ``error_message``)."""

    code: int
    forward: bool = False
    edit: Callable[[Request, Message], None] | None = None


@dataclass(frozen=True)
class Rewrite:
    """Forward the request and pass the broker's decoded answer through
    ``edit(request, response)``, which changes it in place (or returns a replacement)."""

    edit: Callable[[Request, Message], Message | None]


@dataclass(frozen=True)
class Delay:
    """Hold the answer back ``ms`` milliseconds (later answers on the same connection
    wait behind it, as they would behind a slow broker)."""

    ms: float


@dataclass(frozen=True)
class Before:
    """Call ``fn(request)`` in a worker thread before the request goes on; that
    connection waits meanwhile, other connections do not (``fn`` may use the proxy)."""

    fn: Callable[[Request], None]


Action = Union[Fail, Rewrite, Delay, Before]  # noqa: UP007 - a runtime alias on 3.10


@dataclass(eq=False)
class Rule:
    """Apply ``action`` to requests of ``api_key`` whose version is in ``versions``
    (None: any) and for which ``when(request)`` is true (None: all), at most ``times``
    times (None: until removed). ``hits`` counts the requests it applied to."""

    api_key: int
    action: Action
    versions: Container[int] | None = None
    when: Callable[[Request], bool] | None = None
    times: int | None = None
    hits: int = field(default=0, init=False)
    requests: list[Request] = field(default_factory=list, init=False, repr=False)
    """The requests it applied to, in order."""


class ProxyError(Exception):
    """A rule's function raised, or the proxy could not read an answer."""


@dataclass
class _Pending:
    request: Request
    rules: list[Rule]
    answer: asyncio.Future[bytes | None]
    synthesized: bool


# ---------------------------------------------------------------- the proxy
class KafkaProxy:
    """See the module docstring. ``upstream``: the broker's bootstrap servers (the first
    one is used to bootstrap). ``delay_ms``: one-way delay added to every byte."""

    def __init__(self, upstream: str, *, delay_ms: float = 0.0) -> None:
        host, _, port = upstream.split(",", 1)[0].strip().rpartition(":")
        self._bootstrap = (host.strip("[]"), int(port))
        self.delay_ms = delay_ms
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self.errors: list[BaseException] = []
        """Exceptions from rules' functions and unreadable answers; ``close()`` raises."""
        self.seen: list[tuple[int, int]] = []
        """(api key, version) of every request, in arrival order across connections."""
        self._listeners: dict[tuple[str, int], int] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._conn_ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kafka-proxy")
        self._thread.daemon = True
        self._closed = False
        self._thread.start()
        port_ = self._call(self._listen(self._bootstrap))
        self.port: int = port_
        self.bootstrap_servers = f"127.0.0.1:{port_}"

    # ------------------------------------------------------------ rules (any thread)
    def add(self, rule: Rule) -> Rule:
        """Install ``rule`` (it applies from the next request on); returns it."""
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        """Uninstall ``rule``; a no-op if it is gone already."""
        with self._lock, contextlib.suppress(ValueError):
            self._rules.remove(rule)

    def clear(self) -> None:
        """Uninstall every rule."""
        with self._lock:
            self._rules.clear()

    def fail(
        self, api_key: int, code: int, *, forward: bool = False,
        edit: Callable[[Request, Message], None] | None = None,
        versions: Container[int] | None = None, when: Callable[[Request], bool] | None = None,
        times: int | None = None,
    ) -> Rule:  # fmt: skip
        """Install a ``Fail`` rule; see ``Fail`` and ``Rule``."""
        return self.add(Rule(api_key, Fail(code, forward, edit), versions, when, times))

    def rewrite(
        self, api_key: int, edit: Callable[[Request, Message], Message | None], *,
        versions: Container[int] | None = None, when: Callable[[Request], bool] | None = None,
        times: int | None = None,
    ) -> Rule:  # fmt: skip
        """Install a ``Rewrite`` rule; see ``Rewrite`` and ``Rule``."""
        return self.add(Rule(api_key, Rewrite(edit), versions, when, times))

    def delay(
        self, api_key: int, ms: float, *, versions: Container[int] | None = None,
        when: Callable[[Request], bool] | None = None, times: int | None = None,
    ) -> Rule:  # fmt: skip
        """Install a ``Delay`` rule; see ``Delay`` and ``Rule``."""
        return self.add(Rule(api_key, Delay(ms), versions, when, times))

    def before(
        self, api_key: int, fn: Callable[[Request], None], *,
        versions: Container[int] | None = None, when: Callable[[Request], bool] | None = None,
        times: int | None = None,
    ) -> Rule:  # fmt: skip
        """Install a ``Before`` rule; see ``Before`` and ``Rule``."""
        return self.add(Rule(api_key, Before(fn), versions, when, times))

    def count(self, api_key: int) -> int:
        """How many requests of ``api_key`` arrived so far."""
        with self._lock:
            return sum(1 for key, _ in self.seen if key == api_key)

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop listening, drop every connection, stop the thread; then raise
        ``ProxyError`` if a rule failed. Idempotent."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(RuntimeError, TimeoutError):
                self._call(self._shutdown(), timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()
        if self.errors:
            first = self.errors[0]
            raise ProxyError(
                f"{len(self.errors)} error(s) in the proxy; first: {first!r}"
            ) from first

    def __enter__(self) -> KafkaProxy:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:  # the test's own failure comes first
            with contextlib.suppress(ProxyError):
                self.close()

    def _call(self, coro: Awaitable[Any], timeout: float = 30.0) -> Any:
        async def run() -> Any:
            return await coro

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=1)

    # ------------------------------------------------------------ listeners
    async def _listen(self, upstream: tuple[str, int]) -> int:
        """The local port standing for ``upstream`` (a new listener the first time)."""
        port = self._listeners.get(upstream)
        if port is not None:
            return port

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._connections.add(task)
            try:
                await self._serve(upstream, reader, writer)
            except asyncio.CancelledError:
                pass  # closing: asyncio's stream callback would log a cancelled task
            finally:
                self._connections.discard(task)

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        self._servers.append(server)
        port = int(server.sockets[0].getsockname()[1])
        self._listeners[upstream] = port
        return port

    # ------------------------------------------------------------ one connection
    async def _serve(
        self, upstream: tuple[str, int], client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
    ) -> None:  # fmt: skip
        conn = next(self._conn_ids)
        try:
            up_r, up_w = await asyncio.open_connection(*upstream)
        except OSError:
            client_w.close()
            return
        to_broker = _DelayedWriter(up_w, self.delay_ms)
        to_client = _DelayedWriter(client_w, self.delay_ms)
        pending: asyncio.Queue[_Pending] = asyncio.Queue()
        inflight: collections.deque[asyncio.Future[bytes | None]] = collections.deque()
        tasks = [
            asyncio.ensure_future(self._requests(conn, client_r, to_broker, pending, inflight)),
            asyncio.ensure_future(_answers(up_r, inflight)),
            asyncio.ensure_future(self._responses(pending, to_client)),
            asyncio.ensure_future(to_broker.run()),
            asyncio.ensure_future(to_client.run()),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in (client_w, up_w):
                writer.close()

    async def _requests(
        self, conn: int, client: asyncio.StreamReader, to_broker: _DelayedWriter,
        pending: asyncio.Queue[_Pending], inflight: collections.deque[asyncio.Future[bytes | None]],
    ) -> None:  # fmt: skip
        """Read the client's requests in order; forward each (or not), queue its answer."""
        loop = asyncio.get_running_loop()
        while True:
            frame = await _read_frame(client)
            if frame is None:
                return
            request = Request(frame, conn)
            with self._lock:
                self.seen.append((request.api_key, request.version))
            # Before rules first: what they install applies to this very request.
            for rule in self._match(request, before=True):
                assert isinstance(rule.action, Before)
                try:
                    await loop.run_in_executor(None, rule.action.fn, request)
                except Exception as exc:
                    self.errors.append(exc)
            rules = self._match(request, before=False)
            fail = next((r.action for r in rules if isinstance(r.action, Fail)), None)
            answer: asyncio.Future[bytes | None] = loop.create_future()
            expected = request.expects_response()
            if fail is not None and not fail.forward:
                answer.set_result(None)  # made up by _respond, the broker never sees it
            else:
                if expected:
                    inflight.append(answer)
                to_broker.send(_frame(frame))
                await to_broker.drain()
            if expected:
                pending.put_nowait(_Pending(request, rules, answer, answer.done()))

    async def _responses(self, pending: asyncio.Queue[_Pending], to_client: _DelayedWriter) -> None:
        """Write the answers back in request order, after the rules changed them."""
        while True:
            item = await pending.get()
            raw = await item.answer
            try:
                out = await self._respond(item.request, item.rules, raw)
            except Exception as exc:
                self.errors.append(exc)
                if raw is None:
                    raise  # nothing to send: drop the connection, as a broken broker would
                out = raw
            delay = sum(r.action.ms for r in item.rules if isinstance(r.action, Delay))
            if delay:
                await asyncio.sleep(delay / 1000)
            to_client.send(_frame(out))
            await to_client.drain()

    def _match(self, request: Request, *, before: bool) -> list[Rule]:
        """The rules that apply to ``request`` (the Before ones, or the others), their
        hits counted and those used up removed. Only the first matching Fail rule applies
        (and counts): several ``fail(..., times=1)`` answer successive requests in turn."""
        with self._lock:
            rules = [
                r for r in self._rules
                if r.api_key == request.api_key and isinstance(r.action, Before) == before
            ]  # fmt: skip
        matched: list[Rule] = []
        for rule in rules:
            if rule.versions is not None and request.version not in rule.versions:
                continue
            if isinstance(rule.action, Fail) and any(isinstance(m.action, Fail) for m in matched):
                continue
            try:
                if rule.when is not None and not rule.when(request):
                    continue
            except Exception as exc:
                self.errors.append(exc)
                continue
            with self._lock:
                if rule.times is not None and rule.hits >= rule.times:
                    continue
                rule.hits += 1
                rule.requests.append(request)
                if rule.times is not None and rule.hits >= rule.times:
                    with contextlib.suppress(ValueError):
                        self._rules.remove(rule)
            matched.append(rule)
        return matched

    # ------------------------------------------------------------ answers
    async def _respond(self, request: Request, rules: list[Rule], raw: bytes | None) -> bytes:
        """The answer to send: the broker's (``raw``), or one made up for a Fail rule,
        with broker addresses pointed at the proxy and the rules' edits applied."""
        api, version = request.api_key, request.version
        rewrites = [r.action for r in rules if isinstance(r.action, Rewrite)]
        fail = next((r.action for r in rules if isinstance(r.action, Fail)), None)
        decode = rewrites or fail is not None or _carries_addresses(api, version)
        if raw is not None and not decode:
            return raw
        cls = message_class(api, request=False)
        if cls is None:
            raise ProxyError(f"API key {api}: no kafka-python class to decode its answer")
        # Response header v1 (correlation id + tagged fields) for flexible versions, except
        # ApiVersions, whose response header is always v0 (KIP-511).
        flexible_header = cls.flexible_version_q(version) and api != ApiKey.API_VERSIONS
        if raw is None:
            header = struct.pack(">i", request.correlation_id) + (
                b"\x00" if flexible_header else b""
            )
            body = _error_response(request, cls, fail.code if fail else -1)
        else:
            end = _skip_tagged_fields(raw, 4) if flexible_header else 4
            header, body = raw[:end], cls.decode(raw[end:], version=version)
            if fail is not None:
                _set_error_codes(body, version, fail.code)
        if fail is not None and fail.edit is not None:
            fail.edit(request, body)
        for rewrite in rewrites:
            replaced = rewrite.edit(request, body)
            body = body if replaced is None else replaced
        await self._point_at_proxy(body, version)
        return header + _encode(body, version)

    async def _point_at_proxy(self, message: Message, version: int) -> None:
        """Replace every broker address (a struct with host, port and a node or broker
        id) by the local port standing for it."""
        for item in _structs(message, version):
            names = item._struct.fields
            is_address = "host" in names and "port" in names
            if not is_address or ("node_id" not in names and "broker_id" not in names):
                continue
            if item.host and item.port is not None and item.port >= 0:
                item.port = await self._listen((item.host, int(item.port)))
                item.host = "127.0.0.1"


# ---------------------------------------------------------------- helpers
def _encode(message: Message, version: int) -> bytes:
    """A response body's bytes (kafka-python's encode() reads ``_header``, which its
    decoder leaves unset)."""
    try:
        message._header  # noqa: B018 - a slot that may be unset
    except AttributeError:
        message._header = None
    return bytes(message.encode(version=version))


def _carries_addresses(api: int, version: int) -> bool:
    """Whether answers of this API and version can hold a broker address."""
    if api in (ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER):
        return True
    # KIP-951: node_endpoints of new leaders, in Produce v10+ and Fetch v16+ answers.
    return (api == ApiKey.PRODUCE and version >= 10) or (api == ApiKey.FETCH and version >= 16)


def _structs(message: Message, version: int) -> Iterator[Message]:
    """``message`` and every struct nested in it, for this version's fields."""
    yield message
    for spec in message._struct._fields:
        if not spec.for_version_q(version):
            continue
        if spec.is_struct():
            value = getattr(message, spec.name)
            if value is not None:
                yield from _structs(value, version)
        elif spec.is_struct_array():
            for value in getattr(message, spec.name) or ():
                yield from _structs(value, version)


def _set_error_codes(message: Message, version: int, code: int) -> None:
    """Set every error-code field of this version (``error_code``,
    ``partition_error_code``, ...) in ``message`` and its nested structs to ``code``."""
    for item in _structs(message, version):
        for spec in item._struct._fields:
            if spec.for_version_q(version) and spec.name.endswith("error_code"):
                setattr(item, spec.name, code)


def _error_response(request: Request, cls: Any, code: int) -> Message:
    """An answer to ``request`` carrying ``code``, in the shape Apache Kafka gives it
    for that version: one entry per topic, partition, group or id the request named."""
    v, body = request.version, request.body
    answer = cls(version=v)
    api = request.api_key
    if api == ApiKey.PRODUCE:
        topic_cls = _item_class(cls, "responses")
        part_cls = _item_class(topic_cls, "partition_responses")
        answer.responses = [
            topic_cls(name=t.name, topic_id=t.topic_id, partition_responses=[
                part_cls(index=p.index, error_code=code, base_offset=-1) for p in t.partition_data
            ])
            for t in body.topic_data
        ]  # fmt: skip
    elif api in (ApiKey.TXN_OFFSET_COMMIT, ApiKey.OFFSET_COMMIT):
        topic_cls = _item_class(cls, "topics")
        part_cls = _item_class(topic_cls, "partitions")
        answer.topics = [
            topic_cls(name=t.name, partitions=[
                part_cls(partition_index=p.partition_index, error_code=code) for p in t.partitions
            ])
            for t in body.topics
        ]  # fmt: skip
    elif api == ApiKey.OFFSET_FETCH and v >= 8:
        group_cls = _item_class(cls, "groups")
        topic_cls = _item_class(group_cls, "topics")
        part_cls = _item_class(topic_cls, "partitions")
        answer.groups = [
            group_cls(group_id=g.group_id, error_code=code, topics=[
                topic_cls(name=t.name, partitions=[
                    part_cls(partition_index=i, committed_offset=-1, metadata="", error_code=code)
                    for i in t.partition_indexes
                ])
                for t in g.topics or ()
            ])
            for g in body.groups
        ]  # fmt: skip
    elif api == ApiKey.OFFSET_FETCH:
        topic_cls = _item_class(cls, "topics")
        part_cls = _item_class(topic_cls, "partitions")
        answer.topics = [
            topic_cls(name=t.name, partitions=[
                part_cls(partition_index=i, committed_offset=-1, metadata="", error_code=code)
                for i in t.partition_indexes
            ])
            for t in body.topics or ()
        ]  # fmt: skip
        answer.error_code = code
    elif api == ApiKey.ADD_PARTITIONS_TO_TXN and v <= 3:
        topic_cls = _item_class(cls, "results_by_topic_v3_and_below")
        part_cls = _item_class(topic_cls, "results_by_partition")
        answer.results_by_topic_v3_and_below = [
            topic_cls(name=t.name, results_by_partition=[
                part_cls(partition_index=i, partition_error_code=code) for i in t.partitions
            ])
            for t in body.v3_and_below_topics
        ]  # fmt: skip
    elif api == ApiKey.DESCRIBE_TRANSACTIONS:
        state_cls = _item_class(cls, "transaction_states")
        answer.transaction_states = [
            state_cls(error_code=code, transactional_id=tid, transaction_state="",
                      transaction_timeout_ms=0, transaction_start_time_ms=-1, producer_id=-1,
                      producer_epoch=-1, topics=[])
            for tid in body.transactional_ids
        ]  # fmt: skip
    elif api == ApiKey.FIND_COORDINATOR and v >= 4:
        coord_cls = _item_class(cls, "coordinators")
        answer.coordinators = [
            coord_cls(key=key, node_id=-1, host="", port=-1, error_code=code)
            for key in body.coordinator_keys
        ]
    elif "error_code" in cls._struct.fields:
        answer.error_code = code
        if api == ApiKey.FIND_COORDINATOR:
            answer.node_id, answer.host, answer.port = -1, "", -1
    else:
        raise ProxyError(f"cannot make up an error answer for API key {api} v{v}")
    return answer


async def _answers(
    upstream: asyncio.StreamReader, inflight: collections.deque[asyncio.Future[bytes | None]]
) -> None:
    """Match the broker's answers to the forwarded requests, in order (Kafka answers
    the requests of one connection in the order it received them)."""
    while True:
        frame = await _read_frame(upstream)
        if frame is None:
            return
        if not inflight:
            raise ProxyError("the broker answered a request nobody sent")
        inflight.popleft().set_result(frame)


class _DelayedWriter:
    """Writes to one stream, each write ``delay_ms`` after ``send`` (all sends get the
    same delay, so a FIFO queue keeps them due in order); with no delay, at once."""

    def __init__(self, writer: asyncio.StreamWriter, delay_ms: float) -> None:
        self._writer = writer
        self._delay = delay_ms / 1000
        self._queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    def send(self, data: bytes) -> None:
        if self._delay <= 0:
            self._writer.write(data)
        else:
            self._queue.put_nowait((asyncio.get_running_loop().time() + self._delay, data))

    async def drain(self) -> None:
        if self._delay <= 0:
            await self._writer.drain()

    async def run(self) -> None:
        """Write queued data when due (idles forever with no delay)."""
        loop = asyncio.get_running_loop()
        while True:
            due, data = await self._queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._writer.write(data)
            if self._queue.empty():
                await self._writer.drain()


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """One size-prefixed frame, or None at a clean end of stream."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProxyError("connection closed inside a frame's size") from exc
        return None
    except ConnectionError:
        return None
    size = struct.unpack(">i", head)[0]
    if not 4 <= size <= MAX_FRAME:  # a Kafka frame holds at least a correlation id
        raise ProxyError(f"frame size {size} is not a Kafka frame")
    try:
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _uvarint(data: bytes, offset: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, offset
        shift += 7


def _skip_tagged_fields(data: bytes, offset: int) -> int:
    """The offset after a tagged-fields section (KIP-482) starting at ``offset``."""
    count, offset = _uvarint(data, offset)
    for _ in range(count):
        _, offset = _uvarint(data, offset)
        size, offset = _uvarint(data, offset)
        offset += size
    return offset
