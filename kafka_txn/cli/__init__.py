"""``kafka-txn``, the command line: one module per subcommand, the parser in ``main``.

The console script runs ``kafka_txn.cli:main``; ``python -m kafka_txn.cli`` does the same.
"""

from kafka_txn.cli.main import main

__all__ = ["main"]
