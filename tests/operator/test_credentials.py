"""The RM credentials a ResourceManager references: never logged, used only from opted-in Secrets.

Issue 20, scenarios 5, 8 and 10: `bindery run --verbose` must not write a token (or a TLS key) it
read from a Secret to its log; a ResourceManager author must not be able to make the operator read,
send away or describe a Secret that was not meant for it; rotating the token fails no pod, and a
token the RM refuses shows in the ResourceManager's status.
"""

from __future__ import annotations

import base64
import pathlib

from tests.operator.conftest import RealStage, eventually
from tests.realrm import operator_process


async def test_verbose_logging_never_writes_the_token_read_from_a_secret(
    *,
    real_stage: RealStage,
    operator_kubeconfig: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    token = real_stage.rm.token
    async with (
        operator_process(kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--verbose"]) as op,
        real_stage.served(),
    ):
        await real_stage.create("p")
        # Bound: the operator has read the token Secret and used its value at the RM.
        assert await eventually(lambda: real_stage.node_of("p"), within=60, what="the pod bound")
        log = op.log()
    assert " DEBUG " in log, "the operator did not log at DEBUG: the test proves nothing"
    encoded = base64.b64encode(token.encode()).decode()
    leaks = [line for line in log.splitlines() if token in line or encoded in line]
    assert not leaks, "the RM token is in the operator's log:\n" + "\n".join(leaks[:3])
