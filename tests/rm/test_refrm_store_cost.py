"""What one reserve costs the store must not grow with the number of reservations it holds.

Counted in SQLite virtual-machine steps (``set_progress_handler``), not in seconds: exact on a
shared machine.  A placement in mirror mode resolves which of its reservations the pods bound to
the changed nodes name (``ReservationStore._foreign``); looked up through the ``state`` index,
that was a scan of every active reservation at every reserve (5,000 committed reservations: 3.4 ms
per reserve, 12% of the RM's CPU in a backlog).
"""

from __future__ import annotations

from decimal import Decimal

from bindery.reference_rm.accounting import BoundPod, ClusterPods
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.store import Placed, ReservationStore
from bindery.rm.models import ReservationRequest


def request(uid: str) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "s"},
            "resources": {"cpu": "1"},
            "idempotencyKey": uid,
            "ttlSeconds": 60,
        }
    )


def steps_to_resolve_one_changed_node(reservations: int) -> int:
    """VM steps of ``_foreign`` for a snapshot where one node's pods changed, next to
    ``reservations`` committed reservations."""
    store = ReservationStore(":memory:")
    # One reservation per node (a node holds one pod): resolving the changed node resolves one claim.
    nodes = tuple(
        InventoryNode(name=f"m{i:04d}", allocatable={"cpu": Decimal(1)}) for i in range(reservations)
    )
    pods = []
    for index in range(reservations):
        placed = store.reserve(request(f"p{index}"), nodes=nodes, policy=Policy.BINPACK)
        assert isinstance(placed, Placed)
        store.commit(placed.reservation.id)
        pods.append(
            BoundPod(
                uid=f"p{index}",
                key=f"ns/p{index}",
                node=placed.reservation.node,
                usage={"cpu": Decimal(1), "pods": Decimal(1)},
                reservation_id=placed.reservation.id,
            )
        )
    snapshot = ClusterPods.of(pods)
    store._foreign(snapshot)  # every node resolved once
    changed = snapshot.with_node(pods[0].node, [pods[0]])  # a new entry for one node, the others shared
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    store._db.set_progress_handler(count, 10)
    assert store._foreign(changed) == {}  # every pod is its reservation's own: nothing foreign
    store._db.set_progress_handler(None, 0)
    store.close()
    return steps[0] * 10


def test_resolving_one_changed_node_does_not_scan_every_reservation() -> None:
    few = steps_to_resolve_one_changed_node(20)
    many = steps_to_resolve_one_changed_node(500)
    assert many < few + 200, f"{few} SQLite steps next to 20 reservations, {many} next to 500"
