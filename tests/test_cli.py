"""The kafka-txn console script against the broker and a database, bad arguments too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kafka_txn import TransactionalProducer
from kafka_txn.cli import main
from tests.test_dualwrite import Scenario

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.broker


def _open_transaction(broker, topic: str, txn_id: str) -> TransactionalProducer:
    p = TransactionalProducer({"bootstrap.servers": broker.bootstrap_servers,
                               "transactional.id": txn_id})  # fmt: skip
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic, b"open", partition=0)
    p.flush()
    return p


def test_describe_shows_an_open_transaction(broker, capsys, txn_id):
    topic = broker.create_topic(partitions=2)
    p = _open_transaction(broker, topic, txn_id)
    assert main(["describe", "--bootstrap-servers", broker.bootstrap_servers,
                 "--transactional-id", txn_id]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "state            : Ongoing" in out
    assert f"{topic}[0]" in out and "s ago)" in out
    assert main(["describe", "--bootstrap-servers", broker.bootstrap_servers,
                 "--transactional-id", txn_id, "--json"]) == 0  # fmt: skip
    info = json.loads(capsys.readouterr().out)
    assert info["state"] == "Ongoing" and info["partitions"] == {topic: [0]}
    assert info["age_s"] >= 0
    p.abort_transaction()
    p.close()


def test_force_terminate_aborts_what_is_open(broker, capsys, txn_id):
    topic = broker.create_topic()
    p = _open_transaction(broker, topic, txn_id)
    assert main(["force-terminate", "--bootstrap-servers", broker.bootstrap_servers,
                 "--transactional-id", txn_id]) == 0  # fmt: skip
    assert "was Ongoing" in capsys.readouterr().out
    main(["describe", "--bootstrap-servers", broker.bootstrap_servers,
          "--transactional-id", txn_id, "--json"])  # fmt: skip
    assert json.loads(capsys.readouterr().out)["state"] != "Ongoing"
    assert broker.read_committed(topic, expected=0) == []
    p.close()


def test_recover_settles_a_crashed_dual_write(broker, capsys, tmp_path):
    s = Scenario(broker, f"jdbc:sqlite:{tmp_path}/cli.db")
    assert s.run("--batch", "0", "--crash-at", "after_db_commit").returncode == -9
    assert main(["recover", "--bootstrap-servers", broker.bootstrap_servers,
                 "--jdbc-url", s.jdbc_url, "--transactional-id", s.txn_id]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == f"{s.txn_id}: committed"
    s.assert_equal_sides(4)


def test_demo_runs_and_verifies(broker):
    exe = shutil.which("kafka-txn") or str(Path(sys.executable).parent / "kafka-txn")
    done = subprocess.run(
        [exe, "demo", "--bootstrap-servers", broker.bootstrap_servers, "--batches", "6"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "VERIFIED" in done.stdout
    assert "[  6/6]" in done.stdout  # progress shown


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["describe", "--bootstrap-servers", "127.0.0.1:1"], 2, "--transactional-id"),
        (["nonsense"], 2, "invalid choice"),
        (["describe", "--bootstrap-servers", "127.0.0.1:1", "--transactional-id", "x",
          "--timeout", "1"], 1, "kafka-txn: error: "),
        (["recover", "--bootstrap-servers", "127.0.0.1:1", "--transactional-id", "x",
          "--jdbc-url", "jdbc:oracle:thin:@h:1:x"], 1, "unsupported subprotocol 'oracle'"),
        (["describe", "--bootstrap-servers", "127.0.0.1:1", "--transactional-id", "x",
          "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=GSSAPI"], 1,
         "sasl.mechanism='GSSAPI'"),
    ],
)  # fmt: skip
def test_bad_arguments_give_one_clear_line(argv, code, needle, capsys):
    try:
        got = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        got = int(exc.code or 0)
    assert got == code
    err = capsys.readouterr().err
    assert needle in err
    if code == 1:
        assert len(err.strip().splitlines()) == 1


def test_bad_x_option(capsys):
    with pytest.raises(SystemExit, match="is not key=value"):
        main(["describe", "--bootstrap-servers", "h:1", "--transactional-id", "x",
              "-X", "novalue"])  # fmt: skip
    _ = uuid
