"""Where the last ``scripts/test`` run spent its time, by file (and the slowest tests).

Run: ``python3 -m tests.durations [REPORT] [--top 25]`` (default report: the JUnit file
``scripts/test`` writes to ``~/.cache/bindery/last-test-run.xml``). Reads only the report.

``scripts/test`` runs the unit tier on two workers and the plane tiers after it, as two pytest calls
with a report each; ``--merge OUT IN...`` joins them into one (a ``<testsuite>`` per call), so the
sums by file cover the whole run and each call's wall time is printed beside them.
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


def merge(out: pathlib.Path, reports: list[pathlib.Path]) -> None:
    """One ``<testsuites>`` holding every suite of ``reports`` that exists (a call that collected
    nothing may have written none)."""
    merged = ET.Element("testsuites", {"name": "pytest tests"})
    for report in reports:
        if report.exists():
            merged.extend(ET.parse(report).getroot().iter("testsuite"))
    ET.ElementTree(merged).write(out, encoding="utf-8", xml_declaration=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("report", nargs="?", type=pathlib.Path, default=default_report())
    parser.add_argument("--top", type=int, default=25, help="files and tests to show (default 25)")
    parser.add_argument(
        "--merge",
        nargs="+",
        type=pathlib.Path,
        metavar="IN",
        help="write REPORT from these reports, then sum it",
    )
    args = parser.parse_args(argv)
    if args.merge:
        merge(args.report, args.merge)
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
    print(f"{len(tests)} tests, {total:.0f} s in all (setup + call + teardown)")
    for suite in ET.parse(args.report).iter("testsuite"):
        wall = float(suite.get("time") or 0)
        print(f"  pytest call {suite.get('name')}: {wall:.0f} s wall, {suite.get('tests')} tests")
    print()
    print(f"{'seconds':>8} {'share':>6} {'tests':>5}  file")
    for file, seconds in sorted(by_file.items(), key=lambda item: -item[1])[: args.top]:
        print(f"{seconds:8.0f} {seconds / (total or 1):6.1%} {counts[file]:5d}  {file}")
    print(f"\n{'seconds':>8}  slowest tests")
    for seconds, name in sorted(tests, reverse=True)[: args.top]:
        print(f"{seconds:8.1f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
