"""Which streaming query a ``KafkaJdbcSink`` write belongs to (its commit markers and its
ownership of the prefix are per query).

Spark sets the local property ``sql.streaming.queryId`` on the thread that runs a
micro-batch, and foreachBatch's Python function sees it (py4j pins the function's calls
to that JVM thread), as does a ``pyspark.InheritableThread`` it starts; a plain
``threading.Thread`` does not. Taking such a write for a batch job would be silent loss:
a query restarted from a fresh checkpoint would not be refused, and its batch 0 would
find the first run's markers and be skipped. So, when the property is not visible, the
query is looked up among the application's active streaming queries by the DataFrame's
session (each query runs its batches in a session of its own); and when that finds none
while a query is active, the write is refused unless the caller names the query
(``query_id=``, ``""`` for a batch job).
"""

from __future__ import annotations

import logging
from typing import Any

from kafka_txn.errors import ConfigurationError
from kafka_txn.spark.ledger import BATCH_JOB

__all__ = ["QUERY_ID_PROPERTY", "resolve_query_id"]

log = logging.getLogger("kafka_txn.spark")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""Set by Spark's StreamExecution on the thread that runs a micro-batch: the query's id,
stable across restarts from the same checkpoint and new with a fresh one."""


def _active_queries(df: Any) -> tuple[list[str], str | None] | None:
    """The ids of the application's active streaming queries, and the one whose batch
    session is ``df``'s (if any); None if this Spark does not let us tell (internals: the
    shared state's map of active queries, each query's ``sparkSessionForStream``)."""
    try:
        session = df.sparkSession._jsparkSession
        active = list(session.sharedState().activeStreamingQueries().values())
    except Exception as exc:  # Spark Connect, another Spark version
        log.debug("cannot list the active streaming queries: %s", exc)
        return None
    ids: list[str] = []
    mine: str | None = None
    for execution in active:
        try:
            query = str(execution.id())
            ids.append(query)
            if mine is None and execution.sparkSessionForStream().equals(session):
                mine = query
        except Exception as exc:
            log.debug("cannot match a streaming query's session: %s", exc)
    return ids, mine


def resolve_query_id(df: Any, query_id: str | None, *, foreach_batch: bool) -> str:
    """The query id to write ``df`` under (``BATCH_JOB`` for a batch job), or raise
    ``ConfigurationError`` rather than guess (see the module docstring)."""
    visible = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if query_id is not None:
        if not isinstance(query_id, str) or len(query_id) > 64:
            raise ConfigurationError(
                "query_id must be a str of at most 64 characters (a streaming query's id, "
                f'or "" for a batch job), not {query_id!r:.80}'
            )
        if visible and visible != query_id:
            raise ConfigurationError(
                f"query_id={query_id!r} given, but this thread runs a batch of streaming "
                f"query {visible}: leave query_id out inside foreachBatch"
            )
        return query_id
    if visible:
        return str(visible)
    found = _active_queries(df)
    if found is not None and found[1] is not None:
        return found[1]  # the query whose batch this DataFrame is, seen from another thread
    if found is not None and not found[0]:
        # No streaming query runs, so no foreachBatch can be calling: a batch job, however
        # the sink was called.
        return BATCH_JOB
    if found is None and not foreach_batch:
        log.warning(
            "write() outside a streaming query's thread, active queries unknown: "
            "written as a batch job"
        )
        return BATCH_JOB
    where = (
        "the sink was called as foreachBatch's function" if foreach_batch else "write() was called"
    )
    raise ConfigurationError(
        f"{where} on a thread that does not see Spark's streaming query id (local property "
        f"{QUERY_ID_PROPERTY}, set on the thread running the micro-batch), "
        + (
            "and this DataFrame's query could not be found among the active ones"
            if found is not None
            else "and this Spark does not let the sink list the active queries"
        )
        + ". Writing it as a batch job could skip the query's batches (a restart from a "
        "fresh checkpoint would find the old markers). Call the sink on foreachBatch's own "
        "thread, or start your threads with pyspark.InheritableThread (they see the "
        "property), or pass write(df, batch_id, query_id=...) with the query's id (read "
        f"it on foreachBatch's thread: spark.sparkContext.getLocalProperty("
        f"{QUERY_ID_PROPERTY!r})); for a batch job written while a streaming query runs, "
        'pass query_id=""'
    )
