"""The suite's plugins (tests/fixtures/: the broker, the three-broker cluster, the mock
cluster, the databases, Spark) and the markers every test gets from what it uses.
"""

from __future__ import annotations

import pytest

pytest_plugins = (
    "tests.fixtures.delivery_reports",
    "tests.fixtures.broker",
    "tests.fixtures.cluster",
    "tests.fixtures.mock_cluster",
    "tests.fixtures.databases",
    "tests.fixtures.spark",
)

# The folders whose tests each take tens of seconds (Spark jobs; fault schedules on the
# three-broker cluster), whatever the broker: `make test` runs them once, on Apache Kafka;
# the conformance matrix's extra brokers leave them out (-m "conformance and not slow").
# Other slow modules mark themselves.
_SLOW_FOLDERS = frozenset({"spark", "cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that talks to the broker is a conformance test (``pytest -m
    conformance``): it must pass unchanged on Apache Kafka named by
    KAFKA_BOOTSTRAP_SERVERS. A test talks to the broker when it asks for the ``broker``
    fixture, directly or through another fixture (``topic``, ``producer_config``, ...);
    it also gets the ``broker`` marker if its module did not set it."""
    for item in items:
        if "broker" in getattr(item, "fixturenames", ()):
            for name in ("broker", "conformance"):
                if item.get_closest_marker(name) is None:
                    item.add_marker(name)
        if item.path.parent.name in _SLOW_FOLDERS and item.get_closest_marker("slow") is None:
            item.add_marker("slow")
