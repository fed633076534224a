"""Bad input is refused before anything connects, with a message naming key and fix."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from kafka_txn import ConfigurationError, ProducerSettings, TransactionalProducer
from kafka_txn import config as config_module
from kafka_txn.config import TWO_PHASE_COMMIT_KEY, validate_config
from tests.support.fuzzing import assert_every_branch, reached_branches

BASE = {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"}


@pytest.mark.parametrize(
    ("conf", "needle"),
    [
        ({"bootstrap.servers": "127.0.0.1:1"}, "transactional.id is required"),
        ({**BASE, "transactional.id": "  "}, "transactional.id is required"),
        ({**BASE, "transactional.id": 7}, "transactional.id must be a string"),
        ({"transactional.id": "t"}, "bootstrap.servers is required"),
        ({**BASE, "enable.idempotence": False}, "enable.idempotence=false"),
        ({**BASE, "enable.idempotence": "false"}, "enable.idempotence=false"),
        ({**BASE, "enable.idempotence": "maybe"}, "not a boolean"),
        ({**BASE, "transaction.timeout.ms": 10}, "too small"),
        ({**BASE, "transaction.timeout.ms": "soon"}, "not a number"),
        ({**BASE, "on_delivery": "not callable"}, "on_delivery must be callable"),
        ({**BASE, "no.such.property": 1}, "no.such.property"),
        ({**BASE, "linger.ms": "not-a-number"}, "linger.ms"),
    ],
)
def test_bad_config_names_the_key(conf, needle):
    with pytest.raises(ConfigurationError) as info:
        TransactionalProducer(conf)
    assert needle in str(info.value)


def test_non_bytes_value_without_serializer_is_a_clear_type_error(producer_config, topic):
    with TransactionalProducer(producer_config) as p:
        p.init_transactions()
        p.begin_transaction()
        with pytest.raises(
            TypeError, match=r"value must be bytes, str or None, got dict.*value_serializer"
        ):
            p.produce(topic, {"a": 1})
        with pytest.raises(
            TypeError, match=r"key must be bytes, str or None, got int.*key_serializer"
        ):
            p.produce(topic, b"v", key=5)
        p.abort_transaction()


@pytest.mark.guarantee("1.2")
def test_serializers_are_applied_and_their_failures_reject_the_record(
    broker, producer_config, topic
):
    from kafka_txn import FailureType, ProduceFailedException

    def encode(obj, ctx):
        if obj == "bad":
            raise ValueError("cannot encode")
        return repr(obj).encode()

    with TransactionalProducer(producer_config, value_serializer=encode) as p:
        p.init_transactions()
        with p.transaction():
            p.produce(topic, {"a": 1})
        p.begin_transaction()
        with pytest.raises(ProduceFailedException) as info:
            p.produce(topic, "bad")
        assert info.value.failure_type is FailureType.MESSAGE_REJECTED
        p.abort_transaction()
    assert broker.read_committed(topic, expected=1) == [(None, b"{'a': 1}")]


def test_settings_model_builds_the_same_dict():
    settings = ProducerSettings(
        bootstrap_servers="127.0.0.1:1", transactional_id="t", extra={"linger.ms": 5}
    )
    by_alias = ProducerSettings.model_validate(
        {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t", "extra": {"linger.ms": 5}}
    )
    assert settings == by_alias
    validated = validate_config(settings)
    assert validated.librdkafka["linger.ms"] == 5
    assert validated.librdkafka["enable.idempotence"] is True
    assert validated.transaction_timeout_ms == 60_000


# ---------------------------------------------------------------- fuzzing validate_config
# Every example is a valid configuration (each setting kafka-txn checks, in one of its
# accepted spellings, plus other librdkafka properties) with zero, one or two of its parts
# broken; the refusal (or the success) each break should lead to is known when it is made.
# A break refuses with a ConfigurationError naming the key and the fix, never another
# exception; with no break the config validates as it says.
_TRUE_SPELLINGS = (True, "true", "True", " TRUE ", "1", "yes", "on", 1)
_FALSE_SPELLINGS = (False, "false", "False", " FALSE", "0", "no", "off", 0)
_NOT_BOOLEANS = st.one_of(
    st.sampled_from(["maybe", "2", "tru", "", "none", "1.0", "y"]),
    st.none(),
    st.floats(allow_nan=True),  # str(0.0) is "0.0": no boolean
    st.text(max_size=8).filter(
        lambda t: t.strip().lower() not in config_module._TRUE | config_module._FALSE
    ),
)
_BLANK = st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003\u3000", max_size=5)
_OTHER_PROPERTIES = st.dictionaries(
    st.sampled_from(
        [
            "linger.ms",
            "acks",
            "client.id",
            "compression.type",
            "retries",
            "sasl.password",
            "batch.num.messages",
        ]
    ),
    st.one_of(st.integers(), st.text(max_size=10), st.booleans()),
    max_size=3,
)
_FLAGS = (
    "enable.idempotence",
    "enable_idempotence",
    "delivery.report.only.error",
    TWO_PHASE_COMMIT_KEY,
)


@dataclass
class _ConfigCase:
    """A config, how it is passed, and what validating it must give: the refusals its
    breaks may lead to (the first check that fails wins), or the validated values."""

    conf: Any
    form: str = "dict"
    refusals: list[tuple[str, str]] = field(default_factory=list)
    timeout_ms: int = 60_000
    two_phase: bool = False
    errors_only: bool = False

    def conf_for_validation(self) -> Any:
        if self.form == "Mapping" and isinstance(self.conf, dict):
            return _ReadOnlyConfig(self.conf)
        return self.conf


@st.composite
def _valid_configs(draw: st.DrawFn) -> _ConfigCase:
    conf: dict[Any, Any] = dict(draw(_OTHER_PROPERTIES))
    conf["transactional.id"] = draw(st.text(min_size=1, max_size=20).filter(str.strip))
    servers = draw(st.sampled_from(["bootstrap.servers", "test.mock.num.brokers", "both"]))
    if servers in ("bootstrap.servers", "both"):
        conf["bootstrap.servers"] = "127.0.0.1:9092"
    if servers in ("test.mock.num.brokers", "both"):
        conf["test.mock.num.brokers"] = 1
    for key in ("enable.idempotence", "enable_idempotence"):
        if draw(st.booleans()):
            conf[key] = draw(st.sampled_from(_TRUE_SPELLINGS))
    if draw(st.booleans()):
        case_errors_only = draw(st.booleans())
        spellings = _TRUE_SPELLINGS if case_errors_only else _FALSE_SPELLINGS
        conf["delivery.report.only.error"] = draw(st.sampled_from(spellings))
    case = _ConfigCase(conf, form=draw(st.sampled_from(["dict", "Mapping"])))
    if "delivery.report.only.error" in conf:
        case.errors_only = case_errors_only
    if draw(st.booleans()):
        case.timeout_ms = draw(st.integers(min_value=1000, max_value=2**31 - 1))
        conf["transaction.timeout.ms"] = draw(
            st.sampled_from(
                [
                    case.timeout_ms,
                    str(case.timeout_ms),
                    f" {case.timeout_ms} ",
                    float(case.timeout_ms),
                ]
            )
        )
    if draw(st.booleans()):
        case.two_phase = draw(st.booleans())
        spellings = _TRUE_SPELLINGS if case.two_phase else _FALSE_SPELLINGS
        conf[TWO_PHASE_COMMIT_KEY] = draw(st.sampled_from(spellings))
    for key in sorted(draw(st.sets(st.sampled_from(config_module._CALLBACK_KEYS)))):
        conf[key] = draw(st.sampled_from([print, _upper, lambda *a: None, _ReadOnlyConfig]))
    return case


def _break_type(draw: st.DrawFn, case: _ConfigCase) -> None:
    case.conf = draw(st.sampled_from([list(case.conf.items()), "bootstrap.servers=h:1", None, 7]))
    case.refusals.append(("not a mapping", "config must be a dict"))


def _break_key(draw: st.DrawFn, case: _ConfigCase) -> None:
    key = draw(
        st.one_of(st.integers(), st.none(), st.binary(max_size=5), st.tuples(st.text(max_size=3)))
    )
    case.conf[key] = draw(st.text(max_size=5))
    case.refusals.append(("key not a string", repr(key)))


def _break_transactional_id(draw: st.DrawFn, case: _ConfigCase) -> None:
    how = draw(st.sampled_from(["missing", "None", "blank", "not a string"]))
    if how == "missing":
        case.conf.pop("transactional.id", None)
    elif how == "not a string":
        case.conf["transactional.id"] = draw(
            st.one_of(
                st.integers(), st.binary(max_size=5), st.lists(st.text(max_size=2), max_size=2)
            )
        )
        case.refusals.append(("transactional.id not a string", "transactional.id"))
        return
    else:
        case.conf["transactional.id"] = None if how == "None" else draw(_BLANK)
    case.refusals.append(("transactional.id missing", "transactional.id"))


def _break_servers(draw: st.DrawFn, case: _ConfigCase) -> None:
    case.conf.pop("bootstrap.servers", None)
    case.conf.pop("test.mock.num.brokers", None)
    how = draw(st.sampled_from(["missing", "blank", "not a string"]))
    if how == "not a string":
        case.conf["bootstrap.servers"] = draw(st.one_of(st.integers(), st.floats()))
        case.refusals.append(("bootstrap.servers not a string", "bootstrap.servers"))
        return
    if how == "blank":
        case.conf["bootstrap.servers"] = draw(st.one_of(st.none(), _BLANK))
    case.refusals.append(("bootstrap.servers missing", "bootstrap.servers"))


def _forbid_flag(key: str, draw: st.DrawFn, case: _ConfigCase) -> None:
    case.conf[key] = draw(st.sampled_from(_FALSE_SPELLINGS))
    case.refusals.append(("idempotence off", key))


def _garble_flag(key: str, draw: st.DrawFn, case: _ConfigCase) -> None:
    case.conf[key] = draw(_NOT_BOOLEANS)
    case.refusals.append((f"not a boolean: {key}", key))


def _garble_timeout(draw: st.DrawFn, case: _ConfigCase) -> None:
    case.conf["transaction.timeout.ms"] = draw(
        st.one_of(
            st.text(alphabet="abcxyz.-e ", max_size=6),
            st.none(),
            st.sampled_from([float("nan"), float("inf"), -float("inf"), "1e4", [5000]]),
        )
    )
    case.refusals.append(("timeout not a number", "transaction.timeout.ms"))


def _shorten_timeout(draw: st.DrawFn, case: _ConfigCase) -> None:
    small = draw(st.integers(max_value=999))
    case.conf["transaction.timeout.ms"] = draw(st.sampled_from([small, str(small)]))
    case.refusals.append(("timeout too small", "transaction.timeout.ms"))


def _break_callback(draw: st.DrawFn, case: _ConfigCase) -> None:
    key = draw(st.sampled_from(config_module._CALLBACK_KEYS))
    case.conf[key] = draw(st.one_of(st.none(), st.integers(), st.text(max_size=5)))
    case.refusals.append(("callback not callable", key))


# One break per refusal, so that each is drawn as often as the others.
_BREAKS = [
    _break_type,
    _break_key,
    _break_transactional_id,
    _break_servers,
    partial(_forbid_flag, "enable.idempotence"),
    *(partial(_garble_flag, key) for key in _FLAGS),
    _garble_timeout,
    _shorten_timeout,
    _break_callback,
]


@st.composite
def config_cases(
    draw: st.DrawFn, breaks: st.SearchStrategy[list[Any]] | None = None
) -> _ConfigCase:
    """A valid config with the ``breaks`` drawn (by default: none, one or two of any)."""
    case = draw(_valid_configs())
    for brk in draw(
        breaks if breaks is not None else st.lists(st.sampled_from(_BREAKS), max_size=2)
    ):
        if isinstance(case.conf, dict):  # a config that is no mapping stays so
            brk(draw, case)
    return case


# Refusal -> what its message must say: the key (filled in) and the fix.
_REFUSAL_TEXT = {
    "not a mapping": "a dict of librdkafka properties or a ProducerSettings",
    "key not a string": "is not a string: librdkafka properties are named by strings",
    "transactional.id missing": "transactional.id is required: set it to a name that is stable",
    "transactional.id not a string": "must be a string, got .*: set it to a name that is stable",
    "bootstrap.servers missing": "bootstrap.servers is required: set it to 'host:port",
    "bootstrap.servers not a string": "must be a string 'host:port\\[,host:port...\\]', got ",
    "idempotence off": "=false cannot be used: transactions need the idempotent producer; "
    "remove the key",
    "timeout not a number": "is not a number of milliseconds: use a whole number, at least 1000",
    "timeout too small": "is too small: use at least 1000 ms",
    "callback not callable": "must be callable, got .*: pass a function, or remove the key",
    **{f"not a boolean: {key}": "is not a boolean: use true or false" for key in _FLAGS},
}
CONFIG_BRANCHES = {"valid", *_REFUSAL_TEXT}


def _check_config(case: _ConfigCase) -> str:
    """Validate one case; assert the outcome it must have; return its branch."""
    before = dict(case.conf) if isinstance(case.conf, dict) else None
    try:
        validated = validate_config(case.conf_for_validation())
    except ConfigurationError as exc:
        message = str(exc)
        matching = [
            (branch, key)
            for branch, key in case.refusals
            if key in message and re.search(_REFUSAL_TEXT[branch], message)
        ]
        assert matching, f"{message!r} is none of the refusals expected: {case.refusals}"
        return matching[0][0]
    finally:
        if before is not None:
            assert case.conf == before  # the caller's dict is left as it was
    assert not case.refusals, f"{case.conf!r} validated, expected {case.refusals}"
    conf = case.conf
    assert validated.librdkafka["enable.idempotence"] is True
    assert validated.transactional_id == conf["transactional.id"]
    assert validated.transaction_timeout_ms == case.timeout_ms
    assert validated.two_phase_commit is case.two_phase
    assert validated.error_reports_only is case.errors_only
    assert TWO_PHASE_COMMIT_KEY not in validated.librdkafka
    callbacks = {k: conf[k] for k in config_module._CALLBACK_KEYS if k in conf}
    assert dict(validated.callbacks) == callbacks  # split off, the same objects
    assert all(validated.callbacks[k] is cb for k, cb in callbacks.items())
    dropped = {*callbacks, TWO_PHASE_COMMIT_KEY, "enable.idempotence"}
    passed = {k: v for k, v in conf.items() if k not in dropped}
    if "delivery.report.only.error" in passed:  # any spelling, as the bool it means
        passed["delivery.report.only.error"] = case.errors_only
    assert {k: validated.librdkafka[k] for k in passed} == passed  # the rest as given
    assert set(validated.librdkafka) == {*passed, "enable.idempotence"}
    return "valid"


@given(config_cases())
def test_fuzz_validate_config_refuses_by_name_or_validates(case: _ConfigCase):
    branch = _check_config(case)
    event(branch)
    event(f"passed as {case.form}")


def test_fuzz_validate_config_reaches_every_branch():
    counts = reached_branches(config_cases(), _check_config, examples=200)
    for brk in _BREAKS:  # each break alone, then with another
        counts += reached_branches(config_cases(st.just([brk])), _check_config, examples=15)
        counts += reached_branches(
            config_cases(st.tuples(st.just(brk), st.sampled_from(_BREAKS)).map(list)),
            _check_config,
            examples=10,
        )
    assert_every_branch(counts, CONFIG_BRANCHES)
    assert counts["valid"] >= 50, counts  # the success path is no rarity


@pytest.mark.parametrize(
    "value", [float("inf"), -float("inf"), float("nan")], ids=["inf", "-inf", "nan"]
)
def test_a_timeout_that_is_no_number_is_a_configuration_error(value: float):
    # int(float("inf")) raises OverflowError, which escaped as such before (found by the
    # fuzz once it got past the first checks).
    with pytest.raises(ConfigurationError, match="is not a number of milliseconds"):
        validate_config({**BASE, "transaction.timeout.ms": value})


# ---------------------------------------------------------------- fuzzing ProducerSettings
# Valid settings (each field under its name or its librdkafka name) with zero, one or two
# fields broken: every broken field is named in the one ConfigurationError, with its fix,
# and no value from extra (where secrets live) is repeated; valid settings build the
# librdkafka dict they stand for.
_SECRET = "hunter2-not-shown"
_FIELD_TEXT = {
    "bootstrap_servers": "bootstrap_servers (bootstrap.servers)",
    "transactional_id": "transactional_id (transactional.id)",
    "transaction_timeout_ms": "transaction_timeout_ms (transaction.timeout.ms)",
    "two_phase_commit": f"two_phase_commit ({TWO_PHASE_COMMIT_KEY})",
    "extra": "extra",
}


@dataclass
class _SettingsCase:
    kwargs: dict[str, Any]
    form: str
    broken: dict[str, str] = field(default_factory=dict)  # field -> how
    expected: dict[str, Any] = field(default_factory=dict)


def _spelled(draw: st.DrawFn, name: str) -> str:
    alias = ProducerSettings.model_fields[name].validation_alias
    return draw(st.sampled_from([name, alias])) if isinstance(alias, str) else name


@st.composite
def settings_cases(
    draw: st.DrawFn, breaks: st.SearchStrategy[list[str]] | None = None
) -> _SettingsCase:
    """Valid settings with the ``breaks`` drawn (by default: none, one or two fields)."""
    expected: dict[str, Any] = {
        "bootstrap_servers": draw(st.text(min_size=1, max_size=20).filter(str.strip)),
        "transactional_id": draw(st.text(min_size=1, max_size=20).filter(str.strip)),
        "transaction_timeout_ms": 60_000,
        "two_phase_commit": False,
        "extra": {**draw(_OTHER_PROPERTIES), "sasl.password": _SECRET},
    }
    values = {name: expected[name] for name in ("bootstrap_servers", "transactional_id", "extra")}
    if draw(st.booleans()):
        expected["transaction_timeout_ms"] = ms = draw(st.integers(1000, 2**31 - 1))
        values["transaction_timeout_ms"] = draw(st.sampled_from([ms, str(ms), float(ms)]))
    if draw(st.booleans()):
        expected["two_phase_commit"] = flag = draw(st.booleans())
        values["two_phase_commit"] = draw(st.sampled_from([flag, str(flag).lower(), int(flag)]))
    case = _SettingsCase({}, draw(st.sampled_from(["keywords", "model_validate", "json"])))
    case.expected = expected
    names = st.sampled_from([*_SETTINGS_BREAKS, "unknown field"])
    for name in draw(breaks if breaks is not None else st.lists(names, max_size=2, unique=True)):
        if name == "unknown field":  # a name that is no field
            unknown = draw(st.sampled_from(["bootstrap_server", "transactionalid", "linger.ms",
                                            "acks", "timeout_ms"]))  # fmt: skip
            values[unknown] = 5
            case.broken[unknown] = "not a field"
            continue
        how, value = draw(_SETTINGS_BREAKS[name])
        case.broken[name] = how
        if how == "missing":
            values.pop(name, None)
        else:
            values[name] = value
    case.kwargs = {
        _spelled(draw, name) if name in _FIELD_TEXT else name: value
        for name, value in values.items()
    }
    return case


_SETTINGS_BREAKS: dict[str, st.SearchStrategy[tuple[str, Any]]] = {
    "bootstrap_servers": st.tuples(st.just("missing"), st.none())
    | st.tuples(st.just("bad"), st.sampled_from(["", " \t", 9092, None, ["h:1"]])),
    "transactional_id": st.tuples(st.just("missing"), st.none())
    | st.tuples(st.just("bad"), st.sampled_from(["", " \t", "x" * 32768, 7, None, ["t"]])),
    "transaction_timeout_ms": st.tuples(
        st.just("bad"),
        st.one_of(
            st.integers(max_value=999),
            st.sampled_from(["soon", "1500.5", 1500.5, None, "1e4", True]),
        ),
    ),
    "two_phase_commit": st.tuples(
        st.just("bad"), st.sampled_from(["maybe", 2, None, "yes please", 0.5])
    ),
    "extra": st.tuples(
        st.just("bad"),
        st.sampled_from(
            [
                5,
                "linger.ms=5",
                ["linger.ms"],
                {"": 1, "sasl.password": _SECRET},
                {5: _SECRET},
                {None: 1},
            ]
        ),
    ),
}


def _build_settings(case: _SettingsCase) -> ProducerSettings:
    if case.form == "model_validate":
        return ProducerSettings.model_validate(case.kwargs)
    if case.form == "json":
        try:
            text = json.dumps(case.kwargs)
        except TypeError:  # a value JSON cannot hold
            text = ""
        if text and json.loads(text) == case.kwargs:  # JSON would not turn 5 into "5"
            return ProducerSettings.model_validate_json(text)
    return ProducerSettings(**case.kwargs)


def _check_settings(case: _SettingsCase) -> str:
    """Build one case; assert the outcome it must have; return its branch."""
    try:
        settings = _build_settings(case)
    except ConfigurationError as exc:
        from pydantic import ValidationError

        message = str(exc)
        assert not isinstance(exc, ValidationError) and message.startswith("bad ProducerSettings")
        assert case.broken, f"valid settings refused: {message}"
        assert _SECRET not in message  # extra's values are never repeated
        for name, how in case.broken.items():
            if how == "not a field":
                assert f"{name!r} is not a ProducerSettings field" in message, message
            elif how == "missing":
                assert f"{_FIELD_TEXT[name]} is required" in message, message
            else:
                assert _FIELD_TEXT[name] in message, message
            if name in config_module._SETTINGS_FIXES:
                assert config_module._SETTINGS_FIXES[name] in message, message
        if len(case.broken) > 1:
            return "refused: several"
        ((name, how),) = case.broken.items()
        return "refused: unknown field" if how == "not a field" else f"refused: {name}"
    assert not case.broken, f"{case.kwargs!r} built, expected refusals for {case.broken}"
    for name, value in case.expected.items():
        assert getattr(settings, name) == value
    conf = settings.to_librdkafka()
    validated = validate_config(settings)
    # KIP-939's flag is kafka-txn's, read off before librdkafka sees the dict.
    assert conf.get(TWO_PHASE_COMMIT_KEY, False) is case.expected["two_phase_commit"]
    without_flag = {k: v for k, v in conf.items() if k != TWO_PHASE_COMMIT_KEY}
    assert validated.librdkafka == {**without_flag, "enable.idempotence": True}
    assert (validated.transactional_id, validated.transaction_timeout_ms) == (
        case.expected["transactional_id"],
        case.expected["transaction_timeout_ms"],
    )
    assert validated.two_phase_commit is case.expected["two_phase_commit"]
    assert ProducerSettings.model_validate(settings.model_dump(by_alias=True)) == settings
    return "valid"


SETTINGS_BRANCHES = {
    "valid",
    "refused: several",
    "refused: unknown field",
    *(f"refused: {name}" for name in _FIELD_TEXT),
}


@given(settings_cases())
def test_fuzz_producer_settings_refuse_every_bad_field_or_build(case: _SettingsCase):
    event(_check_settings(case))
    for name, how in case.broken.items():
        event(f"{name} {how}")


def test_fuzz_producer_settings_reaches_every_branch():
    counts = reached_branches(settings_cases(), _check_settings, examples=200)
    for name in [*_SETTINGS_BREAKS, "unknown field"]:  # each break alone, then with another
        counts += reached_branches(settings_cases(st.just([name])), _check_settings, examples=15)
        other = st.sampled_from([n for n in _SETTINGS_BREAKS if n != name])
        counts += reached_branches(
            settings_cases(st.tuples(st.just(name), other).map(list)), _check_settings, examples=10
        )
    assert_every_branch(counts, SETTINGS_BRANCHES)
    assert counts["valid"] >= 50, counts


# ---------------------------------------------------------------- ProducerSettings errors
@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({}, ["bootstrap_servers (bootstrap.servers) is required", "host:port"]),
        (
            {"bootstrap_servers": "", "transactional_id": "t"},
            ["bootstrap_servers (bootstrap.servers)=''", "host:port"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": ""},
            ["transactional_id (transactional.id)", "stable across restarts"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": "t", "transaction_timeout_ms": 10},
            ["transaction_timeout_ms (transaction.timeout.ms)=10", "at least 1000"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": "t", "two_phase_commit": "maybe"},
            ["two_phase_commit (transaction.two.phase.commit.enable)", "True or False"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": "t", "extra": {"": 1}},
            ["extra", "not a librdkafka name"],
        ),
        (
            {"bootstrap_servers": "b", "transactional_id": "t", "extra": 5},
            ["extra", "dict keyed by their librdkafka names"],
        ),
        (
            {"bootstrap_server": "b", "transactional_id": "t"},
            ["'bootstrap_server' is not a ProducerSettings field", "'bootstrap_servers'"],
        ),
        (
            {"bootstrap.servers": "b", "transactional.id": "t", "linger.ms": 5},
            ["'linger.ms' is not a ProducerSettings field", "extra={'linger.ms': ...}"],
        ),
    ],
)
def test_settings_errors_are_configuration_errors_naming_field_and_fix(kwargs, needles):
    from pydantic import ValidationError

    with pytest.raises(ConfigurationError) as info:
        ProducerSettings(**kwargs)
    exc = info.value
    assert not isinstance(exc, ValidationError)
    for needle in needles:
        assert needle in str(exc)
    assert exc.__cause__ is None and exc.__suppress_context__  # wrapped once, no chain


_EMPTY_SERVERS = {"bootstrap.servers": "", "transactional.id": "t"}


@pytest.mark.parametrize(
    "validate",
    [
        lambda: ProducerSettings.model_validate(_EMPTY_SERVERS),
        lambda: ProducerSettings.model_validate_json(json.dumps(_EMPTY_SERVERS)),
        lambda: ProducerSettings.model_validate_strings(_EMPTY_SERVERS),
    ],
    ids=["model_validate", "model_validate_json", "model_validate_strings"],
)
def test_settings_validation_raises_one_configuration_error(validate):
    with pytest.raises(ConfigurationError) as info:
        validate()
    text = str(info.value)
    # pydantic runs validation through __init__: the error is not wrapped a second time.
    assert text.count("bad ProducerSettings") == 1 and "Value error" not in text
    assert "bootstrap_servers (bootstrap.servers)=''" in text
    assert info.value.__cause__ is None


def test_settings_errors_do_not_repeat_secrets():
    with pytest.raises(ConfigurationError) as info:
        ProducerSettings(bootstrap_servers=1, transactional_id="t", **{"sasl.password": "hunter2"})
    assert "'sasl.password' is not a ProducerSettings field" in str(info.value)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        ProducerSettings(bootstrap_servers="b", transactional_id="t", extra={5: "hunter2"})
    assert "extra" in str(info.value) and "hunter2" not in str(info.value)


def test_settings_accept_any_mapping_and_librdkafka_names():
    from types import MappingProxyType

    settings = ProducerSettings(
        bootstrap_servers="b", transactional_id="t", extra=MappingProxyType({"linger.ms": 5})
    )
    assert settings.to_librdkafka()["linger.ms"] == 5
    by_name = ProducerSettings(**{"bootstrap.servers": "b", "transactional.id": "t"})
    assert by_name.bootstrap_servers == "b"
    assert settings.model_dump(by_alias=True)["bootstrap.servers"] == "b"


# ---------------------------------------------------------------- Mapping configs
class _ReadOnlyConfig(Mapping):
    """A Mapping that is not a dict (as a config loaded by a settings library may be)."""

    def __init__(self, data: dict) -> None:
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def test_producer_takes_a_mapping_config(broker, producer_config, topic):
    with TransactionalProducer(_ReadOnlyConfig(producer_config)) as p:
        p.init_transactions()
        with p.transaction():
            p.produce(topic, b"from a mapping")
    assert broker.read_committed(topic, expected=1) == [(None, b"from a mapping")]


def test_dual_writer_takes_a_mapping_config_and_the_producer_keywords(
    broker, producer_config, topic, tmp_path
):
    from kafka_txn import DualWriter
    from kafka_txn.metrics import InMemoryMetrics

    url = f"jdbc:sqlite:{tmp_path / 'w.db'}"
    with pytest.raises(ConfigurationError, match="operation_timeout=0"):
        DualWriter(MappingProxyType(producer_config), url, operation_timeout=0)
    with pytest.raises(TypeError, match="operation_timout"):
        DualWriter(producer_config, url, operation_timout=1)  # a typo is refused
    metrics = InMemoryMetrics()
    conf = _ReadOnlyConfig(producer_config)
    # DualWriter.__enter__ runs start(), before the transaction begins.
    with (
        DualWriter(conf, url, metrics=metrics, value_serializer=_upper) as writer,
        writer.transaction() as tx,
    ):
        tx.produce(topic, "mapped")
    assert broker.read_committed(topic, expected=1) == [(None, b"MAPPED")]
    assert metrics.calls[("commit_transaction", True)] >= 1, metrics.calls


def _upper(value, ctx):
    return value.upper().encode()


def test_exactly_once_processor_takes_mapping_configs(broker, producer_config, topic):
    from kafka_txn.eos import ExactlyOnceProcessor, OutputRecord

    out = broker.create_topic()
    with TransactionalProducer({**producer_config, "transactional.id": f"in-{topic}"}) as p:
        p.init_transactions()
        with p.transaction():
            p.produce(topic, b"in", partition=0)
    consumer = MappingProxyType(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": f"g-{topic}"}
    )
    processor = ExactlyOnceProcessor(
        consumer,
        _ReadOnlyConfig(producer_config),
        [topic],
        lambda record: [OutputRecord(out, record.value() + b"-out")],
    )
    processor.run(max_batches=1, idle_timeout=60)
    assert broker.read_committed(out, expected=1) == [(None, b"in-out")]


def test_spark_sink_takes_mapping_options():
    from kafka_txn import KafkaJdbcSink

    sink = KafkaJdbcSink(
        transactional_id_prefix="p",
        url="jdbc:sqlite:/tmp/never-opened.db",
        dbtable="t",
        kafka=MappingProxyType({"bootstrap.servers": "127.0.0.1:1"}),
        options=_ReadOnlyConfig({"topic": "out"}),
    )
    assert sink.kafka == {"bootstrap.servers": "127.0.0.1:1"}
    assert sink.topic == "out"


# ---------------------------------------------------------------- mistakes named with the fix
@pytest.mark.guarantee("1.17")
@pytest.mark.parametrize(
    ("conf", "needles"),
    [
        (
            {"bootstrap.servers": ["a:9092", "b:9092"], "transactional.id": "t"},
            ["bootstrap.servers must be one string, got a list",
             "join the addresses with commas", "'a:9092,b:9092'"],
        ),
        (
            {"bootstrap.servers": ("a:9092",), "transactional.id": "t"},
            ["got a tuple", "'a:9092'"],
        ),
        (
            {"bootstrap.servers": "a:9092", "transactionl.id": "t"},
            ["transactional.id is required", "did you mean it instead of 'transactionl.id'?"],
        ),
        (
            {"bootstrap.servers": "a:9092", "transactional_id": "t"},
            ["transactional.id is required", "instead of 'transactional_id'?"],
        ),
        (
            {"bootstrap.server": "a:9092", "transactional.id": "t"},
            ["bootstrap.servers is required", "did you mean it instead of 'bootstrap.server'?"],
        ),
        (
            {**BASE, "operation_timeout": 30},
            ["'operation_timeout' is not a librdkafka property but a keyword argument",
             "pass operation_timeout=... to TransactionalProducer"],
        ),
        (
            {**BASE, "value.serializer": str.encode},
            ["'value.serializer' is not a librdkafka property", "pass value_serializer=..."],
        ),
        ({**BASE, "linger.ms": None}, ["linger.ms is set to a NoneType", "remove the key"]),
        (
            {**BASE, "sasl.password": ["hunter2"]},
            ["sasl.password is set to a list", "give it as a string"],
        ),
        ({**BASE, "client.id": b"me"}, ["client.id is set to a bytes", "give it as a string"]),
        ({**BASE, "bootstrap.servers": ""}, ["bootstrap.servers is required", "host:port"]),
        ({**BASE, "bootstrap.servers": " \t"}, ["bootstrap.servers is required", "host:port"]),
        ({**BASE, "bootstrap.servers": None}, ["bootstrap.servers is required", "host:port"]),
        (
            {**BASE, "bootstrap.servers": 9092},
            ["bootstrap.servers must be a string 'host:port[,host:port...]', got 9092 (int)"],
        ),
        (
            {**BASE, "tracing": object()},
            ["'tracing' is not a librdkafka property", "pass tracing=... to TransactionalProducer"],
        ),
        ({**BASE, "sleep": print}, ["'sleep' is not a librdkafka property", "pass sleep=..."]),
        ({**BASE, "metrics": object()}, ["'metrics' is not a librdkafka property"]),
    ],
)  # fmt: skip
def test_a_misspelt_misplaced_or_mistyped_setting_is_named_with_its_fix(
    conf: dict[str, Any], needles: list[str]
) -> None:
    """A list of servers (which confluent-kafka would pass on as its str() and librdkafka
    try to resolve until the first call timed out), a required key written a little
    wrong, a TransactionalProducer keyword argument put in the config, and a value that
    is no string, number or boolean are refused by validate_config, before anything
    connects, naming the key and the fix; a value is never repeated unless it is the
    servers' list."""
    with pytest.raises(ConfigurationError) as info:
        TransactionalProducer(conf)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    assert "hunter2" not in message


@pytest.mark.guarantee("1.17")
def test_every_producer_keyword_argument_in_the_config_is_named() -> None:
    """Each of TransactionalProducer's keyword arguments, put in the config, is refused
    as a misplaced keyword argument (pass it to TransactionalProducer), never as a
    librdkafka property of the wrong type."""
    import inspect

    names = [
        p.name
        for p in inspect.signature(TransactionalProducer.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert names
    for name in names:
        with pytest.raises(ConfigurationError, match=f"pass {name}=\\.\\.\\. to Transactional"):
            validate_config({**BASE, name: object()})


@pytest.mark.guarantee("1.17")
def test_an_unrelated_key_is_not_suggested_for_a_missing_one() -> None:
    """Only a close match is offered: a config without transactional.id whose keys look
    nothing like it gets the plain message."""
    with pytest.raises(ConfigurationError) as info:
        validate_config({"bootstrap.servers": "a:1", "client.id": "c", "linger.ms": 5})
    assert "did you mean" not in str(info.value)


def test_objects_confluent_kafka_takes_are_accepted() -> None:
    """Callables (oauth_cb, throttle_cb...) and a logger stay accepted as values."""
    import logging

    validated = validate_config(
        {**BASE, "logger": logging.getLogger("x"), "throttle_cb": print, "linger.ms": 5.0}
    )
    assert validated.librdkafka["throttle_cb"] is print
