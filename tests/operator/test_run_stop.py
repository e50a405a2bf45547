"""`bindery run` stopped by SIGTERM (a pod deleted, a rollout, Ctrl-C) leaves Kopf nothing to wait for.

Kopf installs its own SIGINT/SIGTERM handlers when it runs in the main thread, replacing any the
program set before. A `stop_flag` passed next to them is then never set, and Kopf leaves its waiter
task pending: at exit it counts that task as hung and waits 5 s (hard-coded) before cancelling it.
Every stop of the operator, in a rollout as in each test that restarts an operator process, paid it.
Kopf logs, at debug level, whether any task was left for that wait; this test reads that line.
"""

from __future__ import annotations

import pathlib
import signal

from tests.realrm import OperatorProcess

# Serving: Kopf watches both kinds (stopping earlier, during its start-up API discovery, leaves its
# in-flight requests for the hung-task wait: that is Kopf's, and not what this test is about).
WATCHING = ("Starting the watch-stream for nodes.v1", "Starting the watch-stream for resourcemanagers")
NOTHING_HUNG = "Hung tasks stopping is skipped: no tasks given"


async def test_sigterm_stops_the_operator_with_no_task_left_for_kopfs_hung_task_wait(
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
    hung = [line for line in log.splitlines() if "Hung tasks" in line]
    assert any(NOTHING_HUNG in line for line in hung), (
        f"Kopf found tasks still running once the operator stopped, and waited for them: {hung}"
    )
