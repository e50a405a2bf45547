"""`bindery run` stopped by SIGTERM (a pod deleted, a rollout, Ctrl-C) leaves Kopf nothing to wait for.

Kopf installs its own SIGINT/SIGTERM handlers when it runs in the main thread, replacing any the
program set before. A `stop_flag` passed next to them is then never set, and Kopf leaves its waiter
task pending: at exit it counts that task as hung and waits 5 s (hard-coded) before cancelling it.
Every stop of the operator, in a rollout as in each test that restarts an operator process, paid it.

This test stops a real operator process with SIGTERM and requires Kopf's own handler to have taken
it and the process to end cleanly. That no stop flag is passed is checked in tests/operator/test_cli.py.
Whether a task is left for Kopf's 5-second wait is not asserted here: under load, any task still
finishing after 5 s is counted as hung too, so that line is a timing, not a property (the time
saved is measured in benchmarks/README.md and in the CI durations report).
"""

from __future__ import annotations

import pathlib
import signal

from tests.realrm import OperatorProcess

# Serving: Kopf watches both kinds (stopping earlier, during its start-up API discovery, leaves its
# in-flight requests for the hung-task wait: that is Kopf's, and not what this test is about).
#: Kopf watches ResourceManagers only: Nodes are the operator's own watch.
WATCHING = ("Starting the watch-stream for resourcemanagers",)


async def test_sigterm_is_taken_by_kopf_and_the_operator_exits_cleanly(
    operator_kubeconfig: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    operator = OperatorProcess(kubeconfig=operator_kubeconfig, directory=tmp_path, args=["--verbose"])
    await operator.start()
    try:
        for line in WATCHING:
            await operator.wait_for_log(line)
        operator.kill(signal.SIGTERM)
        assert await operator.wait(within=60) == 0, operator.log()[-4000:]
    finally:
        await operator.stop()
    log = operator.log()
    assert "Signal SIGTERM is received. Operator is stopping." in log
