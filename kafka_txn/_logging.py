"""The library is silent unless the application configures logging.

Without any handler on a logger's path to the root, the standard library prints records
of level WARNING and above to stderr through ``logging.lastResort``: every librdkafka
connection failure forwarded to ``kafka_txn.librdkafka`` would then reach the terminal.
A ``NullHandler`` on the package's top logger stops that and nothing else: records still
propagate to whatever handlers the application installs (the Python logging HOWTO,
"Configuring Logging for a Library"). Imported by ``kafka_txn/__init__.py``, so it is in
place before any submodule logs.

librdkafka's own lines reach ``kafka_txn.librdkafka`` through confluent-kafka's ``logger``
setting, which queues them for ``poll()`` (librdkafka's threads cannot call Python): they
are logged when a call serves that queue. ``init_transactions()`` serves it between
slices of at most a second while it waits (``producer.reachability.SLICE_S``); other
blocking calls log theirs when they return or at the next ``poll()``.
"""

from __future__ import annotations

import logging

__all__ = ["LOGGER_NAME"]

LOGGER_NAME = "kafka_txn"


def _install() -> None:
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())


_install()
