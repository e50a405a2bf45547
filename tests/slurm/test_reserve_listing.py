"""How often a reserve lists Slurm's queue (the adapter's placeholders are read from it).

Why a stand-in for slurmrestd here: the question is how many ``GET /jobs`` one reserve sends while
it holds the adapter's lock, which the bed's real Slurm answers the same way whatever the count;
the stand-in counts them and refuses the job, so the reserve ends right after its choice of node.
(Every reserve listed the whole queue twice, under the adapter's one lock.)
"""

from __future__ import annotations

from typing import Any

from bindery.rm.models import PodIdentity, ReservationRequest
from bindery.slurm_rm.mapping import parse_node_map
from bindery.slurm_rm.server import SlurmRM
from bindery.slurm_rm.slurmrest import SlurmError, SlurmRest


class CountingSlurm(SlurmRest):
    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:1")
        self.listings = 0

    async def jobs(self) -> list[dict[str, Any]]:
        self.listings += 1
        return []

    async def nodes(self) -> list[dict[str, Any]]:
        return [
            {
                "name": "s0",
                "cpus": 4,
                "alloc_cpus": 0,
                "real_memory": 8192,
                "alloc_memory": 0,
                "state": "IDLE",
            }
        ]

    async def submit(self, job: dict[str, Any], script: str) -> int:
        raise SlurmError("QOSMaxSubmitJobPerUserLimit")


async def test_a_reserve_lists_slurms_queue_once() -> None:
    slurm = CountingSlurm()
    rm = SlurmRM(slurm, parse_node_map("k0=s0"), token="t", slurm_user="bindery")
    try:
        answer = await rm.reserve(
            ReservationRequest(
                pod=PodIdentity(uid="u1", namespace="ns", name="p1", scheduler_name="bindery"),
                resources={"cpu": "1"},
                idempotency_key="k1",
                ttl_seconds=30,
            )
        )
    finally:
        await slurm.aclose()
    assert answer.status == 409  # Slurm's refusal, after the choice of node
    assert slurm.listings == 1
