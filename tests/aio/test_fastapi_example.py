"""examples/fastapi_orders.py served by uvicorn in a subprocess, driven over HTTP by
concurrent clients while it is killed and restarted, against the rig's broker and
PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from tests.support.rig import Broker

ROOT = Path(__file__).resolve().parent.parent.parent
WAIT_S = 60.0
"""The bound of every wait for the app (to answer, to start): a stalled app fails the
test, never hangs it."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class App:
    """The example in a process of its own on a fixed loopback port; killed and started
    again on the same port, with the same environment (so the same transactional id)."""

    def __init__(self, argv: list[str], env: dict[str, str], logs: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.env = env
        """The example's environment variables: the same at every start."""
        self._process_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        self._logs = logs
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, argv: list[str] | None = None) -> None:
        """Start it (``argv`` instead of the usual arguments, this once)."""
        self.starts += 1
        args = self._argv if argv is None else [a.replace("{port}", str(self.port)) for a in argv]
        log = open(self._logs / f"app-{self.port}-{self.starts}.log", "wb")  # noqa: SIM115
        with log:  # the child holds its own descriptor
            self._proc = subprocess.Popen(
                [sys.executable, *args], cwd=ROOT, env=self._process_env,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def log_tail(self) -> str:
        return (self._logs / f"app-{self.port}-{self.starts}.log").read_text()[-3000:]

    async def ready(self, http: httpx.AsyncClient) -> None:
        """Until GET /healthz answers 200 (its lifespan ran: the writer started)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            assert self._proc is not None and self._proc.poll() is None, self.log_tail()
            try:
                if (await http.get(f"{self.url}/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the app did not start\n{self.log_tail()}"
            await asyncio.sleep(0.1)

    async def exited(self) -> None:
        """Until the process has ended on its own."""
        deadline = time.monotonic() + WAIT_S
        while self._proc is not None and self._proc.poll() is None:
            assert time.monotonic() < deadline, f"the app did not end\n{self.log_tail()}"
            await asyncio.sleep(0.05)

    def kill(self) -> None:
        assert self._proc is not None and self._proc.poll() is None, self.log_tail()
        os.kill(self._proc.pid, signal.SIGKILL)
        self._proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (uvicorn shuts down, the lifespan closes the writer), SIGKILL if it
        does not end in time."""
        if self._proc is None or self._proc.poll() is not None:
            return
        os.kill(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)


CRASHING = """
import functools, os, signal, sys
import uvicorn
import examples.fastapi_orders as example

commits = 0

def on_step(step):
    global commits
    if step == "after_db_commit":
        commits += 1
        if commits == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup at all

example.AsyncDualWriter = functools.partial(example.AsyncDualWriter, on_step=on_step)
uvicorn.run(example.app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""
"""The example, killed by its own writer's ``on_step`` hook right after the database
commit of its Nth order (argv: port, N): Kafka's side of that order is left prepared."""


def _env(broker: Broker, jdbc: str, topic: str, txn_id: str) -> dict[str, str]:
    return {"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "ORDERS_JDBC_URL": jdbc,
            "ORDERS_TOPIC": topic, "ORDERS_TRANSACTIONAL_ID": txn_id}  # fmt: skip


async def _post_until_answered(
    http: httpx.AsyncClient, app: App, order: dict[str, Any], errors: Counter[str]
) -> int:
    """POST the order until the app answers 201 or 200, as the example's client does:
    again, with the same id, after a connection error (the app was killed, or is not up
    yet) or a 503."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            response = await http.post(f"{app.url}/orders", json=order)
        except httpx.TransportError as exc:
            errors[type(exc).__name__] += 1
        else:
            if response.status_code in (200, 201):
                return response.status_code
            assert response.status_code == 503, (response.status_code, response.text)
            errors["503"] += 1
        assert time.monotonic() < deadline, f"order {order['id']} never answered"
        await asyncio.sleep(0.05)


def _rows(jdbc: str, prefix: str) -> list[tuple[str, str, int]]:
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id, customer, amount_cents FROM orders WHERE id LIKE :p"),
                {"p": f"{prefix}%"},
            )
            return [(r.id, r.customer, r.amount_cents) for r in rows]
    finally:
        engine.dispose()


def _events(broker: Broker, topic: str, expected: int) -> list[tuple[str, str, int]]:
    """The OrderCreated records a read_committed consumer (kafka-python) sees, keyed by
    their order id."""
    events = []
    for key, value in broker.read_committed(topic, expected=expected, timeout=WAIT_S):
        event = json.loads(value or b"")
        assert event["type"] == "OrderCreated" and key == event["id"].encode()
        events.append((event["id"], event["customer"], event["amount_cents"]))
    return events


@pytest.mark.guarantee("9.6")
def test_orders_are_exactly_once_across_kills_and_restarts(broker, postgres_jdbc, tmp_path):
    """Four clients POST 60 orders (each its own id) to the app served by uvicorn. The app
    dies three times mid-traffic, SIGKILLed, and is started again with the same
    transactional id, its writer's start() settling what the killed one left: once right
    after the database commit of an order (its own on_step hook), then twice at whatever
    point the test's SIGKILL finds it. Clients send a request that failed with a
    connection error or a 503 again, same id, until answered 201 or 200 (200 at least
    for the order whose database commit the first crash followed). Then every order is a
    row exactly once and an OrderCreated record exactly once (a read_committed consumer,
    kafka-python), the same orders with the same content; a repeated POST is answered
    200 and writes nothing, the same id with other content 409."""
    topic = broker.create_topic(partitions=3)
    prefix = f"o-{uuid.uuid4().hex[:10]}-"
    env = _env(broker, postgres_jdbc, topic, f"orders-api-{uuid.uuid4().hex[:10]}")
    argv = ["-m", "uvicorn", "examples.fastapi_orders:app", "--host", "127.0.0.1",
            "--port", "{port}", "--log-level", "warning"]  # fmt: skip
    app = App(argv, env, tmp_path)
    clients, per_client, kills = 4, 15, 2
    orders = [
        {"id": f"{prefix}{c}-{i}", "customer": f"customer-{c}", "amount_cents": 100 * c + i + 1}
        for c in range(clients)
        for i in range(per_client)
    ]
    answers: dict[str, int] = {}
    errors: Counter[str] = Counter()

    async def client(mine: list[dict[str, Any]], http: httpx.AsyncClient) -> None:
        for order in mine:
            answers[order["id"]] = await _post_until_answered(http, app, order, errors)

    async def killer(http: httpx.AsyncClient) -> None:
        await app.exited()  # killed by itself after its 10th database commit
        app.start()
        await app.ready(http)
        for k in range(1, kills + 1):  # then SIGKILLed by the test, whatever it is doing
            while len(answers) < (k + 1) * len(orders) // (kills + 2):
                await asyncio.sleep(0.01)
            app.kill()
            app.start()
            await app.ready(http)

    async def traffic() -> None:
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            await app.ready(http)
            await asyncio.gather(
                killer(http),
                *(client(orders[c::clients], http) for c in range(clients)),
            )
            again = await http.post(f"{app.url}/orders", json=orders[0])
            assert again.status_code == 200, again.text
            other = {**orders[0], "amount_cents": 7}
            conflict = await http.post(f"{app.url}/orders", json=other)
            assert conflict.status_code == 409, conflict.text

    app.start(["-c", CRASHING, "{port}", "10"])
    try:
        asyncio.run(traffic())
    finally:
        app.stop()
    assert app.starts == kills + 2
    assert sum(n for name, n in errors.items() if name != "503") >= kills + 1  # mid-traffic
    assert set(answers) == {o["id"] for o in orders} and set(answers.values()) <= {200, 201}
    # The order whose database commit the crash followed: committed by the next start(),
    # answered 200 when its client sent it again.
    assert Counter(answers.values())[200] >= 1
    expected = Counter((o["id"], o["customer"], o["amount_cents"]) for o in orders)
    assert Counter(_rows(postgres_jdbc, prefix)) == expected
    assert Counter(_events(broker, topic, len(orders))) == expected


def test_a_fenced_app_answers_500_and_fails_its_health_check(broker, postgres_jdbc, tmp_path):
    """A second instance with the same transactional id (run as a script this time)
    fences the first: the first answers POST /orders with 500 and GET /healthz with 503
    (restart me) and writes nothing; the second writes the same order (201), once."""
    topic = broker.create_topic(partitions=1)
    prefix = f"o-{uuid.uuid4().hex[:10]}-"
    env = _env(broker, postgres_jdbc, topic, f"orders-api-{uuid.uuid4().hex[:10]}")
    argv = ["examples/fastapi_orders.py", "--port", "{port}"]
    first, second = App(argv, env, tmp_path), App(argv, env, tmp_path)
    orders = [{"id": f"{prefix}{i}", "customer": "c", "amount_cents": i + 1} for i in range(2)]

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            await first.ready(http)
            created = await http.post(f"{first.url}/orders", json=orders[0])
            assert created.status_code == 201, created.text
            second.start()
            await second.ready(http)  # its start() fenced the first
            refused = await http.post(f"{first.url}/orders", json=orders[1])
            assert refused.status_code == 500, refused.text
            health = await http.get(f"{first.url}/healthz")
            assert health.status_code == 503 and "ProducerFencedError" in health.text
            created = await http.post(f"{second.url}/orders", json=orders[1])
            assert created.status_code == 201, created.text

    first.start()
    try:
        asyncio.run(scenario())
    finally:
        first.stop()
        second.stop()
    expected = Counter((o["id"], o["customer"], o["amount_cents"]) for o in orders)
    assert Counter(_rows(postgres_jdbc, prefix)) == expected
    assert Counter(_events(broker, topic, len(orders))) == expected


def _set_max_message_bytes(broker: Broker, topic: str, limit: int) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    entry = ConfigEntry("max.message.bytes", str(limit),
                        incremental_operation=AlterConfigOpType.SET)  # fmt: skip
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    admin = broker.admin()  # must outlive the futures
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=60)


def _uvicorn_app(broker: Broker, jdbc: str, topic: str, logs: Path) -> App:
    env = _env(broker, jdbc, topic, f"orders-api-{uuid.uuid4().hex[:10]}")
    return App(["-m", "uvicorn", "examples.fastapi_orders:app", "--port", "{port}"], env, logs)


def test_a_request_that_waits_too_long_is_answered_503_and_written_on_retry(
    broker, postgres_jdbc, tmp_path
):
    """While another session holds the writer's state-row lock longer than the app's
    lock_timeout (10 s), POST /orders is answered 503 with Retry-After, and nothing is
    written; the same POST once the lock is free is answered 201, and the order is a row
    and a record once each. The writer goes on: /healthz stays 200."""
    topic = broker.create_topic(partitions=1)
    prefix = f"o-{uuid.uuid4().hex[:10]}-"
    app = _uvicorn_app(broker, postgres_jdbc, topic, tmp_path)
    order = {"id": f"{prefix}0", "customer": "c", "amount_cents": 1}
    engine = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            await app.ready(http)
            with engine.connect() as holder:  # the lock, held until the rollback
                locked = holder.execute(
                    text("SELECT owner FROM kafka_transaction_state "
                         "WHERE transactional_id = :id FOR UPDATE"),
                    {"id": app.env["ORDERS_TRANSACTIONAL_ID"]},
                )  # fmt: skip
                assert len(locked.all()) == 1
                refused = await http.post(f"{app.url}/orders", json=order)
                holder.rollback()
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "1"
            assert _rows(postgres_jdbc, prefix) == []
            created = await http.post(f"{app.url}/orders", json=order)
            assert created.status_code == 201, created.text
            assert (await http.get(f"{app.url}/healthz")).status_code == 200

    app.start()
    try:
        asyncio.run(scenario())
    finally:
        app.stop()
        engine.dispose()
    expected = Counter([(order["id"], order["customer"], order["amount_cents"])])
    assert Counter(_rows(postgres_jdbc, prefix)) == expected
    assert Counter(_events(broker, topic, 1)) == expected


def test_a_record_kafka_refuses_is_answered_500_and_nothing_is_written(
    broker, postgres_jdbc, tmp_path
):
    """The broker refuses the order's record (larger than the topic's max.message.bytes:
    MESSAGE_REJECTED, which would fail again): POST /orders is answered 500, not 503,
    and nothing is written on either side; the writer goes on (/healthz 200)."""
    topic = broker.create_topic(partitions=1)
    _set_max_message_bytes(broker, topic, 100)  # an OrderCreated record is larger
    prefix = f"o-{uuid.uuid4().hex[:10]}-"
    app = _uvicorn_app(broker, postgres_jdbc, topic, tmp_path)
    order = {"id": f"{prefix}0", "customer": "c" * 64, "amount_cents": 1}

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            await app.ready(http)
            refused = await http.post(f"{app.url}/orders", json=order)
            assert refused.status_code == 500, refused.text
            assert "refuses this order's record" in refused.text
            assert (await http.get(f"{app.url}/healthz")).status_code == 200

    app.start()
    try:
        asyncio.run(scenario())
    finally:
        app.stop()
    assert _rows(postgres_jdbc, prefix) == []
    assert _events(broker, topic, 0) == []
