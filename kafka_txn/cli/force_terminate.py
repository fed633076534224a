"""``kafka-txn force-terminate``: abort whatever is open for a transactional id, as
KIP-939's ``forceTerminateTransaction``: initialising the id (InitProducerId) makes the
coordinator abort its open transaction and bump the epoch, which fences every producer
still holding it. An id the coordinator does not know is not registered (exit 4).
"""

from __future__ import annotations

import argparse

from kafka_txn.cli.coordinator import describe_id, unknown_to_coordinator
from kafka_txn.cli.exits import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNKNOWN_ID,
    CommandError,
    failure_reason,
    format_seconds,
    raise_if_timeout_refused,
)
from kafka_txn.cli.fencing import OPEN_STATES, confirm_fencing, refuse_if_changed
from kafka_txn.cli.settings import kafka_settings
from kafka_txn.cli.terminal import Deadline, waiting
from kafka_txn.errors import KafkaTxnError, TransactionOutcomeUnknownError

__all__ = ["force_terminate"]


def force_terminate(args: argparse.Namespace) -> int:
    from kafka_txn.producer.transactional import TransactionalProducer  # noqa: PLC0415

    conf = kafka_settings(args)
    tid = args.transactional_id
    deadline = Deadline(args.timeout)
    before = describe_id(conf, tid, deadline)
    if not before.found:
        raise CommandError(
            EXIT_UNKNOWN_ID,
            f"{unknown_to_coordinator(tid)}; force-terminate does not register an id: "
            "nothing was done",
        )
    if confirm_fencing("force-terminate", tid, before, None, args.yes):
        deadline = Deadline(args.timeout)
        now = describe_id(conf, tid, deadline)
        refuse_if_changed("force-terminate", tid, before, None, now, None)
        before = now
    # KIP-939's forceTerminateTransaction: initialising the id aborts whatever is open
    # and fences every producer that still holds it (the coordinator bumps the epoch).
    try:
        with (
            waiting(f"the transaction coordinator of {tid!r}", deadline),
            TransactionalProducer(conf, operation_timeout=deadline.left()) as producer,
        ):
            producer.init_transactions()
    except TransactionOutcomeUnknownError as exc:
        raise CommandError(
            EXIT_FAILED,
            f"force-terminate of {tid!r} did not complete within "
            f"{format_seconds(deadline.seconds)}s ({failure_reason(exc)}): the broker may or "
            "may not have aborted its open transaction and fenced its producers. Run the same "
            "command again (it is safe to repeat), or check with kafka-txn describe",
        ) from exc
    except KafkaTxnError as exc:
        raise_if_timeout_refused(exc, conf, "")
        raise
    what = "open transaction aborted" if before.state in OPEN_STATES else "no transaction was open"
    print(
        f"{tid}: was {before.state} (producer id {before.producer_id}, epoch "
        f"{before.producer_epoch}); {what}, older producers fenced"
    )
    return EXIT_OK
