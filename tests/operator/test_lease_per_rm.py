"""A Lease per ResourceManager (`bindery run --leader-elect --lease-per-resource-manager`).

Two replicas, two ResourceManagers (each its own reference RM process and pool of nodes): each
replica leads one profile and stands by for the other. SIGKILL of one replica stops only its
profile: the other keeps binding its own pods meanwhile, takes the dead one's Lease over after
the lease duration, and binds the rest; every pod ends up bound exactly once on a committed
reservation (`settled_invariants`).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import re
import signal
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes_asyncio import client

from bindery.cli import main
from bindery.controller.leadership.rules import (
    MAX_HOLD_BACK_PERIODS,
    LeaseTiming,
    held_back,
    hold_back_seconds,
    lease_name_for,
)
from bindery.controller.startup.rbac import leader_election_rules
from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import eventually
from tests.operator.test_leader_processes import Cluster, cluster, grant_lease
from tests.realrm import OperatorProcess, settled_invariants

LEASE, RENEW, RETRY = 8.0, 6.0, 1.0
PODS = 30


# -- the pure rules -------------------------------------------------------------------------------


def test_each_resource_manager_gets_its_own_lease_name_within_253_characters() -> None:
    assert lease_name_for(base="bindery", resource_manager="gpus") == "bindery-gpus"
    long_a, long_b = "a" * 250 + "x", "a" * 250 + "y"
    name_a = lease_name_for(base="bindery", resource_manager=long_a)
    name_b = lease_name_for(base="bindery", resource_manager=long_b)
    assert len(name_a) <= 253
    assert len(name_b) <= 253
    assert name_a != name_b
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name_a)


def test_a_replica_leading_more_holds_back_longer_but_never_past_the_cap() -> None:
    timing = LeaseTiming()  # 15 / 10 / 2 s
    assert hold_back_seconds(leading=0, timing=timing) == 0
    assert hold_back_seconds(leading=1, timing=timing) == 2.0
    assert hold_back_seconds(leading=50, timing=timing) == MAX_HOLD_BACK_PERIODS * 2.0


def test_a_free_lease_is_left_to_others_only_while_the_hold_back_lasts() -> None:
    assert not held_back(since=None, now=10.0, wait=0.0)
    assert held_back(since=None, now=10.0, wait=2.0)
    assert held_back(since=10.0, now=11.9, wait=2.0)
    assert not held_back(since=10.0, now=12.0, wait=2.0)


def test_a_lease_per_resource_manager_needs_leader_election(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--lease-per-resource-manager"])
    assert exited.value.code == 2
    assert "--lease-per-resource-manager needs --leader-elect" in capsys.readouterr().err


def test_the_role_of_a_lease_per_resource_manager_covers_the_namespaces_leases() -> None:
    rules = leader_election_rules(lease_name=None)
    assert all("resourceNames" not in rule for rule in rules)
    assert {verb for rule in rules for verb in rule["verbs"]} == {"get", "update", "create"}


# -- two replicas, two ResourceManagers -----------------------------------------------------------


@contextlib.asynccontextmanager
async def replica(
    *, kubeconfig: pathlib.Path, directory: pathlib.Path, name: str, namespace: str, lease: str
) -> AsyncIterator[OperatorProcess]:
    args = [
        *("--namespace", namespace, "--leader-elect", "--lease-per-resource-manager"),
        *("--lease-namespace", namespace, "--lease-name", lease),
        *("--lease-duration", f"{LEASE:g}", "--renew-deadline", f"{RENEW:g}", "--retry-period", f"{RETRY:g}"),
    ]
    process = OperatorProcess(kubeconfig=kubeconfig, directory=directory, args=args, name=name)
    await process.start()
    try:
        yield process
    except BaseException:
        print(f"--- {name} log (tail) ---\n" + "\n".join(process.log().splitlines()[-60:]))
        raise
    finally:
        await process.stop()


def leads(process: OperatorProcess, *, namespace: str, lease: str) -> bool:
    return f"became the leader (Lease {namespace}/{lease}," in process.log()


async def lease_holder(api: client.ApiClient, *, namespace: str, name: str) -> str | None:
    lease = await client.CoordinationV1Api(api).read_namespaced_lease(name=name, namespace=namespace)
    holder: str | None = lease.spec.holder_identity
    return holder


async def test_two_replicas_each_lead_one_resource_manager_and_a_sigkill_stops_only_its_own(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
) -> None:
    base = uniq("lease")
    await grant_lease(kube_api, namespace=namespace, lease_name=None)  # every Lease of the namespace
    names = {"a": [f"a{i:03d}" for i in range(PODS)], "b": [f"b{i:03d}" for i in range(PODS)]}
    async with (
        replica(
            kubeconfig=operator_kubeconfig, directory=tmp_path, name="one", namespace=namespace, lease=base
        ) as one,
        replica(
            kubeconfig=operator_kubeconfig, directory=tmp_path, name="two", namespace=namespace, lease=base
        ) as two,
    ):
        # Both replicas are up before either ResourceManager exists: they meet each Lease together.
        await asyncio.gather(one.metrics_url(), two.metrics_url())
        async with (
            cluster(
                controlplane=controlplane,
                api=kube_api,
                namespace=namespace,
                tmp_path=tmp_path / "a",
                pods=PODS,
            ) as pool_a,
            cluster(
                controlplane=controlplane,
                api=kube_api,
                namespace=namespace,
                tmp_path=tmp_path / "b",
                pods=PODS,
            ) as pool_b,
        ):
            lease_of = {
                pool.scheduler: lease_name_for(base=base, resource_manager=pool.scheduler)
                for pool in (pool_a, pool_b)
            }

            async def leader_of(pool: Cluster) -> OperatorProcess | None:
                lease = lease_of[pool.scheduler]
                return next((p for p in (one, two) if leads(p, namespace=namespace, lease=lease)), None)

            leader_a = await eventually(lambda: leader_of(pool_a), within=60, what="a leader of A's Lease")
            leader_b = await eventually(lambda: leader_of(pool_b), within=60, what="a leader of B's Lease")
            assert leader_a is not leader_b, "one replica took both Leases: the profiles did not spread"
            pools = {"a": pool_a, "b": pool_b}
            for key, pool in pools.items():
                await pool.create_pods(names[key][:10])

            async def all_first_bound() -> bool:
                for key, pool in pools.items():
                    if not set(names[key][:10]) <= await pool.bound_names():
                        return False
                return True

            await eventually(all_first_bound, within=90, what="each replica binding its first pods")
            victim_identity = await lease_holder(
                kube_api, namespace=namespace, name=lease_of[pool_a.scheduler]
            )
            loop = asyncio.get_running_loop()
            leader_a.kill(signal.SIGKILL)
            killed_at = loop.time()
            for key, pool in pools.items():
                await pool.create_pods(names[key][10:])

            # B's profile goes on: its pods are bound while A's Lease still names the dead replica.
            async def b_bound_some_of_the_rest() -> bool:
                return bool(set(names["b"][10:]) & await pool_b.bound_names())

            await eventually(b_bound_some_of_the_rest, within=60, what="B's pods bound after the kill")
            holder_then = await lease_holder(kube_api, namespace=namespace, name=lease_of[pool_a.scheduler])
            b_after = loop.time() - killed_at
            assert holder_then == victim_identity, (
                f"A's Lease changed hands ({holder_then}) before the surviving replica bound any of B's "
                f"new pods ({b_after:.2f} s after the kill): B's profile waited for A's"
            )

            survivor = leader_b

            async def took_over() -> bool:
                return leads(survivor, namespace=namespace, lease=lease_of[pool_a.scheduler])

            await eventually(took_over, within=60, interval=0.05, what="the survivor taking A's Lease")
            took = loop.time() - killed_at
            for key, pool in pools.items():  # both pools' pods share the namespace

                async def all_bound(pool: Cluster = pool, key: str = key) -> bool:
                    return set(names[key]) <= await pool.bound_names()

                await eventually(all_bound, within=120, what=f"all pods of {pool.scheduler} bound")
                await settled_invariants(
                    api=kube_api, rm=pool.rm, namespace=namespace, scheduler_names=[pool.scheduler], within=60
                )
                events = await pool.scheduled_events()
                assert all(count == 1 for count in events.values()), events
            print(
                f"\nB's first new pod bound {b_after:.2f} s after SIGKILL of A's leader, with A's Lease "
                f"still the dead replica's; the survivor led A {took:.2f} s after the kill "
                f"(lease {LEASE:g} s, renew deadline {RENEW:g} s, retry period {RETRY:g} s)"
            )
            # the standby counts the lease from its last look (up to a retry period late), looks
            # every retry period, and holds back at most MAX_HOLD_BACK_PERIODS: it leads one already
            assert took <= LEASE + (2 + MAX_HOLD_BACK_PERIODS) * RETRY + 1.0, f"took {took:.2f} s"
