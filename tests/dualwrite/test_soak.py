"""The dual-write promise under an adversary: several writer processes
share ONE transactional id (tests/apps/adversary_app.py, each a loop of DualWriter
transactions; every other launch runs AsyncDualWriter instead, on the same state row, so
that sync and async writers recover, fence and follow each other) while, on real timers,
the test

- SIGKILLs a random writer and restarts it (every restart is a zombie handover: its
  start() recovers and fences the others, which restart in turn and fence it back),
- SIGSTOPs a writer for a while (a GC pause: it wakes up a zombie),
- terminates the writers' database sessions (PostgreSQL: pg_terminate_backend; MariaDB:
  KILL CONNECTION; SQLite has no server, so it gets only the rest),
- answers coordinator requests with error codes (FaultProxy in front of the broker, for
  the writers launched through it): moved or loading coordinators, concurrent
  transactions, timeouts and unknown server errors, none of which says anything false
  about who owns the transactional id.

Then the faults stop until the writers have committed ten transactions between them (on
a loaded machine they may spend the whole fault period starting), every writer is
killed, one last writer's start() recovers what they left, and:
the database rows equal the records a read_committed consumer sees, each exactly once,
read with an independent client (kafka-python, not librdkafka); every transaction a
writer was told committed is there; no writer ever got a report that Kafka lost a
committed transaction. Counters prove the adversary did act (kills, fences, terminated
sessions, injected errors) and the writers did work, async and sync writers alike (each
kind committed, and was killed).

The schedule of faults is drawn from ``random.Random(seed)``: KAFKA_TXN_ADVERSARY_SEED
(printed, and named in every failure) replays it; timing is real, so a replay draws the
same faults at the same moments, not the same interleavings. KAFKA_TXN_SOAK_SECONDS sets
how long the adversary acts per database (``make soak``: 600).
"""

from __future__ import annotations

import contextlib
import heapq
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from confluent_kafka import KafkaError
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from kafka_txn import (
    InvalidPreparedStateError,
    PreparedTxnState,
    TransactionDivergedError,
    TransactionOutcomeUnknowableError,
    TransactionOutcomeUnknownError,
)
from kafka_txn.dualwrite.jdbc.urls import jdbc_to_sqlalchemy
from kafka_txn.dualwrite.writer import DualWriter
from kafka_txn.testing import ApiKey, FaultProxy
from tests.apps.adversary_app import data_table
from tests.support.rig import Broker

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.adversary]

SEED = int(os.environ.get("KAFKA_TXN_ADVERSARY_SEED", "90009"))
SECONDS = float(os.environ.get("KAFKA_TXN_SOAK_SECONDS", "25"))
WRITERS = 3
RECORDS = 3
PROXIED = 2 / 3
"""The share of writer launches whose coordinator client goes through the fault proxy."""
MIN_TRANSACTIONS = 10
"""Fewer committed transactions than this means the writers hardly ran: the run proves
nothing, and fails."""
CALM_SECONDS = 90.0
"""After the faults, how long the writers may take, unharmed, to commit MIN_TRANSACTIONS
between them: on a loaded machine, writers killed about once a second may spend the
whole fault period starting (recovery, the fence), and the run would prove nothing."""

# Coordinator errors that say nothing false about the transactional id's owner: the
# coordinator moved or is loading, another EndTxn is under way, a timeout, or an unknown
# failure of the request. Never PRODUCER_FENCED & co.: those would be lies about who owns
# the id. They reach what kafka-txn's coordinator client sends through the proxy:
# FindCoordinator when it connects, DescribeTransactions at every prepare and recovery,
# EndTxn when recovery commits a prepared transaction (an error waits in the proxy's
# queue until such a request comes). librdkafka's own requests go to the broker directly
# (it learns the broker's address from Metadata, which the proxy does not rewrite).
FAULTS: tuple[tuple[ApiKey, int], ...] = (
    (ApiKey.FIND_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE),
    (ApiKey.DESCRIBE_TRANSACTIONS, KafkaError.NOT_COORDINATOR),
    (ApiKey.DESCRIBE_TRANSACTIONS, KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
    (ApiKey.DESCRIBE_TRANSACTIONS, KafkaError.REQUEST_TIMED_OUT),
    (ApiKey.DESCRIBE_TRANSACTIONS, KafkaError.UNKNOWN),
    (ApiKey.END_TXN, KafkaError.NOT_COORDINATOR),
    (ApiKey.END_TXN, KafkaError.CONCURRENT_TRANSACTIONS),
    (ApiKey.END_TXN, KafkaError.REQUEST_TIMED_OUT),
    (ApiKey.END_TXN, KafkaError.UNKNOWN),
)


# ---------------------------------------------------------------- the databases
@dataclass
class Database:
    """A database for one run: the writers' JDBC URL, and how to kill their sessions."""

    name: str
    jdbc_url: str
    admin: Engine
    sessions: Callable[[Any], list[int]] | None
    """The writers' server-side session ids (None: no server, as SQLite)."""
    kill: Callable[[Any, int], bool] | None

    def terminate(self, pick: float, everyone: bool) -> int:
        """Kill one of the writers' sessions (the ``pick`` fraction along their sorted
        ids), or all of them; how many were killed."""
        if self.sessions is None or self.kill is None:
            return 0
        with self.admin.connect() as conn:
            ids = sorted(self.sessions(conn))
            if not ids:
                return 0
            chosen = ids if everyone else [ids[int(pick * len(ids))]]
            killed = 0
            for session in chosen:
                with contextlib.suppress(DBAPIError):  # it may have ended meanwhile
                    killed += bool(self.kill(conn, session))
            conn.commit()
            return killed

    def rows(self, table: str) -> list[str]:
        engine = create_engine(jdbc_to_sqlalchemy(self.jdbc_url))
        try:
            with engine.connect() as conn:
                return list(conn.execute(select(data_table(table).c.id)).scalars())
        finally:
            engine.dispose()


def _with_database(jdbc: str, name: str) -> str:
    """``jdbc`` (jdbc:mariadb://host:port/db?params) with another database."""
    parts = urlsplit(jdbc.removeprefix("jdbc:"))
    return "jdbc:" + urlunsplit(parts._replace(path=f"/{name}"))


def _postgres(base: str, run: str) -> Iterator[Database]:
    app = f"kafka-txn-adversary-{run}"
    admin = create_engine(jdbc_to_sqlalchemy(base))
    try:
        yield Database(
            "postgresql",
            f"{base}{'&' if '?' in base else '?'}ApplicationName={app}",  # pgJDBC's name
            admin,
            lambda conn: list(
                conn.execute(
                    text("SELECT pid FROM pg_stat_activity WHERE application_name = :a"),
                    {"a": app},
                ).scalars()
            ),
            lambda conn, pid: bool(
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
            ),
        )
    finally:
        admin.dispose()


def _mariadb(base: str, run: str) -> Iterator[Database]:
    # A database of its own: its sessions are the writers' (information_schema.processlist
    # has no application name), and other tests' sessions are never touched.
    schema = f"kafka_txn_adversary_{run}"
    admin = create_engine(jdbc_to_sqlalchemy(base))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE DATABASE {schema}"))
    try:
        yield Database(
            "mariadb",
            _with_database(base, schema),
            admin,
            lambda conn: list(
                conn.execute(
                    text(
                        "SELECT id FROM information_schema.processlist "
                        "WHERE db = :d AND id <> CONNECTION_ID()"
                    ),
                    {"d": schema},
                ).scalars()
            ),
            lambda conn, session: conn.execute(text(f"KILL CONNECTION {int(session)}")) is not None,
        )
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {schema}"))
        admin.dispose()


@pytest.fixture(params=["postgresql", "mariadb", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    run = uuid.uuid4().hex[:10]
    if request.param == "postgresql":
        yield from _postgres(request.getfixturevalue("postgres_jdbc"), run)
    elif request.param == "mariadb":
        yield from _mariadb(request.getfixturevalue("mariadb_jdbc"), run)
    else:
        url = f"jdbc:sqlite:{tmp_path / 'adversary.sqlite'}"
        admin = create_engine(jdbc_to_sqlalchemy(url))
        try:
            yield Database("sqlite", url, admin, None, None)
        finally:
            admin.dispose()


@pytest.fixture
def proxy(broker: Broker) -> Iterator[FaultProxy]:
    with FaultProxy(broker.bootstrap_servers) as fault_proxy:
        yield fault_proxy


# ---------------------------------------------------------------- the writers
@dataclass
class Writer:
    """One writer slot: the process now running in it, and where its launches log."""

    slot: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    launches: int = 0
    via_proxy: bool = False
    is_async: bool = False
    """The launch now in the slot runs AsyncDualWriter (adversary_app.py --async)."""
    stopped: bool = False
    exited: list[tuple[str, int]] = field(default_factory=list)
    """(tag, exit code) of launches that ended by themselves: never expected."""

    @property
    def tag(self) -> str:
        kind = "a" if self.is_async else ""
        return f"w{self.slot}.{self.launches}{kind}{'p' if self.via_proxy else ''}"

    def log(self, tag: str) -> Path:
        return self.folder / f"{tag}.log"

    def report(self, tag: str) -> str:
        """What a launch said when it gave up: its fatal log line and its traceback."""
        log, err = self.log(tag), self.folder / f"{tag}.err"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        tail = err.read_text(errors="replace").splitlines()[-25:] if err.exists() else []
        return "\n".join([*(x for x in lines if x.startswith("fatal")), *tail])

    def signal(self, sig: signal.Signals) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
            return True
        return False


class Adversary:
    """Runs the writers and the faults for ``seconds``; see the module docstring."""

    def __init__(
        self, broker: Broker, proxy: FaultProxy, db: Database, folder: Path, seed: int
    ) -> None:
        self.broker, self.proxy, self.db = broker, proxy, db
        self.rng = random.Random(seed)
        self.topic = broker.create_topic(partitions=3)
        suffix = uuid.uuid4().hex[:10]
        self.txn_id = f"adversary-{suffix}"
        self.table = f"adversary_{suffix}"
        self.writers = [Writer(slot, folder) for slot in range(WRITERS)]
        self.tally: Counter[str] = Counter()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = 0
        engine = create_engine(jdbc_to_sqlalchemy(db.jdbc_url))
        try:
            data_table(self.table).create(engine)
        finally:
            engine.dispose()

    # ---- processes
    def launch(self, w: Writer, via_proxy: bool, seed: int) -> None:
        """Start a new process in ``w``'s slot, its coordinator requests through the
        fault proxy or not; every other launch (of all slots, in order) is an async
        writer, so that a slot's successive writers are of both kinds too."""
        w.launches += 1
        w.via_proxy = via_proxy
        w.is_async = self.tally["launches"] % 2 == 1
        servers = self.proxy.bootstrap_servers if via_proxy else self.broker.bootstrap_servers
        tag = w.tag
        with (w.folder / f"{tag}.err").open("wb") as err:
            w.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "apps" / "adversary_app.py"),
                 "--jdbc-url", self.db.jdbc_url, "--bootstrap-servers", servers,
                 "--topic", self.topic, "--transactional-id", self.txn_id,
                 "--table", self.table, "--tag", tag, "--log", str(w.log(tag)),
                 "--seed", str(seed), "--records", str(RECORDS),
                 *(["--async"] if w.is_async else [])],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        w.stopped = False
        self.tally["launches"] += 1
        self.tally["launches_via_proxy"] += via_proxy
        self.tally["launches_async"] += w.is_async

    def reap(self, w: Writer) -> None:
        """Note a launch that ended without being killed by us."""
        if w.proc is not None and w.proc.poll() is not None:
            w.exited.append((w.tag, w.proc.returncode))
            w.proc = None

    def kill_all(self) -> None:
        for w in self.writers:
            if w.proc is not None:
                w.signal(signal.SIGKILL)
                w.proc.wait(timeout=30)
                w.proc = None

    # ---- the schedule
    def at(self, delay: float, action: Callable[[], None]) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (time.monotonic() + delay, self._timer_seq, action))

    def act(self) -> None:
        """One adversarial action, drawn from the seeded generator. Every action draws
        the same numbers whatever the processes' state, so that a seed replays the same
        schedule."""
        action = self.rng.choices(
            ["kill", "pause", "sessions", "coordinator"],
            weights=[3, 2, 2 if self.db.sessions else 0, 2],
        )[0]
        w = self.writers[self.rng.randrange(WRITERS)]
        pick, everyone, delay = self.rng.random(), self.rng.random() < 0.25, self.rng.random()
        relaunch = (self.rng.random() < PROXIED, self.rng.randrange(2**32))
        faults = [FAULTS[self.rng.randrange(len(FAULTS))] for _ in range(1 + int(3 * pick))]
        if action == "kill":
            if w.proc is not None and w.signal(signal.SIGKILL):
                w.proc.wait(timeout=30)
                w.proc = None
                self.tally["kills"] += 1
                self.tally["kills_async"] += w.is_async
                self.at(0.5 * delay, lambda: self.launch(w, *relaunch))
        elif action == "pause":
            if not w.stopped and w.signal(signal.SIGSTOP):
                w.stopped = True
                self.tally["pauses"] += 1
                self.tally["pauses_async"] += w.is_async

                def wake(proc: subprocess.Popen[bytes] | None = w.proc) -> None:
                    if w.proc is proc and w.stopped:
                        w.signal(signal.SIGCONT)
                        w.stopped = False

                self.at(0.1 + 1.5 * delay, wake)
        elif action == "sessions":
            self.tally["sessions_terminated"] += self.db.terminate(pick, everyone)
        else:
            for api, code in faults:
                self.proxy.push_errors(api, code)
            self.tally["faults_pushed"] += len(faults)

    def run(self, seconds: float) -> None:
        for w in self.writers:
            self.launch(w, self.rng.random() < PROXIED, self.rng.randrange(2**32))
        deadline = time.monotonic() + seconds
        next_action = time.monotonic() + 1.0  # let them get going
        while time.monotonic() < deadline:
            now = self._tick()
            if any(w.exited for w in self.writers):
                return  # a broken promise (DIVERGED) or a bug: stop and report it
            if now >= next_action:
                self.act()
                next_action = now + 0.1 + 0.7 * self.rng.random()
            time.sleep(0.02)
        self._calm(MIN_TRANSACTIONS, CALM_SECONDS)

    def _calm(self, transactions: int, seconds: float) -> None:
        """No more faults (paused writers still wake, killed ones are still launched
        again, as scheduled) until the writers have committed ``transactions`` in all,
        async and sync writers at least one each, or ``seconds`` pass: after the storm,
        they must get on with their work."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._tick()
            if any(w.exited for w in self.writers):
                return
            if self.committed() >= transactions and all(self.committed_by().values()):
                return
            time.sleep(0.2)

    def _tick(self) -> float:
        """Run the timers that are due (wake-ups, relaunches) and reap exited writers;
        returns the time it ran at."""
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            heapq.heappop(self._timers)[2]()
        for w in self.writers:
            self.reap(w)
        return now

    def committed(self) -> int:
        """Transactions the writers have reported committed so far."""
        return len(
            {
                i.rsplit("-", 1)[0]
                for _, words in self.events()
                if words[0] == "committed"
                for i in words[2:]
            }
        )

    def committed_by(self) -> dict[str, int]:
        """Transactions committed so far by async and by sync writers."""
        seen = {
            i.rsplit("-", 1)[0]
            for _, words in self.events()
            if words[0] == "committed"
            for i in words[2:]
        }
        kinds = [_is_async_tag(t.split("-")[0]) for t in seen]
        return {"async": kinds.count(True), "sync": kinds.count(False)}

    # ---- what the writers said
    def events(self) -> list[tuple[str, list[str]]]:
        """(tag, words) of every line every launch logged."""
        out = []
        for path in sorted(self.writers[0].folder.glob("w*.log")):
            for line in path.read_text(errors="replace").splitlines():
                out.append((path.stem, line.split(" ")))
        return out


def _is_async_tag(tag: str) -> bool:
    """Whether a launch's tag (``w<slot>.<launch>[a][p]``) names an async writer."""
    return "a" in tag.split(".", 1)[1]


def _recover_last(conf: dict[str, Any], jdbc_url: str) -> str:
    """One last writer: start() settles what the killed writers left, then closes."""
    for attempt in range(3):
        writer = DualWriter(conf, jdbc_url)
        try:
            return writer.start().value
        except TransactionOutcomeUnknownError:
            if attempt == 2:
                raise
        finally:
            writer.close()
    raise AssertionError("unreachable")


@pytest.fixture
def adversary(
    broker: Broker, proxy: FaultProxy, database: Database, tmp_path: Path
) -> Iterator[Adversary]:
    """The adversary and its writers; every writer process is killed at the end."""
    adversary = Adversary(broker, proxy, database, tmp_path, SEED)
    try:
        yield adversary
    finally:
        adversary.kill_all()


# docs/guarantees.md, "not guaranteed": a start() frozen between its ownership check and
# its InitProducerId while its database session is terminated fences, once resumed, the
# transaction the next owner prepared and committed in the database. The next start()
# reports it: TransactionDivergedError with the epoch bumped once and the start time
# kept. Transactions here live far less than transaction.timeout.ms (60 s), so no
# timeout makes that signature; only that fence does, and only it is excused.
# The same gap opens without a freeze when the InitProducerId is slow (retried for a
# second or more on CONCURRENT_TRANSACTIONS while the coordinator still ends the previous
# owner's transaction) and the session is terminated meanwhile. Once that init has
# completed (Empty, the epoch moved on, the start time gone), the next start() reports
# the stored transaction TransactionOutcomeUnknowableError instead (and a transaction the
# init found committed but not yet marked completed is unknowable too). Those reports are
# excused only with evidence of the gap in the run: the stored transaction's own writer
# was told its Kafka commit was fenced after its database commit (a
# TransactionInDoubtError "fenced by a newer instance" carrying that very state), or a
# writer's start() initialised transactions and then found its lock gone (``late_init``)
# while the stored transaction began (the coordinator's start time of the transaction
# between the start() call and that failure: the same machine's clock).
_FROZEN_START = (
    "not guaranteed (docs/guarantees.md): a start() frozen between its ownership check "
    "and its InitProducerId while its session was terminated fenced a transaction the "
    "next owner had committed in the database; the next start() reported the divergence"
)
_FROZEN_START_SIGNATURE = (
    "fatal TransactionDivergedError Kafka aborted the transaction of",
    "the coordinator bumped the epoch and aborted it",
)


def _fenced_after_its_database_commit(
    events: list[tuple[str, list[str]]], stored_state: str
) -> bool:
    """Whether a writer reported the transaction ``stored_state`` in doubt because its
    Kafka commit was fenced after its database commit (adversary_app.py logs the state
    an error carries as its last word)."""
    if not stored_state:
        return False
    wanted = f"prepared_state={stored_state}"
    return any(
        words[:2] == ["error", "TransactionInDoubtError"]
        and words[-1] == wanted
        and "fenced by a newer instance" in " ".join(words)
        for _, words in events
    )


def _gap_explains(stored_state: str, events: list[tuple[str, list[str]]]) -> bool:
    """Whether the run shows the gap of _FROZEN_START that can make the recovery report
    on ``stored_state``: see the comment above."""
    if _fenced_after_its_database_commit(events, stored_state):
        return True
    try:
        began = PreparedTxnState.parse(stored_state).txn_start_ms
    except InvalidPreparedStateError:
        return False
    return began is not None and any(
        words[0] == "late_init" and int(words[1]) <= began <= int(words[2]) for _, words in events
    )


def _late_init(report: str, events: list[tuple[str, list[str]]]) -> bool:
    """A writer's exit report is the gap of _FROZEN_START: the divergence signature, or
    a recovery report the gap explains."""
    if all(part in report for part in _FROZEN_START_SIGNATURE):
        return True
    reports = ("TransactionOutcomeUnknowableError", "TransactionDivergedError")
    for line in report.splitlines():
        words = line.split(" ")
        if words[0] == "fatal" and words[1] in reports and words[-1].startswith("stored_state="):
            return _gap_explains(words[-1].removeprefix("stored_state="), events)
    return False


@pytest.mark.timeout(300 + 3 * SECONDS)  # the adversary's run, then the checks and cleanup
@pytest.mark.guarantee("4.4", "4.11", "4.14", "9.4")
def test_dual_writers_under_an_adversary_never_diverge(
    broker: Broker, proxy: FaultProxy, database: Database, adversary: Adversary
) -> None:
    """The soak of the module docstring on one database: the rows equal the records, each
    once, nothing acknowledged is lost, and the adversary did act."""
    print(f"adversary seed={SEED} seconds={SECONDS:g} database={database.name}")
    where = f"(KAFKA_TXN_ADVERSARY_SEED={SEED} replays the schedule; database={database.name})"
    try:
        adversary.run(SECONDS)
    finally:
        adversary.kill_all()  # the writers stop before recovery and the checks
    for w in adversary.writers:
        for tag, code in w.exited:
            report = w.report(tag)
            if _late_init(report, adversary.events()):
                pytest.xfail(f"{_FROZEN_START} {where}:\n{report}")
            pytest.fail(f"writer {tag} exited with {code} {where}:\n{report}")

    conf = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": adversary.txn_id}
    try:
        final_outcome = _recover_last(conf, database.jdbc_url)
    except (TransactionDivergedError, TransactionOutcomeUnknowableError) as exc:
        if _gap_explains(exc.stored_state, adversary.events()):
            pytest.xfail(f"{_FROZEN_START} {where}: the last writer's recovery: {exc}")
        pytest.fail(f"the last writer's recovery found Kafka lost a transaction {where}: {exc}")

    events = adversary.events()
    errors = Counter(words[1] for _, words in events if words[0] == "error")
    errors["late_init"] = sum(words[0] == "late_init" for _, words in events)
    acknowledged = {i for _, words in events if words[0] == "committed" for i in words[2:]}
    rows = database.rows(adversary.table)
    values = [v for _, v in broker.read_committed(adversary.topic, expected=len(rows))]
    kafka = [v.decode() for v in values if v is not None]
    assert len(kafka) == len(values), f"records without a value in Kafka {where}"
    transactions = {r.rsplit("-", 1)[0] for r in rows}
    tally = adversary.tally
    print(
        f"transactions={len(transactions)} rows={len(rows)} kafka={len(kafka)} "
        f"final start()={final_outcome} {dict(tally)} injected={len(proxy.injected)} "
        f"errors={dict(errors)}"
    )

    # Each exactly once, and the same on both sides.
    assert len(kafka) == len(set(kafka)), f"records twice in Kafka {where}: " + str(
        sorted(v for v, n in Counter(kafka).items() if n > 1)
    )
    assert len(rows) == len(set(rows)), f"rows twice in the database {where}"
    lost = sorted(set(rows) - set(kafka))
    extra = sorted(set(kafka) - set(rows))
    assert not lost and not extra, (
        f"the database and Kafka diverged {where}: {len(lost)} rows never reached Kafka "
        f"(transactions {sorted({r.rsplit('-', 1)[0] for r in lost})}), {len(extra)} "
        f"records have no row ({sorted({r.rsplit('-', 1)[0] for r in extra})})"
    )
    # Nothing a writer was told committed is missing.
    assert acknowledged <= set(rows), f"acknowledged but lost {where}: {acknowledged - set(rows)}"
    # The run proves something: work was done, and the adversary did act.
    assert len(transactions) >= MIN_TRANSACTIONS, f"too little work {where}: {tally}"
    assert tally["kills"] >= 1 and tally["pauses"] >= 1, f"no kills or pauses {where}"
    by_kind = adversary.committed_by()
    print(f"committed by kind: {by_kind}")
    assert by_kind["async"] >= 1 and by_kind["sync"] >= 1, f"a kind never committed {where}"
    assert 1 <= tally["kills_async"] < tally["kills"], f"a kind never killed {where}: {tally}"
    assert errors["ProducerFencedError"] >= 1, f"no writer was ever fenced {where}: {errors}"
    assert proxy.injected, f"no coordinator error was injected {where}"
    if database.sessions is not None:
        assert tally["sessions_terminated"] >= 1, f"no session was terminated {where}"
