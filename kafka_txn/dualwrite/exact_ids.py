"""Columns that hold ids the code compares exactly: the state table's transactional id,
the Spark sink's transactional-id prefix.

Kafka transactional ids are case-sensitive, and so is every comparison in kafka-txn's
own code; a column whose collation folds case (MySQL/MariaDB's default ``*_ci``
collations, a PostgreSQL nondeterministic collation, SQLite's ``NOCASE``) makes the
database treat ``Orders-1`` and ``orders-1`` as one key: two writers share one state row
and fence each other, two sinks share commit markers and skip each other's batches.

``exact_string`` is the type kafka-txn creates such columns with (``utf8mb4_bin`` on
MySQL/MariaDB; the default, exact, comparison elsewhere). ``inexact`` tells why an
existing column is unsafe, from the catalog: MySQL/MariaDB ``SHOW FULL COLUMNS`` (the
collation in force, also when the column inherits the table's), PostgreSQL
``pg_collation.collisdeterministic``, SQLite the column's ``COLLATE`` clause in
``sqlite_master.sql``. MySQL/MariaDB's ``*_bin`` collations (but the ``nopad`` ones and
MySQL's ``*_0900_*``) also ignore trailing spaces (PAD SPACE): ``pads`` tells so, and an
id ending in a space is refused there instead.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import String, Table, text
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection

__all__ = ["exact_string", "fix_statement", "inexact", "pads"]


def exact_string(length: int) -> Any:
    """A VARCHAR(length) compared exactly on every supported database."""
    binary = mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin")
    return String(length).with_variant(binary, "mysql", "mariadb")


def _mysql_collation(conn: Connection, table: Table, column: str) -> str | None:
    """The collation in force on ``column``: None for a binary or non-text column."""
    name = conn.dialect.identifier_preparer.format_table(table)
    for row in conn.exec_driver_sql(f"SHOW FULL COLUMNS FROM {name}").mappings():
        if str(row["Field"]).lower() == column.lower():  # column names ignore case
            collation = row["Collation"]
            return None if collation is None else str(collation)
    return None


_PG_COLUMN = text(
    "SELECT coll.collname, coll.collisdeterministic, t.typname FROM pg_attribute a "
    "JOIN pg_type t ON t.oid = a.atttypid "
    "LEFT JOIN pg_collation coll ON coll.oid = a.attcollation "
    "WHERE a.attrelid = to_regclass(:table) AND a.attname = :column AND NOT a.attisdropped"
)


def _sqlite_column_collation(sql: str, column: str) -> str | None:
    """The COLLATE name in ``column``'s definition of a CREATE TABLE statement."""
    body = sql[sql.find("(") + 1 : sql.rfind(")")]
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(body):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'`[":
            quote = "]" if ch == "[" else ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    for part in parts:
        head = re.match(r"""\s*(?:"([^"]*)"|`([^`]*)`|\[([^\]]*)\]|'([^']*)'|(\w+))""", part)
        name = None if head is None else next(g for g in head.groups() if g is not None)
        if name is None or name.lower() != column.lower():  # column names ignore case
            continue
        found = re.search(r"""\bCOLLATE\s+["`'\[]?(\w+)""", part, re.IGNORECASE)
        return found.group(1) if found else None
    return None


def inexact(conn: Connection, table: Table, column: str) -> str | None:
    """Why ``column`` of the existing ``table`` does not compare values exactly (in the
    words of an error message), or None if it does (or is not found)."""
    dialect = conn.dialect.name
    if dialect in ("mysql", "mariadb"):
        collation = _mysql_collation(conn, table, column)
        if collation is None or collation.endswith(("_bin", "_cs")) or collation == "binary":
            return None
        return f"its collation {collation} ignores case"
    if dialect == "postgresql":
        name = conn.dialect.identifier_preparer.format_table(table)
        row = conn.execute(_PG_COLUMN, {"table": name, "column": column}).first()
        if row is None:
            return None
        if row[2] == "bpchar":
            return "it is character(n), which ignores trailing spaces"
        if row[1] is False:
            return f"its collation {row[0]} is nondeterministic"
        return None
    if dialect == "sqlite":
        sql = conn.execute(
            text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"),
            {"name": table.name},
        ).scalar()
        collation = None if sql is None else _sqlite_column_collation(str(sql), column)
        if collation is None or collation.upper() == "BINARY":
            return None
        return f"it is declared COLLATE {collation}"
    return None


def pads(conn: Connection, table: Table, column: str) -> bool:
    """MySQL/MariaDB: ``column``'s collation ignores trailing spaces (PAD SPACE)."""
    if conn.dialect.name not in ("mysql", "mariadb"):
        return False
    collation = _mysql_collation(conn, table, column)
    return collation is not None and "nopad" not in collation and "_0900_" not in collation


def fix_statement(conn: Connection, table: Table, column: str) -> str:
    """The statement that makes ``column`` (a String column of ``table``) exact."""
    col = table.c[column]
    length = getattr(col.type, "length", None) or 255
    null = "" if col.nullable and not col.primary_key else " NOT NULL"
    prep = conn.dialect.identifier_preparer
    name, quoted = prep.format_table(table), prep.quote(column)
    dialect = conn.dialect.name
    if dialect in ("mysql", "mariadb"):
        return (
            f"ALTER TABLE {name} MODIFY {quoted} VARCHAR({length}) "
            f"CHARACTER SET utf8mb4 COLLATE utf8mb4_bin{null}"
        )
    if dialect == "postgresql":
        return f'ALTER TABLE {name} ALTER COLUMN {quoted} TYPE varchar({length}) COLLATE "default"'
    return (
        f"a copy of {name} whose {quoted} column has no COLLATE clause (SQLite cannot alter "
        "a column: create the new table, copy the rows, drop the old one, rename the new)"
    )
