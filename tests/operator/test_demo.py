"""`bindery demo` works end to end (its own control plane, reference RM and operator)."""

from __future__ import annotations

import asyncio
import re
import sys

import pytest

pytestmark = pytest.mark.controlplane


async def test_the_demo_binds_every_pod_with_two_writes_each() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bindery",
        "demo",
        "--pods",
        "12",
        "--nodes",
        "2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=240)
    text = output.decode()
    assert process.returncode == 0, text
    assert "bound 12/12 pods" in text
    assert re.search(r"writes per bound pod \(counted by the operator\): 2\.00", text), text
    assert re.search(r"writes per bound pod \(apiserver_request_total\): 2\.00", text), text
    rows = re.findall(r"^burst-\d{3}\s+(pool-\d)\s+\d+ ms$", text, flags=re.MULTILINE)
    assert len(rows) == 12
    assert set(rows) <= {"pool-1", "pool-2"}
    assert "OS signals are ignored" not in text  # the demo owns signals; Kopf's warning is noise
