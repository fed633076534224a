"""An HTTP service that stores orders in a database and publishes an event for each to
Kafka, atomically (FastAPI with kafka-txn's AsyncDualWriter).

Scenario: POST /orders {"id", "customer", "amount_cents"} inserts a row into `orders` and
sends an OrderCreated record in one transaction: both or neither, even if the process is
killed between the two commits (the next start() finishes what it left). The client
chooses the order id (a UUID) and keeps it across retries: it is the primary key, so a
retried POST never creates a second order. The answers:

- 201 created; 200 this order exists (an earlier attempt committed it, its answer was
  lost), nothing written again; 409 this id exists with other content.
- 503, Retry-After: nothing written (the transaction aborted, the broker or the database
  did not answer in time, the request waited too long for its turn): retry, same id.
- 500, writer stopped (fenced by an instance with the same transactional id, a fatal
  error, a commit whose outcome recovery settles): /healthz answers 503 from then on, so
  that a liveness probe restarts the process. Retrying with the same id is safe.
- 500, Kafka refuses the record itself (MESSAGE_REJECTED: too large for the topic, say):
  it would fail again; nothing written.

One writer runs one transaction at a time (requests take turns): for more throughput run
more instances, each with its own transactional id, kept across its restarts.

Assumes: a database the JDBC URL reaches (the table is created if missing), a broker with
transactions. Environment: KAFKA_BOOTSTRAP_SERVERS (else 127.0.0.1:9092), ORDERS_JDBC_URL
(else jdbc:postgresql://127.0.0.1:5432/test?user=postgres), KAFKA_TXN_DB_PASSWORD,
ORDERS_TOPIC (orders), ORDERS_TRANSACTIONAL_ID (orders-api-0). Run with either of:

    python -m uvicorn examples.fastapi_orders:app --port 8000
    python examples/fastapi_orders.py --port 8000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, Field
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.exc import IntegrityError, OperationalError

from kafka_txn import (
    DatabaseCommitUnknownError,
    DatabaseUnavailableError,
    FailureType,
    FatalError,
    ProduceFailedException,
    TransactionAbortableError,
    TransactionInDoubtError,
    TransactionOutcomeUnknownError,
)
from kafka_txn.aio import AsyncDualWriter

log = logging.getLogger("fastapi_orders")

METADATA = MetaData()
ORDERS = Table(
    "orders",
    METADATA,
    Column("id", String(64), primary_key=True),  # the client's idempotency key
    Column("customer", String(64), nullable=False),
    Column("amount_cents", Integer, nullable=False),
)
# Nothing written on either side, and the writer goes on.
NOT_WRITTEN = (
    TransactionAbortableError,  # CommitFailedException, a lock or turn wait timed out
    TransactionOutcomeUnknownError,  # the last abort is not answered yet
    DatabaseUnavailableError,
    OperationalError,  # the database failed during the body
)
# The writer is stopped (every later call raises the same); the next start() settles it.
WRITER_STOPPED = (FatalError, DatabaseCommitUnknownError, TransactionInDoubtError)


class Order(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    customer: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(gt=0)


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str
    jdbc_url: str
    topic: str
    transactional_id: str

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ.get
        return cls(
            env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            env("ORDERS_JDBC_URL", "jdbc:postgresql://127.0.0.1:5432/test?user=postgres"),
            env("ORDERS_TOPIC", "orders"),
            env("ORDERS_TRANSACTIONAL_ID", "orders-api-0"),
        )


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        conf = {
            "bootstrap.servers": settings.bootstrap_servers,
            # Kept across restarts: start() then recovers what a killed process left.
            "transactional.id": settings.transactional_id,
            # Longer than a transaction plus a restart: see docs/guide/two-phase-commit.md.
            "transaction.timeout.ms": 120_000,
        }
        password = os.environ.get("KAFKA_TXN_DB_PASSWORD")  # else the URL's, if any
        # lock_timeout: how long a request waits for its turn and the state-row lock (then 503).
        writer = AsyncDualWriter(conf, settings.jdbc_url, password=password, lock_timeout=10.0)
        async with writer:  # start(): recovery, then it fences older instances; close() at exit
            async with writer.engine.begin() as conn:
                await conn.run_sync(METADATA.create_all)
            app.state.writer, app.state.stopped = writer, None
            yield

    app = FastAPI(title="orders", lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def create_order(order: Order, request: Request, response: Response) -> Order:
        writer: AsyncDualWriter = request.app.state.writer
        try:
            async with writer.transaction() as tx:
                await tx.connection.execute(insert(ORDERS).values(**order.model_dump()))
                event = {"type": "OrderCreated", **order.model_dump()}
                await tx.produce(settings.topic, json.dumps(event).encode(), key=order.id.encode())
        except IntegrityError:  # rolled back on both sides: this order, or another?
            async with writer.engine.connect() as conn:
                found = await conn.execute(select(ORDERS).where(ORDERS.c.id == order.id))
                row = found.mappings().one_or_none()
            if row is None:
                raise  # not the primary key: a bug, answered 500
            if Order.model_validate(dict(row)) != order:
                raise HTTPException(409, f"order {order.id} exists with other content") from None
            response.status_code = 200
        except NOT_WRITTEN as exc:
            record = exc.__cause__  # the record that failed the transaction, if one did
            if isinstance(record, ProduceFailedException) and (
                record.failure_type is FailureType.MESSAGE_REJECTED
            ):
                log.error("Kafka refuses the record of order %s: %s", order.id, record)
                raise HTTPException(500, "Kafka refuses this order's record") from exc
            log.warning("order %s not written, to be retried: %s", order.id, exc)
            raise HTTPException(503, "not written: retry", headers={"Retry-After": "1"}) from exc
        except WRITER_STOPPED as exc:
            log.critical("writer stopped, restart the process: %s", exc)
            request.app.state.stopped = exc
            raise HTTPException(500, "writer stopped: retry after a restart") from exc
        return order

    @app.get("/healthz")
    async def healthz(request: Request) -> dict[str, str]:
        stopped = request.app.state.stopped
        if stopped is not None:
            raise HTTPException(503, f"writer stopped ({type(stopped).__name__}): restart")
        return {"status": "ok"}

    return app


app = create_app(Settings.from_env())


def main(argv: Sequence[str] | None = None) -> int:
    defaults = Settings.from_env()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=defaults.bootstrap_servers)
    parser.add_argument("--jdbc-url", default=defaults.jdbc_url)
    parser.add_argument("--topic", default=defaults.topic)
    parser.add_argument("--transactional-id", default=defaults.transactional_id)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings(args.bootstrap_servers, args.jdbc_url, args.topic, args.transactional_id)
    uvicorn.run(create_app(settings), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
