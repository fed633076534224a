"""The table of cluster figures in docs/guarantees.md, from the JSON lines the fault
schedules of tests/cluster/ append to ``KAFKA_TXN_CLUSTER_REPORT`` (``make soak`` sets
it): per capability, the bounces and pauses survived, the client crashes, the
transactions committed, the records lost and duplicated, and the errors seen by kind.

    python -m tests.support.cluster_figures build/cluster-soak.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def table(lines: list[dict[str, Any]]) -> str:
    """The Markdown table, one row per capability (its schedules added up)."""
    rows: dict[str, dict[str, Any]] = {}
    for line in lines:
        row = rows.setdefault(
            line["capability"],
            {"runs": 0, "faults": Counter(), "crashes": 0, "transactions": 0,
             "records": 0, "lost": 0, "duplicated": 0, "errors": Counter()},
        )  # fmt: skip
        row["runs"] += 1
        row["faults"].update(line["faults"])
        for key, field in (("crashes", "client_crashes"), ("transactions", "transactions"),
                           ("records", "records"), ("lost", "lost"),
                           ("duplicated", "duplicated")):  # fmt: skip
            row[key] += line[field]
        row["errors"].update(line["errors"])
    out = [
        "| capability | schedules | bounces (clean / hard) | pauses (1 / 2 brokers) | "
        "client crashes | transactions committed | records | lost | duplicated | "
        "errors seen, by kind |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        f = row["faults"]
        errors = ", ".join(f"{k} {n}" for k, n in sorted(row["errors"].items())) or "none"
        out.append(
            f"| {name} | {row['runs']} | {f['bounces clean']} / {f['bounces hard']} | "
            f"{f['pauses of 1 broker']} / {f['pauses of 2 brokers']} | {row['crashes']} | "
            f"{row['transactions']} | {row['records']} | {row['lost']} | "
            f"{row['duplicated']} | {errors} |"
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[0])
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    print(table(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
