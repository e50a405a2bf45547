"""benchmarks/placement_bench.py at a tiny size: it runs and prints a figure per policy (not timed)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_placement_bench_runs_and_prints_a_figure_per_policy() -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "placement_bench.py"),
            "--nodes",
            "20",
            "--pods",
            "300",
            "--constraints",
            "--profile",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, f"placement_bench.py exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
    lines = run.stdout.splitlines()
    for policy in ("binpack", "spread"):
        assert any(line.startswith(policy) and "ms CPU per choose_node" in line for line in lines), run.stdout
    assert "choose_node" in run.stdout.split("ms CPU per choose_node")[-1], "cProfile's table is missing"
