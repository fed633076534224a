"""An unreachable broker or database, told in the sink's terms: the ``DualWriter`` the
sink runs (on the driver to settle, on the executors to write) names its own calls and
settings (``start()``, ``database``); a user of ``KafkaJdbcSink`` sets ``url``,
``user``, ``password`` and ``kafka.bootstrap.servers``, and Spark retries the task."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from kafka_txn.dualwrite.unavailable import SINK_TERMS, explain, raise_if_unavailable
from kafka_txn.errors import BrokerUnreachableError, DatabaseUnavailableError, root_exception
from kafka_txn.producer.reachability import restated

__all__ = ["check_database", "in_sink_terms"]

_AGAIN = (
    "then run the batch again (Spark retries a failed task, and a query restarted from "
    "its checkpoint replays the batch; nothing of it was written)"
)


def check_database(engine: Engine) -> None:
    """The sink's database opens, or ``DatabaseUnavailableError`` names the fix."""
    raise_if_unavailable(engine, "KafkaJdbcSink", SINK_TERMS)


@contextmanager
def in_sink_terms(where: str, engine: Engine | None = None) -> Iterator[None]:
    """Restate a ``BrokerUnreachableError`` or ``DatabaseUnavailableError`` raised by the
    sink's writers for ``where`` (``KafkaJdbcSink batch 3 partition 0``), with the sink's
    settings; ``engine`` is the database the writers use, for the restated message."""
    try:
        yield
    except BrokerUnreachableError as exc:
        again = f"check the sink's kafka.bootstrap.servers; {_AGAIN}"
        raise restated(exc, where, again) from root_exception(exc)
    except DatabaseUnavailableError as exc:
        cause = exc.__cause__
        if engine is None or not isinstance(cause, DBAPIError):
            raise
        raise DatabaseUnavailableError(
            f"{where}: {explain(cause, engine.url, SINK_TERMS)}; {_AGAIN}", url=exc.url
        ) from cause
