"""The operator's apiserver connections: sized for its watches plus maxInFlight (issue 20, item 13).

kubernetes_asyncio's connector allowed 100 connections, shared by Bindery's long watches (unbound
and bound pods of each claimed scheduler name) and by every write. Five ResourceManagers of 16
names each are 160 watches: the first 100 took the pool, and the rest of the watches and every
Binding waited for one of them to end (up to `watch_timeout`, 300 s).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from kubernetes_asyncio import client

from bindery.apiserver.api import ApiClient
from tests.operator.conftest import Bindery, Stage, create_rm, delete_rm, eventually, now, resource_manager

#: ResourceManagers beside the stage's, and names each (the CRD's maxItems).
EXTRA_RMS = 4
NAMES = 16


def reconciled(bindery: Bindery, rm: str) -> bool:
    supervisor = bindery.runtime.supervisors.get(rm)
    return supervisor is not None and supervisor.reconciled >= 1


def limit(api: ApiClient) -> int:
    return int(api.rest_client.pool_manager.connector.limit)


async def test_a_pod_binds_while_the_operator_watches_more_names_than_the_old_pool_had_room_for(
    *, kube_api: client.ApiClient, bindery: Bindery, stage: Stage, uniq: Callable[[str], str]
) -> None:
    """160 watches and a pod of the last name: it binds, and the pool covers watches + maxInFlight."""
    extra = [uniq(f"pool-rm-{i}") for i in range(EXTRA_RMS)]
    try:
        for i, name in enumerate(extra):
            await create_rm(
                kube_api,
                name=name,
                scheduler_names=[uniq(f"pool-{i}-{j}") for j in range(NAMES)],
                endpoint=stage.rm.url,
                maxInFlight=8,
            )
        more_names = [uniq(f"pool-s-{j}") for j in range(NAMES - 1)]
        async with resource_manager(
            kube_api,
            name=stage.rm_name,
            scheduler_names=[*more_names, stage.scheduler],
            endpoint=stage.rm.url,
            maxInFlight=8,
        ):
            claimed = (EXTRA_RMS + 1) * NAMES
            rms = [*extra, stage.rm_name]
            await eventually(
                lambda: now(len(bindery.runtime.pending.claimed()) == claimed), what="every name claimed"
            )
            # Settled: every name's unbound pods listed, and every ResourceManager's first reconcile
            # pass (its bound pods listed) done; from here on only the watches hold connections.
            unbound = bindery.runtime.unbound
            assert unbound is not None
            await eventually(lambda: now(unbound.lists >= claimed), within=60, what="every name listed")
            await eventually(
                lambda: now(all(reconciled(bindery, rm) for rm in rms)),
                within=60,
                what="every ResourceManager's first reconcile pass",
            )
            await stage.create("last")
            assert await eventually(lambda: stage.node_of("last"), within=90, what="the pod bound")
            pool = bindery.runtime.connection_pool(
                runner.config for runner in bindery.runtime.runners.values()
            )
            # per claimed name an unbound watch; one watch of placed pods (the inter-pod rules and
            # every profile's releases), one of namespace labels (their namespaceSelector), one
            # of Services (default spreading), one of PodGroups (counted before it starts) and
            # one of Nodes (the operator's own, no longer Kopf's)
            assert (pool.watches, pool.in_flight) == (claimed + 5, 8 * (EXTRA_RMS + 1))
            assert limit(bindery.runtime.api) == pool.size
    finally:
        for name in extra:
            with contextlib.suppress(Exception):
                await delete_rm(kube_api, name=name)
