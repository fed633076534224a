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
    connectTimeout=seconds  ``connect_timeout``, in seconds in both (0: no limit).

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
    characterEncoding=name  PyMySQL's ``charset``: UTF-8/utf8 -> utf8mb4 (MySQL's full
                            UTF-8), ISO-8859-1/Cp1252/latin1 -> latin1, US-ASCII -> ascii;
                            others refused.
    useUnicode=true         nothing: PyMySQL always decodes text (false is refused).
    connectTimeout=ms       ``connect_timeout`` in seconds: the Java drivers count
                            milliseconds, PyMySQL seconds (rounded up; 0, no limit, is
                            PyMySQL's maximum, one year).

Not supported, each with its own error: several hosts (``h1,h2``, pgJDBC's and Connector/
J's failover lists, ``jdbc:mysql:loadbalance:``, ``replication:``, MariaDB's ``failover:``,
``sequential:``, ``aurora:``, ``address=(...)``, ``mysql+srv``), credentials in
``user:password@host`` form, control characters.

Secrets: errors never echo a password. ``redact_jdbc_url`` (internal) is the one helper
that makes a URL printable; what it cannot parse it shows only up to its subprotocol.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from ._extras import missing_extra

try:
    import sqlalchemy  # noqa: F401 - the [sql] extra is installed
except ImportError as exc:
    raise missing_extra("kafka_txn.jdbc", "sql", exc) from exc

from sqlalchemy.engine import URL

from ._jdbc_params import OVERRIDDEN, PARAMS, supported_parameters
from .errors import ConfigurationError

__all__ = ["SUPPORTED_SCHEMES", "jdbc_to_sqlalchemy"]

_DRIVERS: Final = {
    "postgresql": ("postgresql+psycopg", 5432),
    "mysql": ("mysql+pymysql", 3306),
    "mariadb": ("mysql+pymysql", 3306),
}
SUPPORTED_SCHEMES = ("jdbc:postgresql://", "jdbc:mysql://", "jdbc:mariadb://", "jdbc:sqlite:")
_MAX_URL = 4096
_SHOWN = 160

# ------------------------------------------------------------------ redaction
_SECRET_NAME: Final = re.compile(
    r"pass|pwd|secret|token|credential|private|key\.pem|api[._-]?key|jaas|oauthbearer\.config",
    re.IGNORECASE,
)
_PARAM_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_PREFIX: Final = re.compile(r"(?:jdbc:)?[A-Za-z][A-Za-z0-9+.-]*:(?://)?")
_HOSTPORT: Final = re.compile(r"(?:\[[0-9A-Fa-f:.%A-Za-z]*\]|[^\[\]:@]*)(?::\d*)?")


def is_secret_name(name: str) -> bool:
    """True for a setting or URL parameter whose value is a secret (``password``,
    ``sasl.password``, ``trustStorePassword``, ``ssl.key.pem``, ``*secret*``, ``*token*``)."""
    return bool(_SECRET_NAME.search(name))


def redact_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every secret's value (``is_secret_name``) shown as ``***``."""
    return {k: "***" if is_secret_name(str(k)) else v for k, v in settings.items()}


def redact_jdbc_url(url: object) -> str:
    """``url`` (a JDBC or SQLAlchemy URL, well formed or not) safe to print: a password
    in ``user:password@`` becomes ``***``, and so does the value of every password-like
    parameter (``is_secret_name``). Internal: every error, log line and ``repr()`` that
    shows a database URL goes through it.

    When the URL cannot be taken apart without guessing where a password ends (an ``@``
    outside one clean ``user:password@host`` or a secret's value, a port that is not a
    number, a parameter name that is not a name), only its subprotocol is kept:
    ``jdbc:postgresql://<redacted>``; text that does not start like a URL is not shown.
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    head, sep, query = url.partition("?")
    prefix_match = _PREFIX.match(head)
    if prefix_match is None:  # not a URL at all: nothing in it is known not to be secret
        return "<redacted>"
    coarse = f"{prefix_match.group(0)}<redacted>"
    pieces = []
    for segment in query.split("&") if sep else []:
        name, eq, _ = segment.partition("=")
        if segment and not _PARAM_NAME.fullmatch(unquote(name)):
            return coarse
        if "@" in segment and not is_secret_name(unquote(name)):
            return coarse  # perhaps the end of a password: "u:12?user=x@host"
        pieces.append(f"{name}=***" if eq and is_secret_name(unquote(name)) else segment)
    shown_query = sep + "&".join(pieces)
    if "//" not in head:
        if "@" in head and not head.startswith("jdbc:sqlite:"):
            return coarse
        return head + shown_query
    before, _, rest = head.partition("//")
    authority, slash, path = rest.partition("/")
    if "@" in path:
        return coarse
    if "@" in authority:
        userinfo, _, hosts = authority.rpartition("@")
        if "@" in userinfo:
            return coarse
        user, colon, _ = userinfo.partition(":")
        authority = f"{user}:***@{hosts}" if colon else f"***@{hosts}"  # token@host
    else:
        hosts = authority
    if not all(_HOSTPORT.fullmatch(h) for h in hosts.split(",")):
        return coarse
    return f"{before}//{authority}{slash}{path}{shown_query}"


def _shown(url: str) -> str:
    text = redact_jdbc_url(url)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _bad(url: str, problem: str) -> ConfigurationError:
    return ConfigurationError(
        f"invalid JDBC URL {_shown(url)!r}: {problem}. Supported: {', '.join(SUPPORTED_SCHEMES)}"
    )


_HA_PREFIXES: Final = re.compile(
    r"(loadbalance|replication|failover|sequential|aurora|load-balance-read-only)(:|//)"
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
            "(see kafka_txn.jdbc)",
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


def jdbc_to_sqlalchemy(url: str, *, user: str | None = None, password: str | None = None) -> URL:
    """The SQLAlchemy URL for a JDBC URL (see the module docstring)."""
    if not isinstance(url, str):
        raise ConfigurationError(f"a JDBC URL is a str, got {type(url).__name__}")
    if len(url) > _MAX_URL:
        raise _bad(url, f"longer than {_MAX_URL} characters")
    if any(ch in url for ch in "\r\n\x00"):
        raise _bad(url, "it contains a control character")
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
    try:  # no fragments: a '#' is part of the text, as for the Java drivers
        parts = urlsplit(f"x:{tail}", allow_fragments=False)
    except ValueError:  # unbalanced [ ]; the parser's message would quote the host
        raise _bad(url, "bad host (an IPv6 address is written in [brackets])") from None
    if "@" in parts.netloc:
        raise _bad(url, "put credentials in ?user=&password= or the arguments, not user@host")
    if "," in parts.netloc:
        raise _bad(
            url,
            "multi-host URLs (host1,host2) are not supported: name one host (a DualWriter "
            "writes to one database; put a proxy or a DNS name in front of a cluster)",
        )
    if "(" in parts.netloc or "address=" in parts.netloc.lower():
        raise _bad(url, "the address=(host=...)(port=...) host syntax is not supported")
    try:
        port = parts.port
    except ValueError:
        # Not the parser's message: it quotes the "port", which may be a password
        # written as user:password without the @host after it.
        raise _bad(url, "bad host or port (a port is a number, 0 to 65535)") from None
    if not parts.hostname:
        raise _bad(url, "no host")
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in parts.path.lstrip("/"):
        raise _bad(url, "expected exactly one database name after the host")
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
