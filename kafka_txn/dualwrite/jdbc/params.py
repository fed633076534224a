"""The JDBC URL parameters ``kafka_txn.dualwrite.jdbc.urls`` maps onto psycopg (libpq)
and PyMySQL, one function per parameter, each returning the driver's query arguments or raising
``ConfigurationError`` naming the parameter (the table is in ``kafka_txn.dualwrite.jdbc.urls``'s
docstring)."""

from __future__ import annotations

import math
import re
import ssl
from collections.abc import Callable
from typing import Final

from kafka_txn.errors import ConfigurationError

_BLANKS: Final = " \t\n\r\f\v"  # PostgreSQL's scanner_isspace()
_Mapper = Callable[[str], dict[str, str]]


def _flag(name: str, value: str, extra: tuple[str, ...] = ()) -> bool:
    """A Java boolean property: true/false (and Connector/J's yes/no), any case."""
    text = value.strip().lower()
    if text in ("true", "yes", *extra):
        return True
    if text in ("false", "no"):
        return False
    raise ConfigurationError(f"JDBC URL parameter {name}={value!r} must be true or false")


def _count(name: str, value: str, unit: str, limit: int) -> int:
    if not re.fullmatch(r"[0-9]+", value.strip()) or int(value) > limit:
        raise ConfigurationError(
            f"JDBC URL parameter {name}={value!r} must be a whole number of {unit} "
            f"(0 to {limit}; 0 is no limit)"
        )
    return int(value)


# PostgreSQL -------------------------------------------------------------------------
_PG_SSLMODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _pg_sslmode(value: str) -> dict[str, str]:
    mode = value.strip().lower()
    if mode not in _PG_SSLMODES:
        raise ConfigurationError(
            f"JDBC URL parameter sslmode={value!r} is not one of {', '.join(_PG_SSLMODES)}"
        )
    return {"sslmode": mode}


def _pg_ssl(value: str) -> dict[str, str]:
    # pgJDBC SslMode.of(): ssl=true (or a bare `ssl`) without sslmode is verify-full.
    on = _flag("ssl", value, extra=("",))
    return {"sslmode": "verify-full" if on else "prefer"}


def _schema_names(value: str) -> list[str]:
    """The names in a search_path value, split as PostgreSQL's SplitIdentifierString
    does (varlena.c): comma-separated, each unquoted or in double quotes (``""`` is one
    quote), blanks around them ignored. Raises ConfigurationError if it is not such a
    list."""
    names: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in _BLANKS:
            i += 1
        if i < n and value[i] == '"':
            j, name = i + 1, ""
            while True:
                end = value.find('"', j)
                if end < 0:
                    raise ConfigurationError(
                        f"currentSchema={value!r}: a quoted schema name is not closed"
                    )
                name += value[j:end]
                if value.startswith('"', end + 1):  # "" inside quotes: one quote
                    name += '"'
                    j = end + 2
                    continue
                i = end + 1
                break
            if not name:
                raise ConfigurationError(f"currentSchema={value!r}: an empty quoted name")
        else:
            start = i
            while i < n and value[i] not in _BLANKS and value[i] not in ',"':
                i += 1
            name = value[start:i]
            if not name:
                raise ConfigurationError(
                    f"currentSchema={value!r} is not a comma-separated list of schema names"
                )
        names.append(name)
        while i < n and value[i] in _BLANKS:
            i += 1
        if i == n:
            return names
        if value[i] != ",":
            raise ConfigurationError(
                f"currentSchema={value!r} is not a comma-separated list of schema names "
                '(quote a name with blanks or capitals: "My Schema")'
            )
        i += 1


def _pg_current_schema(value: str) -> dict[str, str]:
    _schema_names(value)
    # libpq passes `options` to the server, which splits it on blanks unless they are
    # escaped with a backslash (pg_split_opts, postinit.c): escape blanks and backslashes.
    escaped = re.sub(r"([ \t\n\r\f\v\\])", r"\\\1", value)
    return {"options": f"-c search_path={escaped}"}


def _pg_application_name(value: str) -> dict[str, str]:
    return {"application_name": value}


def _pg_connect_timeout(value: str) -> dict[str, str]:
    # pgJDBC's connectTimeout and libpq's connect_timeout both count seconds.
    return {"connect_timeout": str(_count("connectTimeout", value, "seconds", 2**31 - 1))}


_PG_PARAMS: Final[dict[str, tuple[str, _Mapper]]] = {
    "ssl": ("ssl", _pg_ssl),
    "sslmode": ("sslmode", _pg_sslmode),
    "currentschema": ("currentSchema", _pg_current_schema),
    "applicationname": ("ApplicationName", _pg_application_name),
    "connecttimeout": ("connectTimeout", _pg_connect_timeout),
}


# MySQL / MariaDB --------------------------------------------------------------------
_MYSQL_SSL_MODES: Final = {
    "disabled": "DISABLED", "disable": "DISABLED",
    "preferred": "PREFERRED",
    "required": "REQUIRED", "trust": "REQUIRED",
    "verify_ca": "VERIFY_CA", "verify-ca": "VERIFY_CA",
    "verify_identity": "VERIFY_IDENTITY", "verify-full": "VERIFY_IDENTITY",
}  # fmt: skip


def _system_ca() -> dict[str, str]:
    """The system's CA bundle as PyMySQL's ``ssl_ca``/``ssl_capath``: PyMySQL checks the
    host name only when one of them is given (``Connection._create_ssl_ctx``)."""
    paths = ssl.get_default_verify_paths()
    if paths.cafile:
        return {"ssl_ca": paths.cafile}
    if paths.capath:
        return {"ssl_capath": paths.capath}
    raise ConfigurationError(
        "sslMode=VERIFY_IDENTITY needs the system's CA certificates, and Python's ssl "
        "module finds none (ssl.get_default_verify_paths()): install them or set "
        "SSL_CERT_FILE"
    )


def _mysql_ssl(mode: str) -> dict[str, str]:
    """PyMySQL arguments, as URL query values SQLAlchemy's mysql dialect passes on."""
    if mode == "DISABLED":
        return {"ssl_disabled": "true"}  # a non-empty string: PyMySQL tests truthiness
    if mode == "PREFERRED":
        return {}
    if mode == "REQUIRED":  # the dialect builds ssl={"check_hostname": False}: TLS, CERT_NONE
        return {"ssl_check_hostname": "false"}
    if mode == "VERIFY_CA":  # CERT_REQUIRED against the default CAs, no host name check
        return {"ssl_verify_cert": "true"}
    return {**_system_ca(), "ssl_check_hostname": "true"}


def _mysql_ssl_mode(value: str) -> dict[str, str]:
    mode = _MYSQL_SSL_MODES.get(value.strip().lower())
    if mode is None:
        raise ConfigurationError(
            f"JDBC URL parameter sslMode={value!r} is not one of DISABLED, PREFERRED, "
            "REQUIRED, VERIFY_CA, VERIFY_IDENTITY (or MariaDB's disable, trust, verify-ca, "
            "verify-full)"
        )
    return _mysql_ssl(mode)


def _mysql_use_ssl(value: str) -> dict[str, str]:
    return _mysql_ssl("REQUIRED" if _flag("useSSL", value) else "DISABLED")


_UTC_NAMES: Final = frozenset(
    {"utc", "gmt", "ut", "z", "zulu", "uct", "universal", "greenwich", "gmt0", "gmt+0",
     "gmt-0", "utc+0", "utc-0"}
    | {f"etc/{name}" for name in ("utc", "gmt", "uct", "universal", "zulu", "greenwich",
                                  "gmt0", "gmt+0", "gmt-0")}
)  # fmt: skip
# MariaDB's time_zone offsets (its time_zone documentation; both ends connect to MariaDB
# 10.11 in tests/dualwrite/test_jdbc.py): -12:59 to +13:00, in minutes.
_MAX_EAST: Final = 13 * 60
_MAX_WEST: Final = 12 * 60 + 59
_OFFSET: Final = re.compile(r"(?:gmt|utc|ut)?\s*([+-])(\d{1,2})(?::?(\d{2}))?")
_ETC_GMT: Final = re.compile(r"etc/gmt([+-])(\d{1,2})")


def _mysql_time_zone(zone: str) -> str:
    """``serverTimezone`` as a MySQL/MariaDB ``time_zone`` offset (``+08:00``); refuses
    what is not a fixed offset, and offsets outside -12:59 to +13:00: MariaDB refuses
    them when connecting (error 1298, "Unknown or incorrect time zone"), and a
    ``jdbc:mysql:`` URL may point at a MariaDB as well as at a MySQL (which takes -13:59
    to +14:00), so both subprotocols are held to the range both servers take."""
    text = zone.strip().lower()
    if text in _UTC_NAMES:
        return "+00:00"
    sign, hours, minutes = "", 0, 0
    if match := _ETC_GMT.fullmatch(text):  # POSIX style: Etc/GMT-8 is UTC+8
        sign = "-" if match.group(1) == "+" else "+"
        hours = int(match.group(2))
    elif match := _OFFSET.fullmatch(text):
        sign, hours, minutes = match.group(1), int(match.group(2)), int(match.group(3) or 0)
    else:
        hint = " (a '+' in a URL is written %2B)" if re.fullmatch(r"(gmt|utc)\s+\d.*", text) else ""
        raise ConfigurationError(
            f"serverTimezone={zone!r} is not a fixed offset{hint}: use UTC, GMT+8, "
            "UTC-05:30 or +08:00. A named zone is refused: its offset changes with daylight "
            "saving, and a MariaDB without time zone tables does not know it"
        )
    total = hours * 60 + minutes
    if minutes >= 60 or total > (_MAX_EAST if sign == "+" else _MAX_WEST):
        raise ConfigurationError(
            f"serverTimezone={zone!r} is outside -12:59 to +13:00, the offsets both MariaDB "
            "and MySQL take (MariaDB refuses the others when connecting; MySQL alone takes "
            "-13:59 to +14:00: for those, give SQLAlchemy a mysql+pymysql:// URL with "
            "init_command)"
        )
    return "+00:00" if total == 0 else f"{sign}{hours:02d}:{minutes:02d}"


def _mysql_server_timezone(value: str) -> dict[str, str]:
    return {"init_command": f"SET time_zone = '{_mysql_time_zone(value)}'"}


# Java charset names (and their MySQL names), as spelled in the docs -> the MySQL
# character sets PyMySQL knows. Matched case-insensitively; nothing else is accepted
# (docs/guide/dual-write.md lists these names, checked by tests/dualwrite/test_jdbc.py).
CHARSETS: Final = {
    "UTF-8": "utf8mb4", "utf8": "utf8mb4", "utf8mb4": "utf8mb4",
    "ISO-8859-1": "latin1", "ISO8859_1": "latin1", "ISO_8859_1": "latin1",
    "latin1": "latin1", "Cp1252": "latin1", "windows-1252": "latin1",
    "US-ASCII": "ascii", "ascii": "ascii",
}  # fmt: skip
_CHARSET_BY_LOWER: Final = {name.lower(): charset for name, charset in CHARSETS.items()}


def _accepted_encodings() -> str:
    groups: dict[str, list[str]] = {}
    for name, charset in CHARSETS.items():
        groups.setdefault(charset, []).append(name)
    return "; ".join(f"{', '.join(names)} (MySQL's {cs})" for cs, names in groups.items())


def _mysql_character_encoding(value: str) -> dict[str, str]:
    charset = _CHARSET_BY_LOWER.get(value.strip().lower())
    if charset is None:
        raise ConfigurationError(
            f"characterEncoding={value!r} has no mapping here; the accepted names (any "
            f"case) are {_accepted_encodings()}"
        )
    return {"charset": charset}


def _mysql_use_unicode(value: str) -> dict[str, str]:
    # Connector/J's default, and in nearly every URL copied from a Spark job; PyMySQL
    # always decodes to str, so true asks for nothing. false (bytes) has no equivalent.
    if not _flag("useUnicode", value):
        raise ConfigurationError(
            "useUnicode=false has no equivalent here: PyMySQL always decodes text; remove "
            "the parameter"
        )
    return {}


_PYMYSQL_MAX_TIMEOUT: Final = 31_536_000  # seconds; PyMySQL refuses more (and 0)


def _mysql_connect_timeout(value: str) -> dict[str, str]:
    # Connector/J and MariaDB Connector/J count milliseconds; PyMySQL seconds.
    ms = _count("connectTimeout", value, "milliseconds", _PYMYSQL_MAX_TIMEOUT * 1000)
    seconds = _PYMYSQL_MAX_TIMEOUT if ms == 0 else max(1, math.ceil(ms / 1000))
    return {"connect_timeout": str(seconds)}


_MYSQL_PARAMS: Final[dict[str, tuple[str, _Mapper]]] = {
    "usessl": ("useSSL", _mysql_use_ssl),
    "sslmode": ("sslMode", _mysql_ssl_mode),
    "servertimezone": ("serverTimezone", _mysql_server_timezone),
    "characterencoding": ("characterEncoding", _mysql_character_encoding),
    "useunicode": ("useUnicode", _mysql_use_unicode),
    "connecttimeout": ("connectTimeout", _mysql_connect_timeout),
}

PARAMS: Final = {"postgresql": _PG_PARAMS, "mysql": _MYSQL_PARAMS, "mariadb": _MYSQL_PARAMS}
OVERRIDDEN: Final = {"postgresql": ("ssl", "sslmode"), "mysql": ("usessl", "sslmode"),
                      "mariadb": ("usessl", "sslmode")}  # fmt: skip
"""(weaker, stronger): the first is ignored when the second is given, as in the drivers."""


def supported_parameters(subprotocol: str) -> list[str]:
    """The parameter names a ``jdbc:<subprotocol>:`` URL takes, as the Java drivers spell
    them."""
    return ["user", "password", *(name for name, _ in PARAMS.get(subprotocol, {}).values())]
