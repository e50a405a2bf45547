"""Preemption plans in the store, on both backends (contract v1.2 ``preemption``, issue 22).

Why: plans lived in the memory of the replica that proposed them, so with two replicas on one
PostgreSQL a confirm reaching the other one was answered 404 and the room the plan held was
invisible to it. Here a second store on the same database (a second replica on PostgreSQL; the
same file reopened on SQLite, which one process owns) must answer the plan, keep the room held in
single reserves, batches and groups alike, and judge the lease as the first one does.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal

import psycopg
import pytest

from bindery.reference_rm.accounting import BoundPod
from bindery.reference_rm.pgstore import PostgresReservationStore
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.preemption import Proposal
from bindery.reference_rm.store import GroupPlaced, Placed, Unschedulable
from bindery.reference_rm.stores import Store
from bindery.rm.models import (
    BatchOperation,
    PlanState,
    ReservationGroupRequest,
    ReservationRequest,
)
from tests.rm.conftest import StoreFactory

NODES = [InventoryNode(name="n1", allocatable={"cpu": Decimal(4)})]
LEASE = 60


def request(uid: str, cpu: str = "2") -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "s"},
            "resources": {"cpu": cpu},
            "idempotencyKey": uid,
            "ttlSeconds": 600,
        }
    )


def group(uid: str, cpu: str = "2") -> ReservationGroupRequest:
    return ReservationGroupRequest.model_validate(
        {
            "group": {"namespace": "ns", "name": uid, "schedulerName": "s"},
            "members": [
                {
                    "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "s"},
                    "resources": {"cpu": cpu},
                }
            ],
            "idempotencyKey": uid,
            "ttlSeconds": 600,
        }
    )


def victim(uid: str, reservation_id: str) -> BoundPod:
    return BoundPod(
        uid=uid,
        key=f"ns/{uid}",
        node="n1",
        usage={"cpu": Decimal(2)},
        reservation_id=reservation_id,
        priority=10,
    )


class Chooser:
    """Proposes ``victims`` on n1 for a 2-CPU preemptor, and remembers what the store showed it."""

    def __init__(self, *victims: BoundPod) -> None:
        self.victims = victims
        self.calls: list[tuple[dict[str, dict[str, Decimal]], frozenset[str]]] = []

    def __call__(
        self, used: Mapping[str, Mapping[str, Decimal]], spoken_for: frozenset[str]
    ) -> Proposal | None:
        self.calls.append(({node: dict(bucket) for node, bucket in used.items()}, spoken_for))
        left = tuple(v for v in self.victims if v.uid not in spoken_for)
        if not left:
            return None
        return Proposal(node="n1", victims=left, hold={"cpu": Decimal(2)}, violations={left[0].uid: ("pdb",)})


def fill(store: Store) -> list[BoundPod]:
    """n1 full: two committed 2-CPU reservations, the candidates."""
    pods = []
    for uid in ("low-1", "low-2"):
        placed = store.reserve(request(uid), nodes=NODES, policy=Policy.BINPACK)
        assert isinstance(placed, Placed)
        store.commit(placed.reservation.id)
        pods.append(victim(uid, placed.reservation.id))
    return pods


def another(make_store: StoreFactory, first: Store, clock: Callable[[], float] | None) -> Store:
    """A second store on the same database: a second replica on PostgreSQL; on SQLite, whose file
    one process owns, the same file reopened (what a restart of the RM sees)."""
    if make_store.backend == "sqlite":
        first.close()
    return make_store(clock=clock)


def test_a_plan_proposed_by_one_store_is_answered_confirmed_and_used_through_another(
    make_store: StoreFactory,
) -> None:
    now = [1000.0]
    a = make_store(clock=lambda: now[0])
    low = fill(a)
    chooser = Chooser(low[0])
    plan = a.propose_plan("high", chooser, lease_seconds=LEASE)
    assert plan is not None
    assert (plan.state, plan.node, [v.uid for v in plan.victims]) == (PlanState.PROPOSED, "n1", ["low-1"])
    assert plan.expires_at == 1060.0
    assert plan.violations == {"low-1": ("pdb",)}
    assert chooser.calls == [({"n1": {"cpu": Decimal(4)}}, frozenset())]
    b = another(make_store, a, lambda: now[0])
    # Asked again, on any replica: the same plan, not a second one with more victims.
    again = b.propose_plan("high", Chooser(low[1]), lease_seconds=LEASE)
    assert again is not None
    assert again.plan_id == plan.plan_id
    assert again.to_json() == plan.to_json()
    now[0] = 1010.0
    confirmed = b.confirm_plan(plan.plan_id)
    assert confirmed is not None
    assert (confirmed.state, confirmed.expires_at) == (PlanState.CONFIRMED, 1070.0)
    # The victim is evicted and its reservation released: the room is the preemptor's alone.
    assert b.release(low[0].reservation_id or "") is not None
    assert isinstance(b.reserve(request("intruder"), nodes=NODES, policy=Policy.BINPACK), Unschedulable)
    placed = b.reserve(request("high"), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    assert placed.reservation.node == "n1"
    used = b.get_plan(plan.plan_id)
    assert used is not None
    assert used.state is PlanState.USED
    # A late confirm meets the plan's final state (the server answers 409), and a cancel changes nothing.
    late = b.confirm_plan(plan.plan_id)
    assert late is not None
    assert late.state is PlanState.USED
    cancelled = b.cancel_plan(plan.plan_id)
    assert cancelled is not None
    assert cancelled.state is PlanState.USED
    assert b.get_plan("pln-unknown") is None
    assert b.confirm_plan("pln-unknown") is None


def test_a_confirmed_plans_room_is_held_from_another_stores_reserves_batches_and_groups(
    make_store: StoreFactory,
) -> None:
    now = [1000.0]
    a = make_store(clock=lambda: now[0])
    low = fill(a)
    plan = a.propose_plan("high", Chooser(low[0]), lease_seconds=LEASE)
    assert plan is not None
    # Proposed only: nothing is held yet (the victims still run), as before plans were stored.
    b = another(make_store, a, lambda: now[0])
    assert b.release(low[0].reservation_id or "") is not None
    assert b.confirm_plan(plan.plan_id) is not None
    for attempt in (
        lambda: b.reserve(request("x"), nodes=NODES, policy=Policy.BINPACK),
        lambda: b.batch(
            [BatchOperation.model_validate({"reserve": request("y").model_dump(by_alias=True, mode="json")})],
            nodes=NODES,
            policy=Policy.BINPACK,
        )[0],
        lambda: b.reserve_group(group("z"), nodes=NODES, policy=Policy.BINPACK),
    ):
        assert isinstance(attempt(), Unschedulable)
    # The preemptor in a batch gets its room, and the plan ends with it.
    (placed,) = b.batch(
        [BatchOperation.model_validate({"reserve": request("high").model_dump(by_alias=True, mode="json")})],
        nodes=NODES,
        policy=Policy.BINPACK,
    )
    assert isinstance(placed, Placed)
    ended = b.get_plan(plan.plan_id)
    assert ended is not None
    assert ended.state is PlanState.USED


def test_a_confirmed_plans_room_is_held_from_other_pods_in_the_preemptors_own_batch(
    make_store: StoreFactory,
) -> None:
    """A scheduling cycle batches the preemptor's reserve with other pods' reserves. The held room is
    the preemptor's alone there too: another pod placed earlier in the same batch must not take it
    (it did: the batch took out no hold of any preemptor reserving in it, so the preemptor lost its
    room to a pod of lower priority and its victims were evicted for nothing)."""
    now = [1000.0]
    a = make_store(clock=lambda: now[0])
    low = fill(a)
    plan = a.propose_plan("high", Chooser(low[0]), lease_seconds=LEASE)
    assert plan is not None
    assert a.release(low[0].reservation_id or "") is not None
    assert a.confirm_plan(plan.plan_id) is not None
    intruder, preemptor = a.batch(
        [
            BatchOperation.model_validate({"reserve": request(uid).model_dump(by_alias=True, mode="json")})
            for uid in ("intruder", "high")
        ],
        nodes=NODES,
        policy=Policy.BINPACK,
    )
    assert isinstance(intruder, Unschedulable), intruder
    assert isinstance(preemptor, Placed), preemptor
    ended = a.get_plan(plan.plan_id)
    assert ended is not None
    assert ended.state is PlanState.USED
    # Once the preemptor's reserve ended its plan, the room is its reservation, counted once.
    (late,) = a.batch(
        [BatchOperation.model_validate({"reserve": request("late").model_dump(by_alias=True, mode="json")})],
        nodes=NODES,
        policy=Policy.BINPACK,
    )
    assert isinstance(late, Unschedulable), late


def test_a_plans_victims_are_spoken_for_and_its_hold_counted_when_another_preemptor_asks(
    make_store: StoreFactory,
) -> None:
    now = [1000.0]
    a = make_store(clock=lambda: now[0])
    low = fill(a)
    first = a.propose_plan("high-1", Chooser(low[0]), lease_seconds=LEASE)
    assert first is not None
    b = another(make_store, a, lambda: now[0])
    second = Chooser(low[0], low[1])
    plan = b.propose_plan("high-2", second, lease_seconds=LEASE)
    assert plan is not None
    assert [v.uid for v in plan.victims] == ["low-2"]  # low-1 is the first plan's
    assert second.calls[-1][1] == frozenset({"low-1"})
    assert b.confirm_plan(first.plan_id) is not None
    assert b.cancel_plan(plan.plan_id) is not None
    third = Chooser(low[1])
    assert b.propose_plan("high-3", third, lease_seconds=LEASE) is not None
    # The first plan's confirmed hold is in use for any other preemptor: 4 committed + 2 held.
    assert third.calls[-1] == ({"n1": {"cpu": Decimal(6)}}, frozenset({"low-1"}))


def test_a_plan_expires_with_its_lease_frees_its_room_and_is_forgotten_a_lease_later(
    make_store: StoreFactory,
) -> None:
    now = [1000.0]
    a = make_store(clock=lambda: now[0])
    low = fill(a)
    plan = a.propose_plan("high", Chooser(low[0]), lease_seconds=LEASE)
    assert plan is not None
    now[0] = 1030.0
    assert a.confirm_plan(plan.plan_id) is not None  # held until 1090
    assert a.release(low[0].reservation_id or "") is not None
    b = another(make_store, a, lambda: now[0])
    now[0] = 1089.9
    assert isinstance(b.reserve(request("x"), nodes=NODES, policy=Policy.BINPACK), Unschedulable)
    now[0] = 1090.0
    expired = b.get_plan(plan.plan_id)
    assert expired is not None
    assert expired.state is PlanState.EXPIRED
    late = b.confirm_plan(plan.plan_id)
    assert late is not None
    assert late.state is PlanState.EXPIRED
    assert isinstance(b.reserve(request("x"), nodes=NODES, policy=Policy.BINPACK), Placed)
    # The preemptor asks again: a new plan (the old one no longer counts its victim).
    again = b.propose_plan("high", Chooser(low[1]), lease_seconds=LEASE)
    assert again is not None
    assert again.plan_id != plan.plan_id
    now[0] = 1150.0  # the old plan's lease ended at 1090, plus one lease remembered
    assert b.get_plan(plan.plan_id) is None
    assert b.confirm_plan(plan.plan_id) is None


def test_two_replicas_proposing_at_once_never_name_one_victim_twice(postgres_db: str) -> None:
    """Proposals are taken under the placement lock: a second replica's proposal waits for the
    first one's and then sees its victims spoken for (without the lock both would evict low-1)."""
    a = PostgresReservationStore(postgres_db, clock=lambda: 1000.0)
    b = PostgresReservationStore(postgres_db, clock=lambda: 1000.0)
    low = fill(a)
    inside, finish = threading.Event(), threading.Event()

    def slow(used: Mapping[str, Mapping[str, Decimal]], spoken_for: frozenset[str]) -> Proposal | None:
        inside.set()
        assert finish.wait(30)
        return Chooser(low[0])(used, spoken_for)

    second = Chooser(low[0])
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(a.propose_plan, "high-1", slow, lease_seconds=LEASE)
        assert inside.wait(30)
        other = pool.submit(b.propose_plan, "high-2", second, lease_seconds=LEASE)
        with psycopg.connect(postgres_db) as conn:  # b waits for the lock a holds
            deadline = time.monotonic() + 30
            while conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ).fetchone() != (1,):
                assert time.monotonic() < deadline, "the second proposal never waited for the lock"
                time.sleep(0.05)
        finish.set()
        assert first.result(timeout=30) is not None
        assert other.result(timeout=30) is None  # low-1 is the only candidate, and it is spoken for
    assert second.calls == [({"n1": {"cpu": Decimal(4)}}, frozenset({"low-1"}))]
    a.close()
    b.close()


def test_plan_leases_are_stamped_and_judged_by_the_database_clock(
    postgres_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas whose clocks disagree agree on a plan's lease: with this machine's clock 30 years
    back, a plan's lease starts at the database's time, and one the database says is over is
    expired and holds nothing."""
    store = PostgresReservationStore(postgres_db)
    low = fill(store)
    with psycopg.connect(postgres_db) as conn:
        row = conn.execute(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
        ).fetchone()
    assert row is not None
    database_now = float(row[0])
    monkeypatch.setattr(time, "time", lambda: database_now - 30 * 365 * 86400)
    plan = store.propose_plan("high", Chooser(low[0]), lease_seconds=LEASE)
    assert plan is not None
    assert abs(plan.expires_at - LEASE - database_now) < 600
    assert store.confirm_plan(plan.plan_id) is not None
    assert store.release(low[0].reservation_id or "") is not None
    assert isinstance(store.reserve(request("x"), nodes=NODES, policy=Policy.BINPACK), Unschedulable)
    with psycopg.connect(postgres_db) as conn:  # the lease ran out, by the database's clock
        conn.execute(
            "UPDATE preemption_plans SET expires_at = "
            "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION) - 1"
        )
    expired = store.get_plan(plan.plan_id)
    assert expired is not None
    assert expired.state is PlanState.EXPIRED
    assert isinstance(store.reserve(request("x"), nodes=NODES, policy=Policy.BINPACK), Placed)
    store.close()


def test_a_room_a_plan_only_proposed_names_is_not_held(
    make_store: StoreFactory,
) -> None:
    """As when plans were in memory: only a confirmed plan holds (a proposed one's victims still run)."""
    now = [1000.0]
    a = make_store(clock=lambda: now[0])
    low = fill(a)
    plan = a.propose_plan("high", Chooser(low[0]), lease_seconds=LEASE)
    assert plan is not None
    assert a.release(low[0].reservation_id or "") is not None
    assert isinstance(a.reserve_group(group("g"), nodes=NODES, policy=Policy.BINPACK), GroupPlaced)
