"""`bindery.controller.startup.install` against a real apiserver: what the demo and the test planes
install."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes_asyncio import client

from bindery.apiserver import create, delete, get, resources
from bindery.controller.startup.install import grant_debug_reader, grant_operator
from bindery.controller.startup.rbac import DEBUG_READER_RULES, cluster_role


async def test_granting_again_brings_an_older_cluster_role_up_to_date(
    kube_api: client.ApiClient, uniq: Callable[[str], str]
) -> None:
    """A ClusterRole left by an earlier version (a kept demo plane, an upgraded test bed) lacked the
    verbs newer code needs, e.g. `create pods/eviction` for preemption; granting used to keep it
    as it was, and the operator then failed with 403s nobody connected to the install."""
    name, reader = uniq("bindery-operator"), uniq("bindery-debug-reader")
    wanted = cluster_role(name=name)
    stale = {**wanted, "rules": wanted["rules"][:1]}
    await create(kube_api, resources.CLUSTER_ROLES, body=stale)
    await create(
        kube_api,
        resources.CLUSTER_ROLES,
        body={**cluster_role(name=reader, rules=DEBUG_READER_RULES), "rules": []},
    )
    try:
        await grant_operator(api=kube_api, user=f"user-{name}", name=name)
        await grant_debug_reader(api=kube_api, user=f"user-{reader}", name=reader)
        stored = await get(kube_api, resources.CLUSTER_ROLES, name=name)
        assert len(stored["rules"]) == len(wanted["rules"]) > 1
        assert stored["rules"] == wanted["rules"]
        stored_reader = await get(kube_api, resources.CLUSTER_ROLES, name=reader)
        assert stored_reader["rules"] == cluster_role(name=reader, rules=DEBUG_READER_RULES)["rules"]
        binding = await get(kube_api, resources.CLUSTER_ROLE_BINDINGS, name=name)
        assert binding["subjects"][0]["name"] == f"user-{name}"
        # Granting again changes nothing and raises nothing.
        await grant_operator(api=kube_api, user=f"user-{name}", name=name)
        again = await get(kube_api, resources.CLUSTER_ROLES, name=name)
        assert again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
        # Granting a second user adds it; the first keeps its grant.
        await grant_operator(api=kube_api, user=f"second-{name}", name=name)
        binding = await get(kube_api, resources.CLUSTER_ROLE_BINDINGS, name=name)
        assert [s["name"] for s in binding["subjects"]] == [f"user-{name}", f"second-{name}"]
    finally:
        for role in (name, reader):
            await delete(kube_api, resources.CLUSTER_ROLES, name=role)
            await delete(kube_api, resources.CLUSTER_ROLE_BINDINGS, name=role)
