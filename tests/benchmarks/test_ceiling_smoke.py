"""The ceiling benchmark at a tiny size: it runs end to end, every pod binds, the output has its shape.

Speeds are not asserted (tests never time things); what is checked is what the full run's figures
rest on: every contender bound every pod with exactly one Binding and one Scheduled event each, the
sweeps and the steady mode ran, and the JSON, the table and the plot were written.

CI runs it narrowed: the RM-latency sweep at +10 ms only (the 0 ms point is the same code as
Bindery's backlog run, without the delay proxy) and no memory run beside unrelated bound pods (the
side-by-side memory run creates bound pods of another scheduler too). Each of those starts Bindery's
two processes once more. The whole smoke: `BINDERY_CEILING_SMOKE=full .venv/bin/pytest
tests/benchmarks/test_ceiling_smoke.py`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.controlplane

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONTENDERS = ["ceiling", "kube-scheduler qps 5000", "kube-scheduler", "bindery"]


FULL = os.environ.get("BINDERY_CEILING_SMOKE") == "full"
NARROWED = [] if FULL else ["--rm-latency", "10", "--unrelated-pods", "0"]


@pytest.mark.timeout(480)
def test_smoke_run_binds_every_pod_and_reports(tmp_path: pathlib.Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ceiling.py"),
            "--smoke",
            *NARROWED,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert run.returncode == 0, f"ceiling.py --smoke exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
    report = json.loads((tmp_path / "ceiling.json").read_text())
    assert [r["contender"] for r in report["backlog"]] == CONTENDERS
    for result in report["backlog"]:
        name = result["contender"]
        assert result["bound"] == result["pods"] == report["pods"], name
        assert len(result["timeline"]) == result["pods"], f"{name}: one Scheduled event per pod"
        assert result["writes"]["pods/binding POST"] == result["pods"], name
        assert result["writes"]["events POST"] == result["pods"], name
        assert result["rate"] > 0, name
        assert result["cpu_ms_per_pod"], name
        assert all(math.isfinite(v) for v in result["cpu_ms_per_pod"].values()), name
        assert all(v > 0 for v in result["rss_mb"].values()), name
    assert [s["contender"] for s in report["steady"]] == CONTENDERS[1:]
    assert all(s["bound"] == s["pods"] and s["p99_ms"] >= s["p50_ms"] for s in report["steady"])
    assert [row["latency_ms"] for row in report["rm_latency"]] == ([0, 10] if FULL else [10])
    assert all(row["bound"] == row["pods"] for row in report["rm_latency"])
    memory = report["memory"]
    assert memory["pending"]["tried"] == memory["pending"]["pods"]
    assert ("operator_growth_mb" in memory["unrelated"]) if FULL else ("unrelated" not in memory)
    side = report["side_by_side"]
    assert side["pods"] == 40
    assert set(side["growth_mb"]) == {"kube-scheduler", "reference RM", "bindery operator"}
    assert all(math.isfinite(v) for v in side["growth_mb"].values())
    assert "operator growth / kube-scheduler growth" in run.stdout or side["growth_mb"]["kube-scheduler"] == 0
    assert "| pods/s (first → last Scheduled) |" in run.stdout
    if importlib.util.find_spec("matplotlib") is not None:  # the plot is optional (extra "bench")
        assert (tmp_path / "ceiling.png").stat().st_size > 0
