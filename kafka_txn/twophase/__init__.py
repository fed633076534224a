"""Two-phase commit, emulated client-side as KIP-939 describes it.

- ``prepare``: ``TwoPhase``, which prepares a transaction and completes a prepared one
  for ``TransactionalProducer`` (``prepare_transaction()``, ``complete_transaction()``).
- ``recovery``: the decision table that settles a stored ``PreparedTxnState`` from what
  the coordinator shows, and the steps that carry the decision out.

The state itself is ``kafka_txn.state.PreparedTxnState``; the public calls are the
producer's.
"""
