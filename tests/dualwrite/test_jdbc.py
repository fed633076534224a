"""JDBC URLs as Spark users write them (kafka_txn.dualwrite.jdbc.urls): the Java drivers' parameters
mapped onto psycopg and PyMySQL and checked on real PostgreSQL and MariaDB servers;
everything else refused by name when the URL is parsed (for the Spark sink: on the
driver, before any job); multi-host URLs refused; no password in any error message or
repr(). Hypothesis mutates valid URLs and records the branches it reached (``event``)."""

from __future__ import annotations

import math
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, text
from sqlalchemy.exc import OperationalError

from kafka_txn import ConfigurationError
from kafka_txn.dualwrite.engine import engine_for
from kafka_txn.dualwrite.jdbc.params import CHARSETS
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy, redact_jdbc_url
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.spark.options import SinkOptions
from tests.proxies.pg_proxy import PostgresProxy

SECRET = "Zq7-s3cr3t"  # distinctive: found in a message only if the message leaks it


def _query(jdbc: str) -> dict[str, str]:
    return dict(jdbc_to_sqlalchemy(jdbc).query)


def _refused(jdbc: str, **kwargs: Any) -> str:
    with pytest.raises(ConfigurationError) as info:
        jdbc_to_sqlalchemy(jdbc, **kwargs)
    return str(info.value)


# ------------------------------------------------------------------ forms
@pytest.mark.parametrize(
    ("jdbc", "expected"),
    [
        ("jdbc:postgresql://db.example:5433/app?user=u&password=p%40ss&sslmode=require",
         "postgresql+psycopg://u:***@db.example:5433/app?sslmode=require"),
        ("jdbc:postgresql://h/app", "postgresql+psycopg://h:5432/app"),
        ("jdbc:mysql://h:3307/app?user=root", "mysql+pymysql://root@h:3307/app"),
        ("jdbc:mariadb://h/app?user=root&password=", "mysql+pymysql://root:***@h:3306/app"),
        ("jdbc:postgresql://[::1]:5432/app", "postgresql+psycopg://[::1]:5432/app"),
        ("jdbc:postgresql://h/my%20db", "postgresql+psycopg://h:5432/my db"),
        ("jdbc:sqlite:/var/data/app.db", "sqlite:////var/data/app.db"),
        ("jdbc:sqlite:rel.db", "sqlite:///rel.db"),
        ("jdbc:sqlite::memory:", "sqlite://"),
    ],
)  # fmt: skip
def test_jdbc_urls_map_to_sqlalchemy(jdbc, expected):
    assert jdbc_to_sqlalchemy(jdbc).render_as_string(hide_password=True) == expected


def test_jdbc_credentials_from_arguments_win():
    url = jdbc_to_sqlalchemy("jdbc:postgresql://h/app?user=a&password=b", user="c", password="d")
    assert (url.username, url.password) == ("c", "d")


@pytest.mark.parametrize(
    ("jdbc", "needle"),
    [
        ("postgresql://h/app", "does not start with 'jdbc:'"),
        ("jdbc:oracle:thin:@h:1521:x", "unsupported subprotocol 'oracle'"),
        ("jdbc:postgresql:h/app", "expected jdbc:postgresql://host"),
        ("jdbc:postgresql://h", "exactly one database"),
        ("jdbc:postgresql://h/a/b", "exactly one database"),
        ("jdbc:postgresql://h:notaport/app", "bad host or port"),
        # Port 0 is not "the default port": refused, not turned into 5432.
        ("jdbc:postgresql://h:0/app", "port 0 is not a port"),
        ("jdbc:mysql://h:00/app", "port 0 is not a port"),
        # No '/' between the host and the database: '#' does not end the host.
        ("jdbc:postgresql://h#app", "exactly one database"),
        ("jdbc:postgresql:///app", "no host"),
        ("jdbc:postgresql://u:p@h/app", "credentials"),
        ("jdbc:sqlite://h/x", "SQLite takes a file path"),
        ("jdbc:sqlite:/x.db?journal_mode=WAL", "SQLite URLs take no parameters"),
        ("jdbc:postgresql://h/app\nDROP", "control character"),
        ("jdbc", "does not start with 'jdbc:'"),
        ("jdbc:postgresql://h/app?sslmode=require&SSLMODE=disable", "'SSLMODE' is given twice"),
        ("jdbc:postgresql://h/app?a%40b=1", "a parameter name is malformed"),
    ],
)
def test_bad_jdbc_urls_say_what_and_list_the_supported(jdbc, needle):
    message = _refused(jdbc)
    assert needle in message
    assert "jdbc:postgresql://" in message  # the list of what is supported


@given(st.text(max_size=120))
def test_fuzz_jdbc_parser_raises_only_configuration_error(text_):
    try:
        url = jdbc_to_sqlalchemy("jdbc:" + text_)
    except ConfigurationError:
        return
    assert url.drivername in ("postgresql+psycopg", "mysql+pymysql", "sqlite")


# ------------------------------------------------------------------ multi-host
@pytest.mark.parametrize(
    "jdbc",
    [
        "jdbc:postgresql://h1:5432,h2:5432/db?targetServerType=primary",
        "jdbc:postgresql://h1,h2/db",
        "jdbc:mysql://h1,h2/db",
        "jdbc:mariadb://h1:3306,h2:3306/db",
        "jdbc:mysql:loadbalance://h1,h2/db",
        "jdbc:mysql:replication://h1,h2/db",
        "jdbc:mariadb:failover://h1,h2/db",
        "jdbc:mariadb:sequential://h1,h2/db",
        "jdbc:mariadb:aurora://cluster.example/db",
        # Connector/J's bracketed host list: not a bad IPv6 address.
        "jdbc:mysql://[h1:3306,h2:3306]/db",
        "jdbc:mariadb://[h1,h2]/db",
    ],
)
def test_multi_host_urls_are_not_supported(jdbc):
    message = _refused(jdbc)
    assert "multi-host URLs" in message and "not supported" in message


@pytest.mark.parametrize(
    ("jdbc", "needle"),
    [
        ("jdbc:mysql://address=(host=h1)(port=3306)/db", "address=(host=...)"),
        ("jdbc:mysql://(host=h1,port=3306)/db", "(host=...,port=...)"),
        ("jdbc:mysql+srv://cluster.example/db", "DNS SRV"),
    ],
)
def test_other_host_forms_are_not_supported(jdbc, needle):
    assert needle in _refused(jdbc)


# ------------------------------------------------------------------ parameters
@pytest.mark.parametrize(
    ("jdbc", "expected"),
    [
        # pgJDBC: ssl without sslmode is verify-full (SslMode.of), ssl=false is prefer.
        ("jdbc:postgresql://h/d?ssl=true", {"sslmode": "verify-full"}),
        ("jdbc:postgresql://h/d?ssl", {"sslmode": "verify-full"}),
        ("jdbc:postgresql://h/d?ssl=false", {"sslmode": "prefer"}),
        ("jdbc:postgresql://h/d?ssl=true&sslmode=require", {"sslmode": "require"}),
        ("jdbc:postgresql://h/d?sslmode=Verify-CA", {"sslmode": "verify-ca"}),
        ("jdbc:postgresql://h/d?currentSchema=app", {"options": "-c search_path=app"}),
        ("jdbc:postgresql://h/d?currentschema=%22My%20App%22,public",
         {"options": '-c search_path="My\\ App",public'}),
        ("jdbc:postgresql://h/d?currentSchema=a%5Cb", {"options": "-c search_path=a\\\\b"}),
        ("jdbc:postgresql://h/d?ApplicationName=etl%20job", {"application_name": "etl job"}),
        ("jdbc:postgresql://h/d?connectTimeout=7", {"connect_timeout": "7"}),
        ("jdbc:mysql://h/d?useSSL=false", {"ssl_disabled": "true"}),
        ("jdbc:mysql://h/d?useSSL=true", {"ssl_check_hostname": "false"}),
        ("jdbc:mysql://h/d?useSSL=true&sslMode=DISABLED", {"ssl_disabled": "true"}),
        ("jdbc:mariadb://h/d?sslMode=disable", {"ssl_disabled": "true"}),
        ("jdbc:mysql://h/d?sslMode=PREFERRED", {}),
        ("jdbc:mysql://h/d?sslMode=required", {"ssl_check_hostname": "false"}),
        ("jdbc:mariadb://h/d?sslMode=trust", {"ssl_check_hostname": "false"}),
        ("jdbc:mysql://h/d?sslMode=VERIFY_CA", {"ssl_verify_cert": "true"}),
        ("jdbc:mariadb://h/d?sslMode=verify-ca", {"ssl_verify_cert": "true"}),
        ("jdbc:mysql://h/d?serverTimezone=UTC", {"init_command": "SET time_zone = '+00:00'"}),
        ("jdbc:mysql://h/d?characterEncoding=UTF-8", {"charset": "utf8mb4"}),
        ("jdbc:mysql://h/d?useUnicode=true&characterEncoding=UTF-8", {"charset": "utf8mb4"}),
        ("jdbc:mysql://h/d?characterEncoding=utf8", {"charset": "utf8mb4"}),
        ("jdbc:mysql://h/d?characterEncoding=ISO-8859-1", {"charset": "latin1"}),
        ("jdbc:mysql://h/d?characterEncoding=US-ASCII", {"charset": "ascii"}),
        ("jdbc:mysql://h/d?characterEncoding=Cp1252", {"charset": "latin1"}),
        ("jdbc:mysql://h/d?characterEncoding=utf8mb4", {"charset": "utf8mb4"}),
        # Connector/J counts milliseconds, PyMySQL seconds (rounded up; 0: no limit).
        ("jdbc:mysql://h/d?connectTimeout=5000", {"connect_timeout": "5"}),
        ("jdbc:mariadb://h/d?connectTimeout=1500", {"connect_timeout": "2"}),
        ("jdbc:mysql://h/d?connectTimeout=1", {"connect_timeout": "1"}),
        ("jdbc:mysql://h/d?connectTimeout=0", {"connect_timeout": "31536000"}),
    ],
)  # fmt: skip
def test_java_driver_parameters_map_onto_the_python_drivers(jdbc, expected):
    assert _query(jdbc) == expected


def test_verify_identity_checks_the_host_against_the_system_cas():
    """PyMySQL checks host names only when a CA is given: the system bundle is."""
    query = _query("jdbc:mysql://h/d?sslMode=VERIFY_IDENTITY")
    assert query["ssl_check_hostname"] == "true"
    assert set(query) & {"ssl_ca", "ssl_capath"}
    assert _query("jdbc:mariadb://h/d?sslMode=verify-full") == query


@pytest.mark.parametrize(
    ("zone", "offset"),
    [("UTC", "+00:00"), ("gmt", "+00:00"), ("Etc/UTC", "+00:00"), ("Z", "+00:00"),
     ("GMT%2B8", "+08:00"), ("UTC-05:30", "-05:30"), ("%2B0530", "+05:30"),
     ("Etc/GMT-3", "+03:00"), ("Etc/GMT%2B10", "-10:00"), ("GMT-0", "+00:00"),
     ("%2B13:00", "+13:00"), ("-12:59", "-12:59"), ("Etc/GMT-13", "+13:00")],
)  # fmt: skip
def test_server_timezone_becomes_a_fixed_session_offset(zone, offset):
    query = _query(f"jdbc:mysql://h/d?serverTimezone={zone}")
    assert query == {"init_command": f"SET time_zone = '{offset}'"}


@pytest.mark.parametrize(
    ("jdbc", "needles"),
    [
        ("jdbc:postgresql://h/d?sslmode=maybe", ["sslmode='maybe'", "verify-full"]),
        ("jdbc:postgresql://h/d?ssl=sometimes", ["ssl='sometimes'", "true or false"]),
        ("jdbc:postgresql://h/d?connectTimeout=-1", ["connectTimeout='-1'", "seconds"]),
        ("jdbc:postgresql://h/d?connectTimeout=5s", ["whole number of seconds"]),
        ("jdbc:postgresql://h/d?currentSchema=", ["currentSchema=''"]),
        ("jdbc:postgresql://h/d?currentSchema=%22open", ["not closed"]),
        ("jdbc:postgresql://h/d?currentSchema=a%20b", ["quote a name", '"My Schema"']),
        ("jdbc:postgresql://h/d?currentSchema=a,,b", ["comma-separated list"]),
        ("jdbc:postgresql://h/d?currentSchema=%22%22", ["empty quoted name"]),
        ("jdbc:mysql://h/d?useSSL=maybe", ["useSSL='maybe'"]),
        ("jdbc:mysql://h/d?sslMode=STRICT", ["sslMode='STRICT'", "VERIFY_IDENTITY", "trust"]),
        ("jdbc:mysql://h/d?serverTimezone=Europe/Paris", ["'Europe/Paris'", "daylight saving"]),
        ("jdbc:mysql://h/d?serverTimezone=GMT+8", ["'GMT 8'", "written %2B"]),
        ("jdbc:mysql://h/d?serverTimezone=%2B14:30", ["-12:59 to +13:00"]),
        ("jdbc:mysql://h/d?serverTimezone=%2B05:75", ["-12:59 to +13:00"]),
        # Offsets MySQL takes and MariaDB refuses (error 1298 when connecting): refused
        # here for jdbc:mariadb, and for jdbc:mysql, which may point at either server.
        ("jdbc:mariadb://h/d?serverTimezone=Etc/GMT-14", ["-12:59 to +13:00", "MariaDB"]),
        ("jdbc:mysql://h/d?serverTimezone=UTC%2B14:00", ["-12:59 to +13:00", "MariaDB"]),
        ("jdbc:mysql://h/d?serverTimezone=%2B13:01", ["-12:59 to +13:00"]),
        ("jdbc:mariadb://h/d?serverTimezone=-13:00", ["-12:59 to +13:00"]),
        ("jdbc:mysql://h/d?serverTimezone=GMT-13:59", ["-12:59 to +13:00"]),
        ("jdbc:mysql://h/d?characterEncoding=Big5", ["'Big5'", "UTF-8", "Cp1252", "utf8mb4"]),
        ("jdbc:mysql://h/d?connectTimeout=5.5", ["whole number of milliseconds"]),
        ("jdbc:mariadb://h/d?connectTimeout=99999999999", ["milliseconds"]),
    ],
)
def test_bad_parameter_values_are_refused_with_the_accepted_ones(jdbc, needles):
    message = _refused(jdbc)
    assert message.startswith("invalid JDBC URL 'jdbc:")
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize(
    ("jdbc", "unknown", "supported"),
    [
        (f"jdbc:postgresql://h/d?user=u&password={SECRET}&options=-c%20x%3Dy&loginTimeout=3",
         ["'options'", "'loginTimeout'"],
         "user, password, ssl, sslmode, currentSchema, ApplicationName, connectTimeout"),
        (f"jdbc:mysql://h/d?rewriteBatchedStatements=true&trustStorePassword={SECRET}"
         f"&password={SECRET}", ["'rewriteBatchedStatements'", "'trustStorePassword'"],
         "user, password, useSSL, sslMode, serverTimezone, characterEncoding, useUnicode, "
         "connectTimeout"),
        ("jdbc:mariadb://h/d?useSSL=false&application_name=x", ["'application_name'"],
         "useSSL, sslMode, serverTimezone"),
        ("jdbc:postgresql://h/d?serverTimezone=UTC", ["'serverTimezone'"], "currentSchema"),
    ],
)  # fmt: skip
def test_unsupported_parameters_are_named_with_the_supported_ones(jdbc, unknown, supported):
    message = _refused(jdbc)
    assert "unsupported parameter(s)" in message
    for name in unknown:
        assert name in message
    assert supported in message
    assert SECRET not in message


# ------------------------------------------------------------------ redaction
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"jdbc:postgresql://h/db?user=u&password={SECRET}",
         "jdbc:postgresql://h/db?user=u&password=***"),
        (f"jdbc:postgresql://u:{SECRET}@h:5432/db", "jdbc:postgresql://u:***@h:5432/db"),
        (f"postgresql+psycopg://u:{SECRET}@h/db?sslpassword={SECRET}",
         "postgresql+psycopg://u:***@h/db?sslpassword=***"),
        (f"jdbc:mysql://h/d?keyStorePassword={SECRET}&user=me",
         "jdbc:mysql://h/d?keyStorePassword=***&user=me"),
        (f"jdbc:mysql://h/d?password=p@{SECRET}", "jdbc:mysql://h/d?password=***"),
        (f"jdbc:postgresql://{SECRET}@h/db", "jdbc:postgresql://***@h/db"),
        (f"jdbc:postgresql://h1:1,h2:2/db?PASSWORD={SECRET}",
         "jdbc:postgresql://h1:1,h2:2/db?PASSWORD=***"),
        # Where a password ends cannot be told: only the subprotocol is kept.
        (f"jdbc:postgresql://u:p@{SECRET}@h/db", "jdbc:postgresql://<redacted>"),
        (f"jdbc:postgresql://u:{SECRET}/x@h/db", "jdbc:postgresql://<redacted>"),
        (f"jdbc:postgresql://u:{SECRET}/db", "jdbc:postgresql://<redacted>"),
        ("jdbc:postgresql://u:12?user=x@h/db", "jdbc:postgresql://<redacted>"),
        (f"jdbc:postgresql:u:{SECRET}@h/db", "jdbc:postgresql:<redacted>"),
        ("jdbc:sqlite:/data/a@b.db", "jdbc:sqlite:/data/a@b.db"),
        (None, "<NoneType>"),
    ],
)  # fmt: skip
def test_redaction_hides_passwords_and_keeps_the_rest(url, shown):
    assert redact_jdbc_url(url) == shown


def test_a_malformed_url_is_never_echoed_with_its_password():
    for url in (f"jdbc:postgresql://u:{SECRET}@h:bad/db", f"jdbc:postgresql://u:{SECRET}/db",
                f"jdbc:mysql://u:{SECRET}@h1,h2/db", f"jdbc:postgresql://h/db?password={SECRET}&x",
                f"jdbc:mysql:loadbalance://h/db?password={SECRET}"):  # fmt: skip
        assert SECRET not in _refused(url)
    for database in (f"postgresql+psycopg://u:{SECRET}@h:bad/db", f"::{SECRET}::"):
        with pytest.raises(ConfigurationError) as info:
            SinkOptions.build({"url": database, "dbtable": "t", "transactional_id_prefix": "p"},
                              {"kafka.bootstrap.servers": "127.0.0.1:9"})  # fmt: skip
        assert SECRET not in str(info.value)


_PLANTED = st.text(min_size=1, max_size=12).map(lambda t: SECRET + t)
_NOISE = st.text(alphabet="abc/:@?&=#%,.[]0123456789", max_size=12)


@given(
    scheme=st.sampled_from(["jdbc:postgresql:", "jdbc:mysql:", "postgresql+psycopg:", ""]),
    where=st.sampled_from(["userinfo", "param", "secret_param"]),
    secret=_PLANTED,
    before=_NOISE,
    after=_NOISE,
)
def test_fuzz_redaction_never_shows_a_planted_password(scheme, where, secret, before, after):
    if where == "userinfo":
        url = f"{scheme}//{before}u:{secret}@{after}"
    elif where == "param":
        url = f"{scheme}//h/{before}?a=1&password={secret}{after}"
    else:
        url = f"{scheme}//h/{before}?sasl.Token={secret}"
    event(f"redaction: {where}")
    shown = redact_jdbc_url(url)
    event("redaction: coarse" if shown.endswith("<redacted>") else "redaction: detailed")
    assert secret not in shown


# ------------------------------------------------------------------ passwords in other forms
# Where the Java drivers (or SQL Server's) put a password that no parameter of ours names:
# MySQL's key-value host forms, ';'-properties after the database or inside a value. Each
# is refused, and neither the error, nor the redacted URL, nor a repr shows the password.
_OTHER_FORMS = {
    "address": "jdbc:mysql://address=(host=h1)(port=3306)({key}={value})/test",
    "address_more": "jdbc:mariadb://address=(host=h1)(port=3306)(user=u)({key}={value})/test?x=1",
    "parenthesised": "jdbc:mysql://(host=h1,port=3306,{key}={value})/test",
    "bracketed": "jdbc:mysql://[(host=h1,port=3306,{key}={value})]/test",
    "listed": "jdbc:mysql://h1:3306,(host=h2,{key}={value})/test",
    "db_semicolon": "jdbc:postgresql://127.0.0.1:5432/test;{key}={value}",
    "db_semicolon_mysql": "jdbc:mysql://127.0.0.1:3306/test;{key}={value}",
    "user_semicolon": "jdbc:mysql://127.0.0.1:3306/test?user=root;{key}={value}",
    "value_semicolon": "jdbc:postgresql://h/test?sslmode=require;{key}={value}&ssl=true",
    "value_blank": "jdbc:postgresql://h/test?ApplicationName=app%20{key}%3D{value}",
    "fragment": "jdbc:postgresql://h1#{key}={value}",
    "ampersand": "jdbc:postgresql://h1/test&{key}={value}",
}
_PASSWORD_KEYS = ["password", "PASSWORD", "Pwd", "passwd", "trustStorePassword", "sslpassword",
                  "clientSecret", "pass%77ord"]  # fmt: skip


def _everything_shown(jdbc: str) -> list[str]:
    """Every text the URL reaches: its redacted form, the parser's error, the Spark
    sink's options error (or repr, were it accepted)."""
    shown = [redact_jdbc_url(jdbc)]
    keywords = {"url": jdbc, "dbtable": "t", "transactional_id_prefix": "p"}
    for build in (
        lambda: repr(jdbc_to_sqlalchemy(jdbc)),
        lambda: repr(SinkOptions.build(keywords, {"kafka.bootstrap.servers": "127.0.0.1:9"})),
    ):
        try:
            shown.append(build())
        except ConfigurationError as exc:
            shown.append(str(exc))
    return shown


@pytest.mark.parametrize("form", sorted(_OTHER_FORMS))
@pytest.mark.parametrize("key", _PASSWORD_KEYS)
def test_passwords_in_other_forms_are_refused_and_never_shown(form, key):
    jdbc = _OTHER_FORMS[form].format(key=key, value=SECRET)
    message = _refused(jdbc)
    assert "invalid JDBC URL" in message
    for shown in _everything_shown(jdbc):
        assert SECRET not in shown, shown


@pytest.mark.parametrize(
    ("jdbc", "needle"),
    [
        (f"jdbc:postgresql://127.0.0.1:5432/test;password={SECRET}", "?name=value"),
        ("jdbc:postgresql://h/test;sslmode=require", "that is SQL Server's"),
        ("jdbc:postgresql://h/test%3Bx", "the database name holds ';'"),
        (f"jdbc:mysql://h/test?user=root;password={SECRET}", "joined by '&'"),
        ("jdbc:postgresql://h/test?ApplicationName=a;sslmode=disable", "';name=value'"),
        (f"jdbc:mysql://address=(host=h1)(port=3306)(password={SECRET})/test",
         "address=(host=...)"),
        (f"jdbc:mysql://(host=h1,port=3306,password={SECRET})/test", "(host=...,port=...)"),
    ],
)  # fmt: skip
def test_semicolon_properties_and_key_value_hosts_name_the_fix(jdbc, needle):
    message = _refused(jdbc)
    assert needle in message
    assert SECRET not in message


def test_a_password_may_hold_semicolons_and_equals_signs():
    """Only the password's value may hold ';name=': it is never shown."""
    url = jdbc_to_sqlalchemy(f"jdbc:postgresql://h/db?user=u&password=a;b%3D{SECRET}")
    assert url.password == f"a;b={SECRET}"
    shown = redact_jdbc_url(f"jdbc:postgresql://h/db?user=u&password=a;b={SECRET}")
    assert shown == "jdbc:postgresql://h/db?user=u&password=***"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"jdbc:postgresql://h/db?user=root;password={SECRET}&ssl=true",
         "jdbc:postgresql://h/db?user=***&ssl=true"),
        (f"jdbc:postgresql://h/db?user=root%3BPWD%3D{SECRET}", "jdbc:postgresql://h/db?user=***"),
        (f"jdbc:postgresql://h/db;password={SECRET}", "jdbc:postgresql://<redacted>"),
        (f"jdbc:mysql://address=(host=h)(PassWord={SECRET})/db", "jdbc:mysql://<redacted>"),
        (f"jdbc:mysql://(host=h,secret = {SECRET})/db", "jdbc:mysql://<redacted>"),
        (f"postgresql+psycopg://h/test%3Bpass%77ord%3D{SECRET}",
         "postgresql+psycopg://<redacted>"),
        ("jdbc:postgresql://passwords.example/db?user=u", "jdbc:postgresql://passwords.example/db?user=u"),
    ],
)  # fmt: skip
def test_redaction_masks_password_assignments_anywhere(url, shown):
    assert redact_jdbc_url(url) == shown


@settings(max_examples=300)
@given(
    form=st.sampled_from(sorted(_OTHER_FORMS)),
    key=st.sampled_from(_PASSWORD_KEYS) | st.from_regex(r"[a-z]{0,4}(pass|pwd|secret)[a-z]{0,4}",
                                                        fullmatch=True),
    tail=st.text(max_size=10),
    encode=st.booleans(),
)  # fmt: skip
def test_fuzz_passwords_planted_in_other_forms_never_show(form, key, tail, encode):
    """A password planted in any of these forms, raw (its characters may restructure the
    URL) or percent-encoded, in any key spelling: refused, and shown nowhere."""
    secret = SECRET + tail
    value = quote(secret, safe="") if encode else secret
    jdbc = _OTHER_FORMS[form].format(key=key, value=value)
    event(f"form: {form}")
    with pytest.raises(ConfigurationError):
        jdbc_to_sqlalchemy(jdbc)
    for shown in _everything_shown(jdbc):
        assert SECRET not in shown, shown


def test_a_dual_writer_refuses_them_before_it_has_a_repr(broker):
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "forms"}
    for form in ("db_semicolon", "user_semicolon", "address"):
        with pytest.raises(ConfigurationError) as info:
            DualWriter(conf, _OTHER_FORMS[form].format(key="password", value=SECRET))
        assert SECRET not in str(info.value)
    # A SQLAlchemy URL is not parsed here: its repr hides what looks like a password.
    writer = DualWriter(conf, f"postgresql+psycopg://postgres@127.0.0.1/test;password={SECRET}")
    try:
        assert SECRET not in repr(writer)
    finally:
        writer.close()


def test_the_cli_usage_error_shows_no_password(capsys):
    from kafka_txn.cli.main import main

    for form in ("address", "parenthesised", "db_semicolon", "user_semicolon"):
        jdbc = _OTHER_FORMS[form].format(key="password", value=SECRET)
        code = main(["recover", "--bootstrap-servers", "127.0.0.1:9", "--jdbc-url", jdbc,
                     "--transactional-id", "forms"])  # fmt: skip
        out, err = capsys.readouterr()
        assert code == 2
        assert "--jdbc-url: invalid JDBC URL" in err
        assert SECRET not in out + err


# ------------------------------------------------------------------ control characters
@pytest.mark.parametrize("char", ["\x01", "\x1b", "\x7f", "\t", "\x1f"])
@pytest.mark.parametrize(
    "template",
    ["jdbc:postgresql://h{c}1/db", "jdbc:postgresql://h/d{c}b", "jdbc:mysql://h/db?user=a{c}",
     "jdbc:postgresql://h/db?ApplicationName=a{c}", "jdbc:sqlite:/tmp/a{c}.db"],
)  # fmt: skip
def test_every_control_character_is_refused_raw_or_percent_encoded(template, char):
    message = _refused(template.format(c=char))
    assert f"control character (U+{ord(char):04X})" in message
    assert char not in message
    if template.startswith("jdbc:sqlite"):
        return  # a path is not percent-decoded
    encoded = template.format(c=quote(char, safe=""))
    assert "control character" in _refused(encoded)


def test_a_password_may_hold_control_characters():
    url = jdbc_to_sqlalchemy("jdbc:postgresql://h/db?user=u&password=a%01b%7F")
    assert url.password == "a\x01b\x7f"


# ------------------------------------------------------------------ documented lists
def _documented_encodings(markdown: str) -> dict[str, str]:
    """name -> MySQL charset from a docs table row: "`utf8mb4` for `UTF-8`, `utf8`; ..."."""
    row = next(line for line in markdown.splitlines() if line.startswith("| `characterEncoding"))
    found: dict[str, str] = {}
    for charset, names in re.findall(r"`(\w+)` for ((?:`[^`]+`(?:, )?)+)", row):
        for name in re.findall(r"`([^`]+)`", names):
            found[name] = charset
    return found


@pytest.mark.parametrize("doc", ["guide/dual-write.md", "guide/spark.md"])
def test_docs_list_exactly_the_accepted_character_encodings(doc):
    markdown = (Path(__file__).parent.parent.parent / "docs" / doc).read_text(encoding="utf-8")
    assert _documented_encodings(markdown) == CHARSETS
    for name, charset in CHARSETS.items():
        for spelling in (name, name.upper(), name.lower()):
            assert _query(f"jdbc:mysql://h/d?characterEncoding={spelling}") == {"charset": charset}


# ------------------------------------------------------------------ fuzz from valid bases
_NO_NUL = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))
# A user name or application name as accepted: no control character, and neither ';'
# nor '=' (which could spell ';name=value' properties or 'password=': refused, below).
_PLAIN = st.characters(exclude_characters=";=", exclude_categories=("Cs", "Cc"))
_IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
_HOSTS = st.sampled_from(["127.0.0.1", "localhost", "db.example", "[::1]", "db-1.internal"])
_PG_VALUES: dict[str, st.SearchStrategy[str]] = {
    "ssl": st.sampled_from(["true", "false", "TRUE", "False", ""]),
    "sslmode": st.sampled_from(
        ["disable", "allow", "prefer", "require", "verify-ca", "verify-full", "REQUIRE"]
    ),
    "currentSchema": st.lists(
        _IDENT | _IDENT.map(lambda s: f'"{s.upper()} {s}"'), min_size=1, max_size=3
    ).map(",".join),
    "ApplicationName": st.text(_PLAIN, min_size=1, max_size=20),
    "connectTimeout": st.integers(0, 10_000).map(str),
}
_MY_VALUES: dict[str, st.SearchStrategy[str]] = {
    "useSSL": st.sampled_from(["true", "false", "yes", "NO"]),
    "sslMode": st.sampled_from(
        [
            "DISABLED",
            "PREFERRED",
            "REQUIRED",
            "VERIFY_CA",
            "trust",
            "verify-ca",
            "disable",
            "required",
        ]
    ),
    "serverTimezone": st.sampled_from(["UTC", "GMT", "GMT+8", "+05:30", "Etc/GMT-3", "UTC-07:00"]),
    "characterEncoding": st.sampled_from(["UTF-8", "utf8", "ISO-8859-1", "US-ASCII"]),
    "connectTimeout": st.integers(0, 10_000_000).map(str),
}
_ZONES = {"UTC": "+00:00", "GMT": "+00:00", "GMT+8": "+08:00", "+05:30": "+05:30",
          "Etc/GMT-3": "+03:00", "UTC-07:00": "-07:00"}  # fmt: skip
_MUTATIONS = [None, None, None, "unknown", "bad_value", "multi_host", "userinfo", "bad_port",
              "duplicate", "raw_password", "control", "semicolon"]  # fmt: skip


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    scheme = draw(st.sampled_from(["postgresql", "mysql", "mariadb"]))
    values = _PG_VALUES if scheme == "postgresql" else _MY_VALUES
    names = draw(st.lists(st.sampled_from(sorted(values)), unique=True, max_size=len(values)))
    params = {name: draw(values[name]) for name in names}
    spelled = {draw(st.sampled_from([n, n.lower(), n.upper()])): v for n, v in params.items()}
    return {
        "scheme": scheme, "host": draw(_HOSTS), "port": draw(st.none() | st.integers(1, 65535)),
        "database": draw(_IDENT), "params": params, "spelled": spelled,
        "user": draw(st.text(_PLAIN, min_size=1, max_size=10)),
        "password": SECRET + draw(st.text(_NO_NUL, max_size=10)),
        "credentials": draw(st.sampled_from(["query", "arguments"])),
        "mutation": draw(st.sampled_from(_MUTATIONS)),
        "control": draw(st.sampled_from([*range(1, 0x20), 0x7F])),  # NUL: its own error
    }  # fmt: skip


def _expected_query(scheme: str, params: dict[str, str]) -> dict[str, str]:
    """What the module docstring promises, written out independently of the code."""
    out: dict[str, str] = {}
    if scheme == "postgresql":
        if "sslmode" in params:
            out["sslmode"] = params["sslmode"].lower()
        elif "ssl" in params:
            on = params["ssl"].lower() in ("true", "")
            out["sslmode"] = "verify-full" if on else "prefer"
        if "currentSchema" in params:
            out["options"] = "-c search_path=" + params["currentSchema"].replace(" ", "\\ ")
        if "ApplicationName" in params:
            out["application_name"] = params["ApplicationName"]
        if "connectTimeout" in params:
            out["connect_timeout"] = params["connectTimeout"]
        return out
    mode = params.get("sslMode", "").lower()
    if not mode and "useSSL" in params:
        mode = "required" if params["useSSL"].lower() in ("true", "yes") else "disabled"
    out.update({"disabled": {"ssl_disabled": "true"}, "disable": {"ssl_disabled": "true"},
                "required": {"ssl_check_hostname": "false"},
                "trust": {"ssl_check_hostname": "false"},
                "verify_ca": {"ssl_verify_cert": "true"},
                "verify-ca": {"ssl_verify_cert": "true"}}.get(mode, {}))  # fmt: skip
    if "serverTimezone" in params:
        out["init_command"] = f"SET time_zone = '{_ZONES[params['serverTimezone']]}'"
    if "characterEncoding" in params:
        enc = params["characterEncoding"].lower()
        out["charset"] = {"utf-8": "utf8mb4", "utf8": "utf8mb4", "iso-8859-1": "latin1"}.get(
            enc, "ascii"
        )
    if "connectTimeout" in params:
        ms = int(params["connectTimeout"])
        out["connect_timeout"] = str(31_536_000 if ms == 0 else max(1, math.ceil(ms / 1000)))
    return out


@settings(max_examples=400)
@given(_cases())
def test_fuzz_mutated_valid_urls_succeed_or_fail_clearly_never_leaking(case):
    scheme, host, port, database = case["scheme"], case["host"], case["port"], case["database"]
    mutation, password = case["mutation"], case["password"]
    pairs = [f"{name}={quote(value, safe='')}" for name, value in case["spelled"].items()]
    kwargs: dict[str, str] = {}
    if case["credentials"] == "query":
        pairs += [f"user={quote(case['user'], safe='')}", f"password={quote(password, safe='')}"]
    else:
        kwargs = {"user": case["user"], "password": password}
    hostport = host + (f":{port}" if port is not None else "")
    expect: str | None = None
    if mutation == "unknown":
        pairs.append("useCursorFetch=true" if scheme != "postgresql" else "prepareThreshold=0")
        expect = "unsupported parameter(s)"
    elif mutation == "bad_value":
        pairs.append("connectTimeout=soon")
        expect = "given twice" if "connectTimeout" in case["params"] else "connectTimeout='soon'"
    elif mutation == "multi_host":
        hostport += ",standby.example:9999"
        expect = "multi-host URLs"
    elif mutation == "userinfo":  # the raw password may end the host part anywhere
        hostport = f"{quote(case['user'], safe='')}:{password}@{hostport}"
        expect = "invalid JDBC URL"
    elif mutation == "bad_port":
        hostport = f"{host}:{password}"
        expect = "invalid JDBC URL"
    elif mutation == "duplicate":
        pairs += ["ApplicationName=a", "applicationname=b"] if scheme == "postgresql" else [
            "useSSL=true", "USESSL=false"]  # fmt: skip
        expect = "given twice"
    elif mutation == "raw_password":  # not percent-encoded: '&', '=', '#', '%' land as is
        pairs.append(f"password={password}&user=x")
    elif mutation == "control":  # percent-encoded: decoded, then refused
        pairs.append(f"user=a%{case['control']:02X}b")
        expect = "control character"
    elif mutation == "semicolon":  # SQL Server's properties, the password among them
        pairs.append(f"user=root;password={quote(password, safe='')}")
        expect = "parameter 'user'"  # holds ';name=value' (or a control character)
    jdbc = f"jdbc:{scheme}://{hostport}/{database}" + ("?" + "&".join(pairs) if pairs else "")
    event(f"scheme: {scheme}")
    event(f"mutation: {mutation}")
    event(f"credentials: {case['credentials']}")
    for name in case["params"]:
        event(f"parameter: {name}")
    try:
        url = jdbc_to_sqlalchemy(jdbc, **kwargs)
    except ConfigurationError as exc:
        event(f"refused: {mutation}")
        message = str(exc)
        assert password not in message and quote(password, safe="") not in message
        if mutation == "raw_password":
            return  # an unencoded password may split into anything: only the leak matters
        assert expect is not None, message
        assert expect in message
        return
    event("parsed")
    assert expect is None, f"{jdbc!r} was not refused"
    assert url.drivername == ("postgresql+psycopg" if scheme == "postgresql" else "mysql+pymysql")
    assert url.host == host.strip("[]")
    assert url.port == (port or (5432 if scheme == "postgresql" else 3306))
    assert url.database == database
    if mutation == "raw_password":
        return  # the credentials are what the raw text parses to
    assert (url.username, url.password) == (case["user"], password)
    assert dict(url.query) == _expected_query(scheme, case["params"])
    assert password not in repr(url)


# ------------------------------------------------------------------ real servers
def _pg_url(postgres_jdbc: str, params: str) -> str:
    return f"{postgres_jdbc}&{params}"


def test_postgres_parameters_reach_the_session(postgres_jdbc):
    app = f"kafka-txn-{uuid.uuid4().hex[:8]}"
    jdbc = _pg_url(
        postgres_jdbc, f"ssl=false&currentSchema=public&ApplicationName={app}&connectTimeout=5"
    )
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW search_path")).scalar() == "public"
            assert conn.execute(text("SELECT current_setting('application_name')")).scalar() == app
            seen = conn.execute(
                text("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")
            ).scalar()
            assert seen == app
            libpq = {o.keyword: o.val for o in conn.connection.dbapi_connection.pgconn.info}
            assert libpq[b"connect_timeout"] == b"5"
            assert libpq[b"sslmode"] == b"prefer"  # what pgJDBC makes of ssl=false
    finally:
        engine.dispose()


def test_postgres_current_schema_is_where_tables_land(postgres_jdbc, broker):
    """A fresh schema named by currentSchema: an unqualified table lands in it, and so does
    the DualWriter's state table; a quoted name keeps its capitals and blank."""
    plain = f"kt_{uuid.uuid4().hex[:10]}"
    quoted = f"Kt Schema {uuid.uuid4().hex[:6]}"
    admin = create_engine(jdbc_to_sqlalchemy(postgres_jdbc))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {plain}"))
        conn.execute(text(f'CREATE SCHEMA "{quoted}"'))
    try:
        jdbc = _pg_url(postgres_jdbc, f"currentSchema={plain}")
        conf = {"bootstrap.servers": broker.bootstrap_servers,
                "transactional.id": f"jdbc-{uuid.uuid4().hex[:8]}"}  # fmt: skip
        with DualWriter(conf, jdbc) as writer:  # start() creates the state table
            Table("landed", MetaData(), Column("id", Integer)).create(writer.engine)
        schemas = quote(f'"{quoted}"') + ",public"
        engine = create_engine(
            jdbc_to_sqlalchemy(_pg_url(postgres_jdbc, f"currentSchema={schemas}"))
        )
        try:
            with engine.begin() as conn:
                assert (
                    conn.execute(text("SHOW search_path")).scalar() == f'"{quoted}",public'
                )  # as sent
                conn.execute(text("CREATE TABLE quoted_landed (id int)"))
        finally:
            engine.dispose()
        with admin.connect() as conn:
            rows = conn.execute(
                text("SELECT table_schema, table_name FROM information_schema.tables "
                     "WHERE table_schema IN (:a, :b) ORDER BY 1, 2"),
                {"a": plain, "b": quoted},
            ).all()  # fmt: skip
        assert [tuple(r) for r in rows] == [
            (quoted, "quoted_landed"), (plain, "kafka_transaction_state"), (plain, "landed")
        ]  # fmt: skip
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {plain} CASCADE"))
            conn.execute(text(f'DROP SCHEMA "{quoted}" CASCADE'))
        admin.dispose()


def test_mariadb_parameters_reach_the_session(mariadb_jdbc):
    jdbc = (
        f"{mariadb_jdbc}&useSSL=false&serverTimezone=UTC&characterEncoding=UTF-8"
        "&connectTimeout=5000"
    )
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text("SELECT @@session.time_zone, @@character_set_client, "
                     "@@character_set_connection, @@character_set_results")
            ).one()  # fmt: skip
            assert tuple(row) == ("+00:00", "utf8mb4", "utf8mb4", "utf8mb4")
            dbapi = conn.connection.dbapi_connection
            assert dbapi.connect_timeout == 5
            assert dbapi.ssl is False  # useSSL=false: TLS not even tried (PyMySQL's own flag)
    finally:
        engine.dispose()


def test_mariadb_offsets_and_latin1_reach_the_session(mariadb_jdbc):
    jdbc = f"{mariadb_jdbc}&serverTimezone=GMT%2B8&characterEncoding=ISO-8859-1&sslMode=PREFERRED"
    engine = create_engine(jdbc_to_sqlalchemy(jdbc))
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT @@session.time_zone, @@character_set_client")).one()
            assert tuple(row) == ("+08:00", "latin1")
    finally:
        engine.dispose()


@pytest.mark.parametrize("scheme", ["mariadb", "mysql"])
@pytest.mark.parametrize(("zone", "offset"), [("%2B13:00", "+13:00"), ("-12:59", "-12:59")])
def test_the_ends_of_the_accepted_offsets_connect_to_mariadb(mariadb_jdbc, scheme, zone, offset):
    """The range kept is the one MariaDB takes: both ends connect (one minute beyond
    each is refused when the URL is parsed, above)."""
    jdbc = mariadb_jdbc.replace("jdbc:mariadb:", f"jdbc:{scheme}:").replace(
        "jdbc:mysql:", f"jdbc:{scheme}:"
    )
    engine = create_engine(jdbc_to_sqlalchemy(f"{jdbc}&serverTimezone={zone}"))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT @@session.time_zone")).scalar() == offset
    finally:
        engine.dispose()


# ------------------------------------------------------------------ a server that never answers
@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never says a word (a stuck proxy;
    a Kafka broker or PostgreSQL, which wait for their client to speak first). The
    kernel completes the TCP handshakes from the backlog; closing the socket at the end
    resets them, which frees any reader still waiting."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:
        yield server.getsockname()[1]


_HANG_GUARD = 120.0  # seconds: far above the bounds under test, only to fail, not hang


def _outcome_within_guard(call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised (None if it returned), failing the test if it is still
    running after _HANG_GUARD seconds (it then ends when silent_port closes)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(_HANG_GUARD)
    assert not worker.is_alive(), "still waiting for a server that never answers"
    return outcome[0]


@pytest.mark.parametrize(
    "database",
    ["jdbc:mysql://127.0.0.1:{port}/test?user=root&connectTimeout=2000",
     "jdbc:mariadb://127.0.0.1:{port}/test?user=root&connectTimeout=1",
     "mysql+pymysql://root@127.0.0.1:{port}/test?connect_timeout=2"],
)  # fmt: skip
def test_a_mysql_handshake_with_a_silent_server_fails_instead_of_hanging(silent_port, database):
    """PyMySQL's connect_timeout bounds only the TCP connect; the engines kafka-txn
    builds bound the handshake's reads by it too (jdbc.bounded_engine)."""
    engine = engine_for(database.format(port=silent_port), None, None)
    try:
        raised = _outcome_within_guard(lambda: engine.connect().close())
    finally:
        engine.dispose()
    assert isinstance(raised, OperationalError), raised
    assert "timed out" in str(raised.orig)


def test_dual_writer_start_against_a_silent_mysql_port_fails(broker, silent_port):
    """The hang guarded against: DualWriter(...).start() with a jdbc:mysql URL pointing at a
    port that accepts and never answers, PyMySQL's default connect_timeout (10 s)."""
    conf = {"bootstrap.servers": broker.bootstrap_servers,
            "transactional.id": f"silent-{uuid.uuid4().hex[:8]}"}  # fmt: skip
    writer = DualWriter(conf, f"jdbc:mysql://127.0.0.1:{silent_port}/test?user=root")
    try:
        raised = _outcome_within_guard(writer.start)
    finally:
        writer.close()
    assert raised is not None, "start() succeeded against a server that never answers"
    assert "timed out" in str(raised) or "timed out" in repr(raised.__cause__), repr(raised)


def test_after_the_handshake_reads_wait_as_long_as_they_take(mariadb_jdbc):
    """The handshake's bound (connectTimeout, here 1 s) is lifted once connected: a
    query that takes longer than it completes, on the first connection and on a new
    one, as without the bound."""
    engine = engine_for(f"{mariadb_jdbc}&connectTimeout=1000", None, None)
    try:
        for _ in range(2):
            with engine.connect() as conn:
                dbapi = conn.connection.dbapi_connection
                assert dbapi.connect_timeout == 1
                assert dbapi._read_timeout is None
                assert conn.execute(text("SELECT SLEEP(2)")).scalar() == 0
            engine.dispose()  # the second round opens a new connection
    finally:
        engine.dispose()


def test_a_read_timeout_the_user_set_is_kept(mariadb_jdbc):
    url = jdbc_to_sqlalchemy(mariadb_jdbc).update_query_dict({"read_timeout": "7"})
    engine = engine_for(url, None, None)
    try:
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection._read_timeout == 7
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("params", "needle"),
    [("sslmode=require", "SSL"), ("ssl=true", "SSL"), ("sslmode=verify-ca", "")],
)
def test_postgres_tls_demanded_of_a_server_without_it_fails_clearly(postgres_jdbc, params, needle):
    """A server without TLS (tests/proxies/pg_proxy.py answers the SSLRequest 'N', as a server
    with ssl = off does): a connection that requires TLS fails at once with libpq's
    reason (connectTimeout bounds it in any case)."""
    proxy = PostgresProxy(("127.0.0.1", 5432))
    jdbc = postgres_jdbc.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    engine = create_engine(jdbc_to_sqlalchemy(_pg_url(jdbc, f"{params}&connectTimeout=5")))
    try:
        with pytest.raises(OperationalError) as info:
            engine.connect().close()
    finally:
        engine.dispose()
        proxy.close()
    message = str(info.value.orig)
    assert needle in message
    assert "SSL" in message or "root certificate" in message


@pytest.mark.parametrize("params", ["sslMode=REQUIRED", "useSSL=true", "sslMode=VERIFY_CA"])
def test_mariadb_tls_demanded_of_a_server_without_it_fails_clearly(mariadb_jdbc, params):
    engine = create_engine(jdbc_to_sqlalchemy(f"{mariadb_jdbc}&{params}&connectTimeout=5000"))
    try:
        with pytest.raises(OperationalError) as info:
            engine.connect().close()
    finally:
        engine.dispose()
    assert "SSL is required but the server doesn't support it" in str(info.value.orig)


# ------------------------------------------------------------------ repr()
def test_dual_writer_repr_shows_no_secret(broker, postgres_jdbc):
    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "repr-test"}
    for database, kwargs in [
        (f"{postgres_jdbc}&password={SECRET}", {}),
        (postgres_jdbc, {"password": SECRET}),
        (f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1/test?sslpassword={SECRET}", {}),
    ]:
        writer = DualWriter(conf, database, **kwargs)
        try:
            shown = repr(writer)
        finally:
            writer.close()
        assert SECRET not in shown
        assert shown.startswith("DualWriter(transactional_id='repr-test', database='postgresql")
        assert "127.0.0.1" in shown and "not started" in shown


def test_sink_repr_shows_no_secret():
    from kafka_txn.spark.sink import KafkaJdbcSink

    sink = KafkaJdbcSink(
        transactional_id_prefix="repr",
        url=f"jdbc:postgresql://db.example/shop?user=app&password={SECRET}&sslmode=require",
        password=SECRET,
        dbtable="orders",
        kafka={"bootstrap.servers": "k:9092", "sasl.password": SECRET,
               "sasl.oauthbearer.client.secret": SECRET, "ssl.key.pem": SECRET},
    )  # fmt: skip
    for shown in (repr(sink), repr(sink.options), str(sink.options)):
        assert SECRET not in shown
        assert "db.example/shop?user=app&password=***&sslmode=require" in shown
        assert "'sasl.password': '***'" in shown and "'bootstrap.servers': 'k:9092'" in shown


# ------------------------------------------------------------------ Spark: on the driver
def test_spark_sink_refuses_a_bad_url_parameter_when_built_before_any_job(spark):
    """Before this check, psycopg/PyMySQL met the parameter inside every task. Now the
    sink's constructor refuses it (the options= spelling too): no Spark job runs."""
    from kafka_txn.spark.sink import KafkaJdbcSink

    sc = spark.sparkContext
    group = f"jdbc-guard-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, "a sink with an unsupported JDBC URL parameter")
    url = (
        "jdbc:mysql://127.0.0.1:3306/test?useSSL=false&rewriteBatchedStatements=true"
        f"&password={SECRET}"
    )
    try:
        frame = spark.createDataFrame([("x",)], "value string")
        with pytest.raises(ConfigurationError) as built:  # the constructor, not write()
            KafkaJdbcSink(
                transactional_id_prefix="guard", url=url, dbtable="t",
                kafka={"bootstrap.servers": "127.0.0.1:9"},
            )  # fmt: skip
        with pytest.raises(ConfigurationError) as options:
            KafkaJdbcSink(options={"url": url, "dbtable": "t", "transactionalIdPrefix": "guard",
                                   "kafka.bootstrap.servers": "127.0.0.1:9"})  # fmt: skip
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    for info in (built, options):
        message = str(info.value)
        assert "unsupported parameter(s) 'rewriteBatchedStatements'" in message
        assert SECRET not in message
    assert sc.statusTracker().getJobIdsForGroup(group) == []  # no job ran for the sink
    sc.setJobGroup(group, "the probe sees a job when there is one")
    try:
        assert frame.count() == 1
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert sc.statusTracker().getJobIdsForGroup(group) != []


def test_spark_sink_refuses_kafka_settings_two_phase_commit_refuses_before_any_job(spark):
    """Each task's DualWriter refuses a Kafka setting its coordinator client cannot
    honour (ssl.keystore.location) or that transactions forbid (enable.idempotence=false);
    the sink's constructor refuses it on the driver, without building a producer and
    before any Spark job."""
    from kafka_txn.spark.sink import KafkaJdbcSink

    sc = spark.sparkContext
    group = f"kafka-guard-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, "sinks with Kafka settings two-phase commit refuses")
    messages = []
    try:
        for kafka, needle in [
            ({"ssl.keystore.location": "/x.p12", "ssl.keystore.password": SECRET},
             "ssl.keystore.location is not supported by kafka-txn's coordinator client"),
            ({"ssl.engine.id": "pkcs11"}, "ssl.engine.id"),
            ({"enable.idempotence": "false"}, "enable.idempotence=false cannot be used"),
            ({"transaction.timeout.ms": 10}, "transaction.timeout.ms=10 is too small"),
        ]:  # fmt: skip
            with pytest.raises(ConfigurationError) as built:
                KafkaJdbcSink(
                    transactional_id_prefix="guard", url="jdbc:sqlite:/tmp/guard.db",
                    dbtable="t", kafka={"bootstrap.servers": "127.0.0.1:9", **kafka},
                )  # fmt: skip
            options = {f"kafka.{k}": v for k, v in kafka.items()}
            with pytest.raises(ConfigurationError) as spelled:
                KafkaJdbcSink(options={"url": "jdbc:sqlite:/tmp/guard.db", "dbtable": "t",
                                       "transactionalIdPrefix": "guard",
                                       "kafka.bootstrap.servers": "127.0.0.1:9",
                                       **options})  # fmt: skip
            messages += [(str(built.value), needle), (str(spelled.value), needle)]
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    for message, needle in messages:
        assert needle in message
        assert SECRET not in message
    assert sc.statusTracker().getJobIdsForGroup(group) == []  # no job ran for the sinks
    sc.setJobGroup(group, "the probe sees a job when there is one")
    try:
        assert spark.createDataFrame([("x",)], "value string").count() == 1
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert sc.statusTracker().getJobIdsForGroup(group) != []
