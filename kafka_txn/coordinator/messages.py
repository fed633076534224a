"""The requests the coordinator client sends, declared as data: API key, the versions
this client speaks, from which version the message is flexible, and the field schema of
each version. Field layouts follow Apache Kafka's JSON message specs
(clients/src/main/resources/common/message/*.json); tests cross-check the bytes against
kafka-python's encoder, which is generated from the same specs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kafka_txn.coordinator.codec import (
    BOOL,
    BYTES,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    STRING,
    Array,
    Schema,
    Struct,
)

__all__ = [
    "API_VERSIONS",
    "DESCRIBE_TRANSACTIONS",
    "END_TXN",
    "FIND_COORDINATOR",
    "INIT_PRODUCER_ID",
    "SASL_AUTHENTICATE",
    "SASL_HANDSHAKE",
    "Api",
]


@dataclass(frozen=True)
class Api:
    """One Kafka API as this client speaks it."""

    key: int
    name: str
    flexible_from: int
    requests: Mapping[int, Schema]
    responses: Mapping[int, Schema]

    @property
    def versions(self) -> range:
        return range(min(self.requests), max(self.requests) + 1)

    def flexible(self, version: int) -> bool:
        return version >= self.flexible_from

    def pick(self, broker_min: int, broker_max: int, ceiling: int | None = None) -> int:
        """The highest version both sides speak (capped at ``ceiling``), or -1."""
        top = min(broker_max, max(self.requests), ceiling if ceiling is not None else 1 << 15)
        low = max(broker_min, min(self.requests))
        return top if top >= low else -1


def _same(schema: Schema, versions: range) -> dict[int, Schema]:
    return dict.fromkeys(versions, schema)


# ApiVersions v0: the one every broker answers (its response header is always v0).
API_VERSIONS = Api(
    key=18,
    name="ApiVersions",
    flexible_from=3,
    requests={0: ()},
    responses={
        0: (
            ("error_code", INT16),
            (
                "api_keys",
                Array(Struct((("api_key", INT16), ("min_version", INT16), ("max_version", INT16)))),
            ),
        )
    },
)

_FIND_REQ = (("key", STRING), ("key_type", INT8))
_FIND_RESP = (
    ("throttle_time_ms", INT32),
    ("error_code", INT16),
    ("error_message", NULLABLE_STRING),
    ("node_id", INT32),
    ("host", STRING),
    ("port", INT32),
)
FIND_COORDINATOR = Api(
    key=10,
    name="FindCoordinator",
    flexible_from=3,
    requests={
        **_same(_FIND_REQ, range(1, 4)),
        # KIP-699 batches keys from v4 on; Kafka 4 brokers may speak only these.
        4: (("key_type", INT8), ("coordinator_keys", Array(STRING))),
    },
    responses={
        **_same(_FIND_RESP, range(1, 4)),
        4: (
            ("throttle_time_ms", INT32),
            (
                "coordinators",
                Array(
                    Struct(
                        (
                            ("key", STRING),
                            ("node_id", INT32),
                            ("host", STRING),
                            ("port", INT32),
                            ("error_code", INT16),
                            ("error_message", NULLABLE_STRING),
                        )
                    )
                ),
            ),
        ),
    },
)

DESCRIBE_TRANSACTIONS = Api(
    key=65,
    name="DescribeTransactions",
    flexible_from=0,
    requests={0: (("transactional_ids", Array(STRING)),)},
    responses={
        0: (
            ("throttle_time_ms", INT32),
            (
                "transaction_states",
                Array(
                    Struct(
                        (
                            ("error_code", INT16),
                            ("transactional_id", STRING),
                            ("transaction_state", STRING),
                            ("transaction_timeout_ms", INT32),
                            ("transaction_start_time_ms", INT64),
                            ("producer_id", INT64),
                            ("producer_epoch", INT16),
                            (
                                "topics",
                                Array(Struct((("topic", STRING), ("partitions", Array(INT32))))),
                            ),
                        )
                    )
                ),
            ),
        )
    },
)

_END_REQ = (
    ("transactional_id", STRING),
    ("producer_id", INT64),
    ("producer_epoch", INT16),
    ("committed", BOOL),
)
END_TXN = Api(
    key=26,
    name="EndTxn",
    flexible_from=3,
    # Never v5: it tells the coordinator that the client bumps the epoch on every
    # transaction (KIP-890 part 2), which librdkafka does not.
    requests=_same(_END_REQ, range(0, 5)),
    responses=_same((("throttle_time_ms", INT32), ("error_code", INT16)), range(0, 5)),
)

_INIT_V0: Schema = (("transactional_id", NULLABLE_STRING), ("transaction_timeout_ms", INT32))
_INIT_V3: Schema = (*_INIT_V0, ("producer_id", INT64), ("producer_epoch", INT16))
_INIT_RESP: Schema = (
    ("throttle_time_ms", INT32),
    ("error_code", INT16),
    ("producer_id", INT64),
    ("producer_epoch", INT16),
)
INIT_PRODUCER_ID = Api(
    key=22,
    name="InitProducerId",
    flexible_from=2,
    requests={
        **_same(_INIT_V0, range(0, 3)),
        **_same(_INIT_V3, range(3, 6)),
        # KIP-939: Enable2Pc and KeepPreparedTxn. Sent only to brokers that advertise v6.
        6: (*_INIT_V3, ("enable_2pc", BOOL), ("keep_prepared_txn", BOOL)),
    },
    responses={
        **_same(_INIT_RESP, range(0, 6)),
        6: (
            *_INIT_RESP,
            ("ongoing_txn_producer_id", INT64),
            ("ongoing_txn_producer_epoch", INT16),
        ),
    },
)

SASL_HANDSHAKE = Api(
    key=17,
    name="SaslHandshake",
    flexible_from=99,
    requests={1: (("mechanism", STRING),)},
    responses={1: (("error_code", INT16), ("mechanisms", Array(STRING)))},
)

SASL_AUTHENTICATE = Api(
    key=36,
    name="SaslAuthenticate",
    flexible_from=2,
    requests={1: (("auth_bytes", BYTES),)},
    responses={
        1: (
            ("error_code", INT16),
            ("error_message", NULLABLE_STRING),
            ("auth_bytes", BYTES),
            ("session_lifetime_ms", INT64),
        )
    },
)
