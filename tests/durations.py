"""Where the last ``scripts/test`` run spent its time, by file (and the slowest tests).

Run: ``python3 -m tests.durations [REPORT] [--top 25]`` (default report: the JUnit file
``scripts/test`` writes to ``~/.cache/bindery/last-test-run.xml``). Reads only the report.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import xml.etree.ElementTree as ET


def default_report() -> pathlib.Path:
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return cache / "bindery" / "last-test-run.xml"


def _file_of(classname: str) -> str:
    """``tests.rm.test_store.TestX`` -> ``tests/rm/test_store.py`` (a class is not a file)."""
    parts = classname.split(".")
    root = pathlib.Path(__file__).resolve().parent.parent
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (root / candidate).exists():
            return candidate
    return classname


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("report", nargs="?", type=pathlib.Path, default=default_report())
    parser.add_argument("--top", type=int, default=25, help="files and tests to show (default 25)")
    args = parser.parse_args(argv)
    if not args.report.exists():
        print(f"no report at {args.report}: run scripts/test first (it writes one there)")
        return 1
    by_file: collections.defaultdict[str, float] = collections.defaultdict(float)
    counts: collections.Counter[str] = collections.Counter()
    tests: list[tuple[float, str]] = []
    for case in ET.parse(args.report).iter("testcase"):
        seconds = float(case.get("time") or 0)
        file = _file_of(case.get("classname") or "")
        by_file[file] += seconds
        counts[file] += 1
        tests.append((seconds, f"{case.get('classname')}::{case.get('name')}"))
    total = sum(by_file.values())
    print(f"{len(tests)} tests, {total:.0f} s in all (setup + call + teardown)\n")
    print(f"{'seconds':>8} {'share':>6} {'tests':>5}  file")
    for file, seconds in sorted(by_file.items(), key=lambda item: -item[1])[: args.top]:
        print(f"{seconds:8.0f} {seconds / (total or 1):6.1%} {counts[file]:5d}  {file}")
    print(f"\n{'seconds':>8}  slowest tests")
    for seconds, name in sorted(tests, reverse=True)[: args.top]:
        print(f"{seconds:8.1f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
