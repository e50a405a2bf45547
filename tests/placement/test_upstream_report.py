"""scripts/e2e-upstream's reading of ginkgo's JUnit report and its table (no plane, no e2e.test)."""

from __future__ import annotations

import pathlib

from tests.placement.upstream import CHECKER, results, table

# Trimmed from a real report of e2e.test v1.36.3 (the Bindery run of scripts/e2e-upstream).
REPORT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="3" disabled="0" errors="0" failures="1" time="12">
 <testsuite name="Kubernetes e2e suite" package="/" tests="3">
  <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed"
   time="0.02"></testcase>
  <testcase name="[It] [sig-api-machinery] API Streaming reflector [sig-api-machinery]"
   classname="Kubernetes e2e suite" status="skipped" time="0">
   <skipped message="skipped"></skipped></testcase>
  <testcase name="[It] [sig-scheduling] SchedulerPredicates [Serial] PodTopologySpread Filtering
 validates 4 pods with MaxSkew=1 are evenly distributed into 2 nodes [sig-scheduling, Serial]"
   classname="Kubernetes e2e suite" status="failed" time="6.78">
   <failure message="Pods are not distributed as expected on node" type="failed">[FAILED]</failure>
  </testcase>
  <testcase name="[It] [sig-scheduling] SchedulerPredicates [Serial] validates that NodeSelector is
 respected if matching [Conformance] [sig-scheduling, Serial, Conformance]"
   classname="Kubernetes e2e suite" status="passed" time="4.5"></testcase>
 </testsuite>
</testsuites>
"""


def test_results_keep_the_tests_and_drop_the_suite_nodes(tmp_path: pathlib.Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(REPORT)
    found = results(report)
    statuses = sorted(found.values())
    assert statuses == ["FAILED", "passed", "skipped"]
    failed = next(name for name, status in found.items() if status == "FAILED")
    assert failed == (
        "[sig-scheduling] SchedulerPredicates [Serial] PodTopologySpread Filtering validates 4 pods with "
        "MaxSkew=1 are evenly distributed into 2 nodes"
    )
    assert (
        "[sig-scheduling] SchedulerPredicates [Serial] validates that NodeSelector is respected if matching "
        "[Conformance]"
    ) in found
    assert results(tmp_path / "missing.xml") == {}


def test_the_table_lists_tests_run_by_either_scheduler_and_ends_with_the_checker() -> None:
    rows = table(
        {
            "kube-scheduler": {"spread": "passed", "not run": "skipped", CHECKER: "passed"},
            "bindery": {"spread": "FAILED", "not run": "skipped", CHECKER: "18 violations"},
        }
    ).splitlines()
    assert rows == [
        "test | kube-scheduler | Bindery",
        "--- | --- | ---",
        "spread | passed | FAILED",
        f"{CHECKER} | passed | 18 violations",
    ]
