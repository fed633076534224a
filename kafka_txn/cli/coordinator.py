"""What ``kafka-txn`` asks the transaction coordinator: DescribeTransactions for one
transactional id (KIP-664), retried until ``--timeout``, through kafka-txn's own
coordinator client (``kafka_txn.coordinator``), which reaches the cluster with the same
``-X`` security settings as the producer. Each failure becomes one line that says where
and what to check: a certificate kafka-txn does not trust, a login the broker refused, a
peer that is not a Kafka broker, a missing ACL.
"""

from __future__ import annotations

import ssl
import time
from typing import Any

from kafka_txn.cli.exits import EXIT_FAILED, CommandError, format_seconds, one_line
from kafka_txn.cli.settings import coordinator_settings
from kafka_txn.cli.terminal import Deadline, waiting
from kafka_txn.coordinator import CoordinatorClient, CoordinatorError
from kafka_txn.coordinator.client import TransactionDescription
from kafka_txn.coordinator.errors import (
    AuthenticationError,
    ProtocolError,
    SaslAuthenticationError,
)
from kafka_txn.errors import UnsupportedBrokerError

__all__ = ["describe_id", "unknown_to_coordinator"]


def describe_id(
    conf: dict[str, Any], transactional_id: str, deadline: Deadline
) -> TransactionDescription:
    """DescribeTransactions, retried until the deadline; a failure is one line that says
    where and what to check."""
    servers = conf["bootstrap.servers"]
    budget = deadline.left()
    started = time.monotonic()
    try:
        with (
            waiting(f"the transaction coordinator via {servers}", deadline),
            CoordinatorClient(
                coordinator_settings(conf, deadline), transactional_id, deadline_s=budget
            ) as client,
        ):
            return client.describe()
    except AuthenticationError as exc:
        if isinstance(exc.__cause__, ssl.SSLCertVerificationError):
            # Our side refused the broker's certificate, not the broker us. The
            # coordinator's message: "kafka-txn does not trust the TLS certificate of
            # ADDR (WHY): check ...".
            text = str(exc)
            detail = text.partition(" (")[2].rpartition("): check ")[0] or text
            raise CommandError(
                EXIT_FAILED,
                f"kafka-txn does not trust the TLS certificate of the broker at {servers}, "
                f"and did not connect: {detail} (-X ssl.ca.location, ssl.ca.pem, "
                "ssl.endpoint.identification.algorithm)",
            ) from exc
        settings = (
            # The broker refused the login (credentials, mechanism), not a TLS certificate.
            "-X sasl.username, sasl.password and sasl.mechanism (Apache Kafka answers an "
            "unknown user exactly as a wrong password)"
            if isinstance(exc, SaslAuthenticationError)
            else "the -X sasl.* and ssl.* settings"
        )
        raise CommandError(
            EXIT_FAILED,
            f"the broker at {servers} refused to authenticate kafka-txn ({exc}): check {settings}",
        ) from exc
    except ProtocolError as exc:
        # Retried until the deadline, unless retrying cannot help: a peer that is not
        # Kafka (or not TLS where security.protocol says so) fails at once, and its
        # error already says what it is and what to check.
        if time.monotonic() - started < 0.9 * budget:
            detail = one_line(str(exc))
            # The connection layer's message names the address it reached; say it once.
            raise CommandError(
                EXIT_FAILED,
                f"{servers} is not a usable Kafka broker: {detail.removeprefix(f'{servers} ')}",
            ) from exc
        raise CommandError(
            EXIT_FAILED,
            f"no usable answer from a Kafka broker at {servers} within "
            f"{format_seconds(deadline.seconds)}s ({one_line(str(exc))}): check "
            "--bootstrap-servers, that the broker runs, and -X security.protocol",
        ) from exc
    except CoordinatorError as exc:
        from confluent_kafka import KafkaError  # noqa: PLC0415

        if exc.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise CommandError(
                EXIT_FAILED,
                f"not authorized to describe transactional id {transactional_id!r}: grant "
                "DESCRIBE (and WRITE, to recover) on it to this principal",
            ) from exc
        raise CommandError(
            EXIT_FAILED,
            f"the transaction coordinator refused ({exc}) for {format_seconds(budget)}s",
        ) from exc
    except UnsupportedBrokerError as exc:
        raise CommandError(EXIT_FAILED, exc.message) from exc


def unknown_to_coordinator(transactional_id: str) -> str:
    return (
        f"transactional id {transactional_id!r} is unknown to the transaction coordinator "
        "(never used, or expired after transactional.id.expiration.ms): check the id and "
        "--bootstrap-servers"
    )
