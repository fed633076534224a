"""``python -m kafka_txn.cli``: the ``kafka-txn`` console script."""

import sys

from kafka_txn.cli.main import main

sys.exit(main())
