"""Two-phase commit, emulated client-side as KIP-939 describes it.

- ``prepare``: ``TwoPhase``, which prepares a transaction and completes a prepared one
  for ``TransactionalProducer`` (``prepare_transaction()``, ``complete_transaction()``).
- ``identity``: the producer id and epoch prepare names, read from librdkafka's
  statistics and confirmed by the coordinator after an abort (``IdentityTracker``).
- ``cluster``: the id of the cluster a prepared state belongs to (``ClusterId``).
- ``coordinator_calls``: the coordinator client two-phase commit sends DescribeTransactions
  and EndTxn with (``CoordinatorCalls``).
- ``failures``: the errors two-phase commit makes of what fails outside librdkafka, among
  them ``coordinator_failure``, the one translation of the coordinator client's failures.
- ``decisions``: recovery's decision table, a pure function of a stored
  ``PreparedTxnState`` and what the coordinator shows (``decide``).
- ``recovery``: the steps that carry a decision out (``recover``, ``Recovery``) and
  their ``TransactionOutcome``.

The state itself is ``kafka_txn.state.PreparedTxnState``; the public calls are the
producer's.
"""
