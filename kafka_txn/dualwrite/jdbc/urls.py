"""JDBC URLs, as Spark users write them, to SQLAlchemy URLs.

    jdbc:postgresql://host[:port]/db[?param=value&...]  -> postgresql+psycopg:// (psycopg 3)
    jdbc:mysql://host[:port]/db[?...]                  -> mysql+pymysql:// (PyMySQL)
    jdbc:mariadb://host[:port]/db[?...]                -> mysql+pymysql://
    jdbc:sqlite:path  |  jdbc:sqlite::memory:          -> sqlite:///path (no parameters)

The database name and parameter values are percent-decoded (``%2B`` is ``+``; a bare
``+`` is a space, as in the Java drivers). Parameter names are case-insensitive; each may
be given once. Every parameter is either mapped onto the Python driver as below or
refused, when the URL is parsed (for the Spark sink: on the driver, when the sink is
built), with a ``ConfigurationError`` naming it and listing the supported ones.

Every database:
    user, password          the credentials; the ``user=``/``password=`` arguments win.

PostgreSQL (pgJDBC's names -> libpq's, which psycopg uses):
    ssl=true|false          ``sslmode=verify-full`` | ``sslmode=prefer``: what pgJDBC does
                            (``SslMode.of``: ``ssl`` without ``sslmode`` verifies the
                            certificate and the host name; ``ssl=false`` does not forbid
                            TLS). Ignored when ``sslmode`` is given, as in pgJDBC.
    sslmode=disable|allow|prefer|require|verify-ca|verify-full
                            libpq's ``sslmode``, same names and meaning.
    currentSchema=s[,s...]  ``options=-c search_path=s[,s...]``: the search path the session
                            starts with (pgJDBC sends it as the ``search_path`` startup
                            parameter; unquoted names fold to lower case, ``"My Schema"``
                            keeps its case and spaces). Checked here as a list of names.
    ApplicationName=x       ``application_name`` (``pg_stat_activity``).
    connectTimeout=seconds  ``connect_timeout``, in seconds in both, for the whole
                            connection (0 is psycopg's default, 130 s; under 2 is 2).

MySQL and MariaDB (Connector/J and MariaDB Connector/J names -> PyMySQL's arguments):
    useSSL=true|false       true: TLS without certificate checks (Connector/J 8 turns
                            ``useSSL=true`` into ``sslMode=REQUIRED``); false: no TLS.
                            Ignored when ``sslMode`` is given, as in Connector/J.
    sslMode=DISABLED|PREFERRED|REQUIRED|VERIFY_CA|VERIFY_IDENTITY (case-insensitive;
                            MariaDB's disable|trust|verify-ca|verify-full are the same
                            four): no TLS (``ssl_disabled``) | PyMySQL's default (TLS when
                            the server offers it, from PyMySQL 1.2) | TLS, no certificate
                            check | the certificate checked against the system's CAs |
                            that and the host name (the system CA bundle passed as
                            ``ssl_ca``, which PyMySQL needs before it checks host names).
    serverTimezone=zone     the session's ``time_zone``, set by PyMySQL's ``init_command``
                            (``SET time_zone = '+00:00'``), so that ``NOW()`` and TIMESTAMP
                            columns use the zone the Java job used. Only fixed offsets:
                            UTC/GMT/Z and their ``Etc/`` forms are ``+00:00`` (a MariaDB
                            without time zone tables refuses named zones), ``GMT+8``,
                            ``UTC-05:30``, ``+08:00``, ``Etc/GMT-8``. A zone with daylight
                            saving (``Europe/Paris``) is refused: no single offset fits.
                            -12:59 to +13:00, what MariaDB takes, for jdbc:mysql too (it
                            may point at a MariaDB; MySQL alone takes -13:59 to +14:00).
    characterEncoding=name  PyMySQL's ``charset``, from ``_jdbc_params.CHARSETS`` (any
                            case): UTF-8, utf8, utf8mb4 -> utf8mb4 (MySQL's full UTF-8);
                            ISO-8859-1, ISO8859_1, ISO_8859_1, latin1, Cp1252,
                            windows-1252 -> latin1; US-ASCII, ascii -> ascii. No other.
    useUnicode=true         nothing: PyMySQL always decodes text (false is refused).
    connectTimeout=ms       ``connect_timeout`` in seconds: the Java drivers count
                            milliseconds, PyMySQL seconds (rounded up; 0, no limit, is
                            PyMySQL's maximum, one year). Engines built by
                            ``bounded_engine`` bound the handshake's reads by it too.

Not supported, each with its own error: several hosts (``h1,h2``, ``[h1,h2]``, pgJDBC's
and Connector/J's failover lists, ``jdbc:mysql:loadbalance:``, ``replication:``, MariaDB's
``failover:``, ``sequential:``, ``aurora:``, ``mysql+srv``), MySQL's ``address=(...)`` and
``(host=...,port=...)`` forms, port 0, credentials in ``user:password@host`` form, SQL
Server's ``;name=value`` properties (a ``;`` in the database name; ``;name=`` or a
password-like ``name=`` in a parameter's value), ``&name=`` in the database name, and
control characters (C0 and DEL; percent-encoded too, but in the password).

Secrets: errors never echo a password. ``redact_jdbc_url`` (internal, in
``kafka_txn.dualwrite.jdbc.redact``) is the one helper that makes a URL printable; what it cannot
parse, or a URL with a password-like ``name=`` before its ``?``, it shows only up to its
subprotocol.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine

from kafka_txn.dualwrite.jdbc import redact as _jdbc_redact
from kafka_txn.dualwrite.jdbc.params import OVERRIDDEN, PARAMS, supported_parameters
from kafka_txn.dualwrite.jdbc.redact import holds_secret_assignment, mask_secrets
from kafka_txn.errors import ConfigurationError

__all__ = ["SUPPORTED_SCHEMES", "jdbc_to_sqlalchemy"]

# Internal, here for the modules that print URLs and settings (kafka_txn.dualwrite.jdbc.redact).
is_secret_name = _jdbc_redact.is_secret_name
redact_jdbc_url = _jdbc_redact.redact_jdbc_url
redact_settings = _jdbc_redact.redact_settings

_DRIVERS: Final = {
    "postgresql": ("postgresql+psycopg", 5432),
    "mysql": ("mysql+pymysql", 3306),
    "mariadb": ("mysql+pymysql", 3306),
}
SUPPORTED_SCHEMES = ("jdbc:postgresql://", "jdbc:mysql://", "jdbc:mariadb://", "jdbc:sqlite:")
_MAX_URL = 4096
_SHOWN = 160
# C0 controls and DEL: no driver wants one in a host, a database name or a parameter,
# and a terminal or log reader may act on them (ESC sequences).
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
# ";name=" inside a value or after the database: SQL Server's property syntax, which
# pgJDBC, Connector/J and MariaDB Connector/J do not have (they take ?name=value&...).
_SEMICOLON_PROPERTY: Final = re.compile(r";\s*[A-Za-z][A-Za-z0-9_.-]*\s*=")
_PARAM_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
# "&name=" in a database name: parameters written without the '?' before them.
_AMPERSAND_PARAMETER: Final = re.compile(r"&\s*[A-Za-z][A-Za-z0-9_.-]*\s*=")


def _shown(url: str) -> str:
    text = redact_jdbc_url(url)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _bad(url: str, problem: str) -> ConfigurationError:
    # mask_secrets: a last guard for a problem that quotes a parameter's value.
    return ConfigurationError(
        f"invalid JDBC URL {_shown(url)!r}: {mask_secrets(problem)}. "
        f"Supported: {', '.join(SUPPORTED_SCHEMES)}"
    )


def _control(text: str) -> str | None:
    """The first C0 control character or DEL in ``text``, as ``U+00XX``; None if none."""
    found = _CONTROL.search(text)
    return None if found is None else f"U+{ord(found.group(0)):04X}"


_HA_PREFIXES: Final = re.compile(
    r"(loadbalance|replication|failover|sequential|aurora|load-balance-read-only)(:|//)"
)


def _check_value(url: str, scheme: str, name: str, value: str) -> None:
    """Refuses, without quoting it, a parameter value (``password``'s excepted) holding
    a control character, ``;name=`` properties or a secret-looking ``name=``: no driver
    reads properties there, so ``?user=root;password=pw`` would be a user name holding
    the password, printed wherever the user name is."""
    if name.lower() == "password":
        return  # any text but NUL (checked by the caller): it is never shown
    if (code := _control(value)) is not None:
        raise _bad(url, f"parameter {name!r} contains a control character ({code})")
    if _SEMICOLON_PROPERTY.search(value) or holds_secret_assignment(value):
        raise _bad(
            url,
            f"the value of parameter {name!r} holds ';name=value' properties or a "
            f"password, which jdbc:{scheme} does not read there: write each parameter as "
            "?name=value, joined by '&' (a password in the password parameter or argument)",
        )


def _parameters(url: str, scheme: str, query: str) -> tuple[dict[str, str], dict[str, str]]:
    """(credentials, driver query) from the URL's parameters; refuses unknown ones."""
    pairs = parse_qsl(query, keep_blank_values=True)
    table = PARAMS[scheme]
    seen: dict[str, str] = {}
    unknown: list[str] = []
    for name, value in pairs:
        if not _PARAM_NAME.fullmatch(name):
            raise _bad(url, "a parameter name is malformed (parameters are name=value, "
                            "joined by '&')")  # fmt: skip
        key = name.lower()
        if "\x00" in value:  # no driver takes one; libpq's strings end there
            raise _bad(url, f"parameter {name!r} contains a NUL character (%00)")
        _check_value(url, scheme, name, value)
        if key in seen:
            raise _bad(url, f"parameter {name!r} is given twice")
        seen[key] = value
        if key not in table and key not in ("user", "password"):
            unknown.append(name)
    if unknown:
        raise _bad(
            url,
            f"unsupported parameter(s) {', '.join(map(repr, unknown))} for jdbc:{scheme}: "
            f"the supported ones are {', '.join(supported_parameters(scheme))} "
            "(see kafka_txn.dualwrite.jdbc.urls)",
        )
    weaker, stronger = OVERRIDDEN[scheme]
    if stronger in seen:
        seen.pop(weaker, None)
    credentials: dict[str, str] = {k: seen.pop(k) for k in ("user", "password") if k in seen}
    driver: dict[str, str] = {}
    for key, value in seen.items():
        try:
            driver.update(table[key][1](value))
        except ConfigurationError as exc:
            raise _bad(url, str(exc)) from None
    return credentials, driver


def _check_authority(url: str, scheme: str, authority: str) -> None:
    """Refuses the host forms a DualWriter cannot use, each with its own reason; before
    ``urlsplit``, whose errors would quote the host (and mistake ``[h1,h2]`` for a bad
    IPv6 address)."""
    if "@" in authority:
        raise _bad(url, "put credentials in ?user=&password= or the arguments, not user@host")
    if "(" in authority or "address=" in authority.lower():
        raise _bad(
            url,
            "the address=(host=...)(port=...) and (host=...,port=...) host syntaxes are not "
            f"supported: write jdbc:{scheme}://host[:port]/database",
        )
    if "," in authority:
        raise _bad(
            url,
            "multi-host URLs (host1,host2 or [host1,host2]) are not supported: name one host "
            "(a DualWriter writes to one database; put a proxy or a DNS name in front of a "
            "cluster)",
        )


def jdbc_to_sqlalchemy(url: str, *, user: str | None = None, password: str | None = None) -> URL:
    """The SQLAlchemy URL for a JDBC URL (see the module docstring)."""
    if not isinstance(url, str):
        raise ConfigurationError(f"a JDBC URL is a str, got {type(url).__name__}")
    if len(url) > _MAX_URL:
        raise _bad(url, f"longer than {_MAX_URL} characters")
    if (code := _control(url)) is not None:
        raise _bad(url, f"it contains a control character ({code})")
    if not url.startswith("jdbc:"):
        raise _bad(url, "it does not start with 'jdbc:'")
    rest = url[len("jdbc:") :]
    scheme, sep, tail = rest.partition(":")
    if not sep:
        raise _bad(url, "no ':' after the subprotocol")
    if scheme == "sqlite":
        return _sqlite(url, tail)
    if scheme in ("mysql+srv", "mysqlx", "mysqlx+srv"):
        raise _bad(url, f"jdbc:{scheme}: (DNS SRV, X Protocol) is not supported: name one host")
    if scheme not in _DRIVERS:
        raise _bad(url, f"unsupported subprotocol {scheme!r}")
    if scheme != "postgresql" and (ha := _HA_PREFIXES.match(tail)):
        raise _bad(
            url,
            f"multi-host URLs (jdbc:{scheme}:{ha.group(1)}:) are not supported: name one "
            "host, jdbc:mysql://host[:port]/database (a DualWriter writes to one database)",
        )
    if not tail.startswith("//"):
        raise _bad(url, f"expected jdbc:{scheme}://host[:port]/database")
    _check_authority(url, scheme, re.split(r"[/?#]", tail[2:], maxsplit=1)[0])
    try:  # no fragments: a '#' is part of the text, as for the Java drivers
        parts = urlsplit(f"x:{tail}", allow_fragments=False)
    except ValueError:  # unbalanced [ ]; the parser's message would quote the host
        raise _bad(url, "bad host (an IPv6 address is written in [brackets])") from None
    try:
        port = parts.port
    except ValueError:
        # Not the parser's message: it quotes the "port", which may be a password
        # written as user:password without the @host after it.
        raise _bad(url, "bad host or port (a port is a number, 1 to 65535)") from None
    if port == 0:  # not "the default": the Java drivers would try to connect to port 0
        raise _bad(url, "port 0 is not a port: give 1 to 65535, or none for the default")
    if not parts.hostname:
        raise _bad(url, "no host")
    if _control(unquote(parts.hostname)) is not None:
        raise _bad(url, "the host contains a control character (percent-encoded)")
    database = unquote(parts.path[1:])
    if not parts.path.startswith("/") or not database or "/" in parts.path[1:]:
        raise _bad(url, "expected exactly one database name after the host")
    if (code := _control(database)) is not None:
        raise _bad(url, f"the database name contains a control character ({code})")
    if ";" in database:
        raise _bad(
            url,
            f"the database name holds ';': ';name=value' properties are not JDBC URL syntax "
            f"for jdbc:{scheme} (that is SQL Server's): write "
            f"jdbc:{scheme}://host[:port]/database?name=value&name=value",
        )
    if _AMPERSAND_PARAMETER.search(database) or holds_secret_assignment(database):
        raise _bad(
            url,
            "the database name holds '&name=value' or a password: parameters come after a "
            f"'?': jdbc:{scheme}://host[:port]/database?name=value&name=value",
        )
    credentials, query = _parameters(url, scheme, parts.query)
    driver, default_port = _DRIVERS[scheme]
    return URL.create(
        driver,
        username=user if user is not None else credentials.get("user"),
        password=password if password is not None else credentials.get("password"),
        host=parts.hostname,
        port=port or default_port,
        database=database,
        query=query,
    )


def _sqlite(url: str, tail: str) -> URL:
    path, sep, _ = tail.partition("?")
    if sep:
        raise _bad(url, "SQLite URLs take no parameters here: jdbc:sqlite:/abs/path.db")
    if path in ("", ":memory:"):
        return URL.create("sqlite")  # SQLAlchemy's in-memory database
    if path.startswith("//"):
        raise _bad(url, "SQLite takes a file path: jdbc:sqlite:/abs/path.db or jdbc:sqlite:rel.db")
    return URL.create("sqlite", database=path)


# ------------------------------------------------------------------ engines
_PYMYSQL_CONNECT_TIMEOUT: Final = 10.0  # seconds: PyMySQL's default connect_timeout


def bounded_engine(
    url: URL, *, connect_args: Mapping[str, Any] | None = None, **kwargs: Any
) -> Engine:
    """``create_engine(url, connect_args=..., **kwargs)``, whose PyMySQL connections
    cannot hang in the MySQL handshake. Internal: every engine kafka-txn builds from a
    URL (``dualwrite.engine_for``, the CLI) goes through it.

    PyMySQL's ``connect_timeout`` bounds only the TCP connect: the handshake's reads
    (``Connection.connect`` -> ``_get_server_information`` -> ``_read_packet``) wait up to
    ``read_timeout``, None by default, so a port that accepts and never answers (a
    Kafka broker, PostgreSQL, a stuck proxy) hangs ``connect()`` forever. Here the
    connection is opened with ``read_timeout=connect_timeout`` (the URL's, else
    PyMySQL's default of 10 s), and the ``connect`` pool event, which SQLAlchemy fires
    once PyMySQL's ``connect()`` and the dialect's own first queries are done (it is
    registered after them), puts ``read_timeout`` back to None. PyMySQL 1.1-2.2 compare
    ``self._read_timeout`` with the socket's current timeout before every packet read
    (``_read_packet``: ``if self._current_timeout != self._read_timeout:
    self._sock.settimeout(self._read_timeout)``), so queries after that wait as long as
    they take, as without this bound. A URL (or ``connect_args``) that sets
    ``read_timeout`` itself is left as it is."""
    args = dict(connect_args or {})
    bound = _handshake_bound(url, args)
    if bound is not None:
        args["read_timeout"] = bound
    engine = create_engine(url, connect_args=args, **kwargs)
    if bound is not None:
        event.listen(engine, "connect", _unbound_reads)
    return engine


def _handshake_bound(url: URL, connect_args: Mapping[str, Any]) -> float | None:
    """Seconds the handshake's reads may wait: PyMySQL's ``connect_timeout``; None when
    the driver is not PyMySQL, ``read_timeout`` is set, or ``connect_timeout`` is not a
    positive number (PyMySQL refuses it when connecting, as it did)."""
    if url.get_driver_name() != "pymysql" or "read_timeout" in url.query:
        return None
    if "read_timeout" in connect_args:
        return None
    given = connect_args.get("connect_timeout", url.query.get("connect_timeout"))
    if given is None:
        return _PYMYSQL_CONNECT_TIMEOUT
    try:
        seconds = float(given)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def _unbound_reads(dbapi_connection: Any, _record: Any) -> None:
    """After the handshake: PyMySQL's reads wait as long as they take again (the user
    set no ``read_timeout``); see ``bounded_engine``."""
    dbapi_connection._read_timeout = None  # PyMySQL reads it before each packet
