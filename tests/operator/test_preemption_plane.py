"""Preemption through the resource manager on the real apiserver (issue 21).

The issue's scenario: two 4-CPU nodes filled by four 2-CPU pods of priority 10, then one 2-CPU pod
of priority 100000. The reference RM runs as its own process with ``--mirror-nodes`` (it sees every
bound pod and its priority), the operator under its least-privilege identity (so evicting needs the
``pods/eviction`` rule it declares). Victims have ``terminationGracePeriodSeconds: 0``: this plane
has no kubelet, so an evicted pod with a grace period would stay Terminating forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import pathlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.preemption import PREEMPTION_BACKOFF
from bindery.controller.queueview import QueueView
from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.explain.facts import preemption_backoff, preemption_plan
from tests.gangs.scenarios import pod_group
from tests.operator.conftest import (
    Bindery,
    create_pod,
    events_of,
    eventually,
    pod_body,
    read_pod,
    resource_manager,
)
from tests.realrm import RMProcess

POOL = "bindery.dev/test-pool"
LOW, HIGH = 10, 100_000
#: How long the back-off test keeps nodes changing (it spans the first back-off, not the second).
WINDOW_SECONDS = 25.0


class Pool:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        namespace: str,
        token: str,
        rm: RMProcess,
        operator: Bindery | None = None,
    ) -> None:
        self.operator = operator
        self.api = api
        self.namespace = namespace
        self.token = token
        self.rm = rm
        self.scheduler = f"sched-{token}"

    def priority_class(self, name: str) -> str:
        return f"pc-{self.token}-{name}"

    @property
    def nodes(self) -> list[str]:
        return [f"pe-{self.token}-{i}" for i in range(2)]

    async def create(
        self,
        name: str,
        *,
        priority_class: str,
        cpu: str = "2",
        labels: dict[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        body = pod_body(
            name=name,
            labels={"tier": priority_class, **(labels or {})},
            scheduler_name=self.scheduler,
            cpu=cpu,
            nodeSelector={POOL: self.token},
            priorityClassName=self.priority_class(priority_class),
            terminationGracePeriodSeconds=0,
            **spec,
        )

        # The priority admission plugin sees new PriorityClasses through a cache: retry until it does.
        async def admitted() -> dict[str, Any] | None:
            try:
                return await create_pod(self.api, namespace=self.namespace, body=body)
            except client.ApiException as exc:
                if exc.status == 403 and "PriorityClass" in str(exc.body):
                    return None
                raise

        created: dict[str, Any] = await eventually(admitted, what=f"pod {name} admitted")
        return created

    async def node_of(self, name: str) -> str | None:
        try:
            pod = await read_pod(self.api, namespace=self.namespace, name=name)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        node = pod["spec"].get("nodeName")
        return str(node) if node else None

    async def existing(self, names: Sequence[str]) -> list[str]:
        listed = await client.CoreV1Api(self.api).list_namespaced_pod(namespace=self.namespace)
        present = {pod.metadata.name for pod in listed.items}
        return [name for name in names if name in present]

    async def fill(self) -> dict[str, str]:
        """The four low-priority pods, bound two per node."""
        names = [f"low-{i}" for i in range(4)]
        for name in names:
            await self.create(name, priority_class="low")
        placed: dict[str, str] = {}
        for name in names:
            placed[name] = await eventually(functools.partial(self.node_of, name), what=f"{name} bound")
        assert sorted(placed.values()).count(placed["low-0"]) == 2, placed
        return placed

    async def place(
        self, name: str, node: str, *, priority_class: str, labels: dict[str, str], **spec: Any
    ) -> None:
        """A 2-CPU pod bound to ``node`` by its spec (as another scheduler would), Running and Ready:
        the Eviction API checks budgets only for running pods, and there is no kubelet here."""
        await self.create(
            name,
            priority_class=priority_class,
            labels=labels,
            nodeName=node,
            schedulerName="elsewhere",
            **spec,
        )
        await client.CoreV1Api(self.api).patch_namespaced_pod_status(
            name=name,
            namespace=self.namespace,
            body={"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        )

    async def budget(self, name: str, *, selector: dict[str, str], min_available: int) -> None:
        """A PodDisruptionBudget; with no disruption controller on this plane its status stays
        ``disruptionsAllowed: 0``, so it refuses every eviction of the pods it selects."""
        await client.PolicyV1Api(self.api).create_namespaced_pod_disruption_budget(
            namespace=self.namespace,
            body={
                "metadata": {"name": name},
                "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}},
            },
        )

    async def scheduled_condition(self, name: str) -> dict[str, Any]:
        pod = await read_pod(self.api, namespace=self.namespace, name=name)
        found = [c for c in pod["status"].get("conditions") or () if c["type"] == "PodScheduled"]
        return dict(found[0]) if found else {}

    def preemptions(self, outcome: str) -> int:
        """``bindery_preemptions_total`` of this pool's ResourceManager for ``outcome``."""
        assert self.operator is not None
        value = self.operator.runtime.metrics.registry.get_sample_value(
            "bindery_preemptions_total", {"resource_manager": f"rm-{self.token}", "outcome": outcome}
        )
        return int(value or 0)

    async def rm_said(self, text: str) -> bool:
        return text in self.rm.log_path.read_text(errors="replace")


@contextlib.asynccontextmanager
async def pool_of(
    *,
    controlplane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    directory: pathlib.Path,
    operator: Bindery,
    options: Sequence[str] = (),
    kubeconfig: pathlib.Path | None = None,
) -> AsyncIterator[Pool]:
    """``kubeconfig``: the RM's identity (default: the plane's admin)."""
    token = uuid.uuid4().hex[:8]
    nodes = [f"pe-{token}-{i}" for i in range(2)]
    scheduling = client.SchedulingV1Api(api)
    classes = {
        "low": (LOW, "PreemptLowerPriority"),
        "mid": (50, "PreemptLowerPriority"),
        "high": (HIGH, "PreemptLowerPriority"),
        "never": (HIGH, "Never"),
    }
    for name in nodes:
        await create_node(
            api, name=name, capacity={"cpu": "4", "memory": "16Gi", "pods": "110"}, labels={POOL: token}
        )
    for name, (value, policy) in classes.items():
        await scheduling.create_priority_class(
            body={"metadata": {"name": f"pc-{token}-{name}"}, "value": value, "preemptionPolicy": policy}
        )
    try:
        async with RMProcess(
            kubeconfig=kubeconfig or controlplane.kubeconfig,
            directory=directory,
            node_selector=f"{POOL}={token}",
            options=options,
        ) as rm:
            secret = f"rm-token-{token}"
            await client.CoreV1Api(api).create_namespaced_secret(
                namespace=namespace,
                body={
                    "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
                    "stringData": {"token": rm.token},
                },
            )
            staged = Pool(api=api, namespace=namespace, token=token, rm=rm, operator=operator)
            async with resource_manager(
                api,
                name=f"rm-{token}",
                scheduler_names=[staged.scheduler],
                endpoint=rm.url,
                auth={"tokenSecretRef": {"namespace": namespace, "name": secret}},
                backoff={"initialSeconds": 0.2, "maxSeconds": 1},
                # The victims `place` binds are another scheduler's, which the reference RM counts
                # (--mirror-nodes); the default, Served, would refuse them.
                preemption={"victims": "Any"},
            ):
                yield staged
    finally:
        for name in nodes:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(api).delete_node(name=name)
        for name in classes:
            with contextlib.suppress(client.ApiException):
                await scheduling.delete_priority_class(name=f"pc-{token}-{name}")


@pytest.fixture
async def pool(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    bindery: Bindery,
    tmp_path: pathlib.Path,
) -> AsyncIterator[Pool]:
    async with pool_of(
        controlplane=controlplane,
        api=kube_api,
        namespace=namespace,
        directory=tmp_path / "rm",
        operator=bindery,
    ) as staged:
        yield staged


async def test_a_high_priority_pod_preempts_one_low_priority_pod_and_is_bound(pool: Pool) -> None:
    placed = await pool.fill()
    await pool.create("high", priority_class="high")
    node = await eventually(lambda: pool.node_of("high"), within=60, what="the preemptor bound")
    left = await pool.existing(list(placed))
    assert len(left) == 3, f"expected one victim evicted, {len(left)} low pods left: {left}"
    (victim,) = set(placed) - set(left)
    assert placed[victim] == node
    preemptor = await read_pod(pool.api, namespace=pool.namespace, name="high")
    # Bindery nominated the node; the apiserver clears the nomination at the Binding (feature gate
    # ClearingNominatedNodeNameAfterBinding, beta and on since Kubernetes 1.35).
    assert not preemptor["status"].get("nominatedNodeName")
    events = await events_of(pool.api, namespace=pool.namespace, pod_name=victim)
    preempted = [e for e in events if e.get("reason") == "Preempted"]
    assert preempted, events
    assert preempted[0]["note"] == f"Preempted by pod {preemptor['metadata']['uid']} on node {node}"
    counts = {o: pool.preemptions(o) for o in ("proposed", "confirmed", "victim_evicted", "cancelled")}
    assert counts == {"proposed": 1, "confirmed": 1, "victim_evicted": 1, "cancelled": 0}


async def test_a_preemptor_with_policy_never_evicts_nothing(pool: Pool) -> None:
    placed = await pool.fill()
    created = await pool.create("never", priority_class="never")
    uid = created["metadata"]["uid"]
    # The RM's answer is what decides: without a plan in it there is nothing to carry out.
    await eventually(
        lambda: pool.rm_said(f"(uid {uid}) unschedulable"), within=30, what="the RM answered the preemptor"
    )
    assert not await pool.rm_said(f"for pod {uid}: evict")
    assert await pool.existing(list(placed)) == list(placed)
    assert await pool.node_of("never") is None


async def test_an_rm_without_the_feature_gets_no_preemption_policy_and_evicts_nothing(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    bindery: Bindery,
    tmp_path: pathlib.Path,
) -> None:
    async with pool_of(
        controlplane=controlplane,
        api=kube_api,
        namespace=namespace,
        directory=tmp_path / "rm",
        operator=bindery,
        options=["--no-preemption"],
    ) as old:
        placed = await old.fill()
        created = await old.create("high", priority_class="high")
        uid = created["metadata"]["uid"]
        await eventually(lambda: old.rm_said(f"(uid {uid}) unschedulable"), within=30, what="the RM answered")
        # The field would have been refused with 400: the client left it out.
        assert not await old.rm_said("preemptionPolicy")
        assert await old.existing(list(placed)) == list(placed)
        assert await old.node_of("high") is None


async def test_the_victim_no_pdb_protects_is_chosen(pool: Pool) -> None:
    """Issue 21: "victims no PDB protects preferred". Node 0 holds two protected pods, node 1 one
    protected and one not; every other rule ties (one priority-10 victim either way), and the node
    names would pick node 0. The unprotected pod is the victim and the preemptor binds on node 1."""
    first, second = pool.nodes
    for name, node, kept in (
        ("p0", first, "yes"),
        ("p1", first, "yes"),
        ("p2", second, "yes"),
        ("u3", second, "no"),
    ):
        await pool.place(name, node, priority_class="low", labels={"kept": kept})
    await pool.budget("keep", selector={"kept": "yes"}, min_available=3)
    await pool.create("high", priority_class="high")
    node = await eventually(lambda: pool.node_of("high"), within=60, what="the preemptor bound")
    assert node == second
    assert await pool.existing(["p0", "p1", "p2", "u3"]) == ["p0", "p1", "p2"]
    assert pool.preemptions("victim_evicted") == 1


async def test_when_every_plan_needs_a_protected_victim_nothing_is_evicted_and_the_preemptor_is_told(
    pool: Pool,
) -> None:
    """A 4-CPU preemptor needs a whole node. Node 0: an unprotected priority-10 pod and a protected
    priority-50 one; node 1: two protected priority-50 pods. Every plan needs a protected victim,
    and node 0's would evict the unprotected pod first, then meet the budget's 429: that pod would
    be evicted for nothing. Nothing at all is evicted, and the preemptor's PodScheduled condition
    and FailedScheduling event name the budget."""
    first, second = pool.nodes
    layout = (
        ("free", first, "low", "no"),
        ("m0", first, "mid", "yes"),
        ("m1", second, "mid", "yes"),
        ("m2", second, "mid", "yes"),
    )
    for name, node, priority_class, kept in layout:
        await pool.place(name, node, priority_class=priority_class, labels={"kept": kept})
    await pool.budget("keep-mid", selector={"kept": "yes"}, min_available=3)
    await pool.create("high", priority_class="high", cpu="4")

    async def told() -> dict[str, Any] | None:
        condition = await pool.scheduled_condition("high")
        return condition if "keep-mid" in str(condition.get("message")) else None

    condition = await eventually(told, within=60, what="the preemptor told about the budget")
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable"), condition
    assert "nothing was evicted" in condition["message"], condition
    events = await events_of(pool.api, namespace=pool.namespace, pod_name="high")
    assert any("keep-mid" in str(e.get("note")) for e in events if e.get("reason") == "FailedScheduling"), (
        events
    )
    assert await pool.existing([name for name, *_ in layout]) == [name for name, *_ in layout]
    assert pool.preemptions("victim_evicted") == 0
    assert pool.preemptions("confirmed") == 0
    for name, *_ in layout:  # refused before anything: no pod was ever made a disruption target
        pod = await read_pod(pool.api, namespace=pool.namespace, name=name)
        assert not [c for c in pod["status"].get("conditions") or () if c["type"] == "DisruptionTarget"], pod
    assert await pool.node_of("high") is None
    # `bindery explain` shows the back-off: the operator's queue view (what /debug/queue serves)
    # carries it, and explain says until when and why. Each refused plan starts a back-off again.
    assert pool.operator is not None
    runtime = pool.operator.runtime
    view = QueueView(
        runners=lambda: runtime.runners, pods=runtime.pods, leading=lambda: True, served=lambda _: True
    )

    async def backed_off() -> dict[str, Any] | None:
        status, served = view.pod(namespace=pool.namespace, name="high")
        return served if status == 200 and "preemption_backoff" in served else None

    served = await eventually(backed_off, within=60, what="the preemption back-off in the queue view")
    assert "keep-mid" in served["preemption_backoff"]["reason"], served
    said = preemption_backoff(served)
    assert said is not None
    assert said.startswith("backed off until "), said
    assert "because evicting victim" in said, said


async def test_a_budget_the_rm_thinks_allows_it_is_checked_by_a_dry_run_before_any_eviction(
    pool: Pool,
) -> None:
    """The RM's view of a budget may be stale. Here the budget's status says one disruption is
    allowed but is older than its spec (observedGeneration 0), which the Eviction API answers 429
    ("still being processed"). The RM sees no violation on node 0 and proposes its unprotected
    priority-10 pod and a protected priority-50 one; evicting them in order would evict the first for
    nothing. The dry run of every eviction refuses the plan first: nothing is evicted."""
    first, second = pool.nodes
    layout = (
        ("free", first, "low", "no"),
        ("m0", first, "mid", "yes"),
        ("m1", second, "mid", "yes"),
        ("m2", second, "mid", "yes"),
    )
    for name, node, priority_class, kept in layout:
        await pool.place(name, node, priority_class=priority_class, labels={"kept": kept})
    await pool.budget("stale", selector={"kept": "yes"}, min_available=2)
    await client.PolicyV1Api(pool.api).patch_namespaced_pod_disruption_budget_status(
        name="stale",
        namespace=pool.namespace,
        body={
            "status": {
                "observedGeneration": 0,
                "disruptionsAllowed": 1,
                "currentHealthy": 3,
                "desiredHealthy": 2,
                "expectedPods": 3,
            }
        },
    )
    await pool.create("high", priority_class="high", cpu="4")

    async def told() -> dict[str, Any] | None:
        condition = await pool.scheduled_condition("high")
        return condition if "stale" in str(condition.get("message")) else None

    condition = await eventually(told, within=60, what="the preemptor told about the budget")
    # The dry run's refusal (the RM named no budget): the Eviction API's own words.
    assert "evicting victim" in condition["message"], condition
    assert "is refused" in condition["message"], condition
    assert "nothing was evicted" in condition["message"], condition
    assert await pool.existing([name for name, *_ in layout]) == [name for name, *_ in layout]
    assert pool.preemptions("victim_evicted") == 0
    assert pool.preemptions("confirmed") == 0


@pytest.fixture
async def budget_blind_pool(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    bindery: Bindery,
    tmp_path: pathlib.Path,
) -> AsyncIterator[Pool]:
    """A pool whose RM may read nodes and pods but not PodDisruptionBudgets: it proposes victims as
    if no budget existed, as an RM that does not follow budgets would."""
    user = f"blind-rm-{uuid.uuid4().hex[:8]}"
    rbac = client.RbacAuthorizationV1Api(kube_api)
    reads = [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}]
    await rbac.create_cluster_role(body={"metadata": {"name": user}, "rules": reads})
    await rbac.create_cluster_role_binding(
        body={
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )
    try:
        async with pool_of(
            controlplane=controlplane,
            api=kube_api,
            namespace=namespace,
            directory=tmp_path / "rm",
            operator=bindery,
            kubeconfig=controlplane.mint_kubeconfig(user=user),
        ) as staged:
            yield staged
    finally:
        await rbac.delete_cluster_role_binding(name=user)
        await rbac.delete_cluster_role(name=user)


async def test_two_victims_under_a_budget_allowing_one_disruption_evict_nothing(
    budget_blind_pool: Pool,
) -> None:
    """Each victim's dry run passes alone (the budget allows one disruption), but the plan needs both:
    the real eviction of the second would be refused after the first was evicted for nothing. Bindery
    counts the plan's victims per budget before evicting anything, and names the budget. The RM here
    cannot read budgets, so the plan does not say the budget is exceeded."""
    pool = budget_blind_pool
    first, second = pool.nodes
    layout = (
        ("a", first, "low", "yes"),
        ("b", first, "low", "yes"),
        ("c", second, "high", "no"),
        ("d", second, "high", "no"),
    )
    for name, node, priority_class, kept in layout:
        await pool.place(name, node, priority_class=priority_class, labels={"kept": kept})
    await client.PolicyV1Api(pool.api).create_namespaced_pod_disruption_budget(
        namespace=pool.namespace,
        body={
            "metadata": {"name": "one-at-a-time"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"kept": "yes"}}},
        },
    )
    # No disruption controller on this plane: its status, as one would compute it.
    await client.PolicyV1Api(pool.api).patch_namespaced_pod_disruption_budget_status(
        name="one-at-a-time",
        namespace=pool.namespace,
        body={
            "status": {
                "observedGeneration": 1,
                "disruptionsAllowed": 1,
                "currentHealthy": 2,
                "desiredHealthy": 1,
                "expectedPods": 2,
            }
        },
    )
    await pool.create("high", priority_class="high", cpu="4")

    async def told() -> dict[str, Any] | None:
        condition = await pool.scheduled_condition("high")
        return condition if "is not possible" in str(condition.get("message")) else None

    condition = await eventually(told, within=60, what="the preemptor told why it preempts nothing")
    assert "nothing was evicted" in condition["message"], condition
    assert f"{pool.namespace}/one-at-a-time" in condition["message"], condition
    assert await pool.existing([name for name, *_ in layout]) == [name for name, *_ in layout]
    assert pool.preemptions("victim_evicted") == 0
    assert pool.preemptions("confirmed") == 0


async def test_a_pdb_refusing_the_eviction_cancels_the_plan_and_evicts_nothing(pool: Pool) -> None:
    """Every low pod, Running, is covered by a PodDisruptionBudget: the Eviction API would answer 429
    (here because no disruption controller has computed its status; in a full cluster because it
    allows no disruption). The RM, following budgets, names it in the plan, and Bindery refuses the
    plan before marking or evicting anyone."""
    placed = await pool.fill()
    # The Eviction API ignores PDBs for Pending pods, and with no kubelet here every pod is Pending.
    for name in placed:
        await client.CoreV1Api(pool.api).patch_namespaced_pod_status(
            name=name,
            namespace=pool.namespace,
            body={"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        )
    await client.PolicyV1Api(pool.api).create_namespaced_pod_disruption_budget(
        namespace=pool.namespace,
        body={
            "metadata": {"name": "keep-low"},
            "spec": {"minAvailable": 4, "selector": {"matchLabels": {"tier": "low"}}},
        },
    )
    created = await pool.create("high", priority_class="high")
    uid = created["metadata"]["uid"]
    await eventually(
        lambda: pool.rm_said("cancelled plan"), within=30, what="the plan cancelled after the 429"
    )
    assert await pool.rm_said(f"(pod uid {uid}, node")
    assert await pool.existing(list(placed)) == list(placed)
    assert await pool.node_of("high") is None
    assert pool.preemptions("cancelled") >= 1
    assert pool.preemptions("victim_evicted") == 0
    assert pool.preemptions("confirmed") == 0
    targets = []
    for name in placed:  # refused before anything: no pod was marked a disruption target
        pod = await read_pod(pool.api, namespace=pool.namespace, name=name)
        targets += [c for c in pod["status"].get("conditions") or () if c["type"] == "DisruptionTarget"]
    assert targets == []


async def test_a_preemptor_blocked_by_a_pdb_backs_off_instead_of_looping(pool: Pool) -> None:
    """Issue 21: "No loops: repeated failures back off." Every plan for the preemptor needs a
    protected victim, so each is refused. A node changes every half second meanwhile (each change
    retries parked pods, as a busy cluster does). The plans the RM proposes for the preemptor grow
    like PREEMPTION_BACKOFF (at t0, t0+10 s, t0+30 s, ...), not with the events; the bound allows
    one more plan than that schedule, for the time between a plan and this test seeing it."""
    placed = await pool.fill()
    for name in placed:
        await client.CoreV1Api(pool.api).patch_namespaced_pod_status(
            name=name,
            namespace=pool.namespace,
            body={"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        )
    await pool.budget("keep-low", selector={"tier": "low"}, min_available=4)
    churn = f"pe-{pool.token}-churn"
    await create_node(pool.api, name=churn, capacity={"cpu": "1", "pods": "10"}, labels={"churn": "0"})
    try:
        uid = (await pool.create("high", priority_class="high"))["metadata"]["uid"]

        def plans() -> set[str]:
            pattern = re.compile(rf"plan (pln-[0-9a-f]+) for pod {re.escape(uid)}:")
            return set(pattern.findall(pool.rm.log_path.read_text(errors="replace")))

        async def at_least(count: int) -> bool | None:
            return len(plans()) >= count or None

        await eventually(lambda: at_least(1), within=60, what="the first plan")
        started = time.monotonic()
        step = 0
        while time.monotonic() - started < WINDOW_SECONDS:
            step += 1
            await client.CoreV1Api(pool.api).patch_node(
                name=churn, body={"metadata": {"labels": {"churn": str(step)}}}
            )
            await asyncio.sleep(0.5)
        elapsed = time.monotonic() - started
        proposed = len(plans())
        print(f"{proposed} plan(s) proposed for the preemptor in {elapsed:.1f} s of node events")
        delays = [PREEMPTION_BACKOFF.delay(attempts=n) for n in range(1, 20)]
        allowed = 1 + sum(1 for k in range(1, 20) if sum(delays[:k]) <= elapsed) + 1
        assert proposed <= allowed, (
            f"{proposed} plans proposed for the preemptor in {elapsed:.0f} s of node events; the "
            f"back-off allows {allowed}"
        )
        # It is not given up either: a new plan comes once the first back-off ends.
        await eventually(lambda: at_least(2), within=60, what="a plan after the back-off")
        assert await pool.existing(list(placed)) == list(placed)
        assert await pool.node_of("high") is None
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(pool.api).delete_node(name=churn)


async def test_two_preemptors_racing_for_the_room_one_victim_makes(pool: Pool) -> None:
    """Issue 21: two preemptors racing for one node. Node 0 holds one priority-10 pod and one of the
    preemptors' own priority (not a victim); node 1 two of their priority. Evicting the one victim
    makes room for one preemptor only. Both are created together: exactly one victim is evicted,
    one preemptor is bound where it was, the other stays Pending saying why, and no node is
    overcommitted (the room is held for the first: kubernetes/kubernetes#72124)."""
    first, second = pool.nodes
    layout = (
        ("victim", first, "low"),
        ("peer0", first, "high"),
        ("peer1", second, "high"),
        ("peer2", second, "high"),
    )
    for name, node, priority_class in layout:
        await pool.place(name, node, priority_class=priority_class, labels={})
    await asyncio.gather(*(pool.create(name, priority_class="high") for name in ("racer-a", "racer-b")))

    async def one_bound() -> list[str] | None:
        bound = [name for name in ("racer-a", "racer-b") if await pool.node_of(name) is not None]
        return bound or None

    (winner,) = await eventually(one_bound, within=60, what="one preemptor bound")
    loser = "racer-b" if winner == "racer-a" else "racer-a"
    assert await pool.node_of(winner) == first
    assert await pool.existing([name for name, *_ in layout]) == ["peer0", "peer1", "peer2"]

    async def told() -> dict[str, Any] | None:
        condition = await pool.scheduled_condition(loser)
        return condition if condition.get("status") == "False" and condition.get("message") else None

    condition = await eventually(told, within=30, what=f"{loser} told why it is pending")
    assert condition["reason"] == "Unschedulable", condition
    assert await pool.node_of(loser) is None
    assert pool.preemptions("victim_evicted") == 1
    # No node overcommitted: every bound pod of the pool asks 2 CPU, every node has 4.
    listed = await client.CoreV1Api(pool.api).list_namespaced_pod(namespace=pool.namespace)
    per_node: dict[str, int] = {}
    for pod in listed.items:
        if pod.spec.node_name in (first, second) and pod.metadata.deletion_timestamp is None:
            per_node[pod.spec.node_name] = per_node.get(pod.spec.node_name, 0) + 2
    assert per_node == {first: 4, second: 4}, per_node


@pytest.mark.parametrize("peers_on_the_other_node", [1, 2], ids=["a-single-pod-instead", "the-whole-gang"])
async def test_a_gang_victim_is_evicted_whole_or_not_at_all(pool: Pool, peers_on_the_other_node: int) -> None:
    """Issue 21: a gang victim. Node 0 holds a two-member pod group of priority 10. With a single
    priority-10 pod on node 1, breaking the gang would need one victim either way; the gang is one
    candidate of two, so the single pod is evicted and the gang keeps both members. With node 1
    full of the preemptor's own priority, the whole gang goes, never one member."""
    first, second = pool.nodes
    gang = {"schedulingGroup": {"podGroupName": "gang"}}
    await pool.place("g0", first, priority_class="low", labels={}, **gang)
    await pool.place("g1", first, priority_class="low", labels={}, **gang)
    await pool.place("peer0", second, priority_class="high", labels={})
    if peers_on_the_other_node == 1:
        await pool.place("single", second, priority_class="low", labels={})
    else:
        await pool.place("peer1", second, priority_class="high", labels={})
    await pool.create("high", priority_class="high")
    node = await eventually(lambda: pool.node_of("high"), within=60, what="the preemptor bound")
    left = await pool.existing(["g0", "g1", "single"])
    if peers_on_the_other_node == 1:
        assert (node, left) == (second, ["g0", "g1"])
        assert pool.preemptions("victim_evicted") == 1
    else:
        assert (node, left) == (first, [])
        assert pool.preemptions("victim_evicted") == 2


async def test_a_plan_evicting_the_pod_a_required_affinity_needs_is_refused_and_evicts_nothing(
    pool: Pool,
) -> None:
    """The preemptor's required pod affinity (hostname) needs the ``anchor`` pod, on node 0. Node 0
    is full: the anchor (priority 10) and a priority-50 pod; node 1 holds two pods of the
    preemptor's priority. The RM chooses victims by what they free, so its plan on node 0 gives the
    priority-50 pod back first and evicts the anchor: the preemptor's affinity would then exclude
    node 0, the room made for nothing. kube-scheduler runs its filters with the victims removed
    and preempts nothing here; so does Bindery: the plan is refused before anything is confirmed
    or evicted, and the preemptor is told why."""
    first, second = pool.nodes
    layout: tuple[tuple[str, str, str, dict[str, str]], ...] = (
        ("anchor", first, "low", {"app": "anchor"}),
        ("filler", first, "mid", {}),
        ("peer0", second, "high", {}),
        ("peer1", second, "high", {}),
    )
    for name, node, priority_class, labels in layout:
        await pool.place(name, node, priority_class=priority_class, labels=labels)
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "anchor"}}}
    await pool.create(
        "high",
        priority_class="high",
        affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
    )

    async def told() -> dict[str, Any] | None:
        condition = await pool.scheduled_condition("high")
        if "the plan's victims gone" in str(condition.get("message")):
            return condition
        left = await pool.existing([name for name, *_ in layout])
        assert "anchor" in left, f"the anchor was evicted; pods left {left}; the preemptor's {condition}"
        return None

    condition = await eventually(told, within=60, what="the preemptor told its plan breaks its affinity")
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable"), condition
    assert "pod affinity" in condition["message"], condition
    assert "nothing was evicted" in condition["message"], condition
    assert await pool.existing([name for name, *_ in layout]) == [name for name, *_ in layout]
    assert pool.preemptions("confirmed") == 0
    assert pool.preemptions("victim_evicted") == 0
    anchor = await read_pod(pool.api, namespace=pool.namespace, name="anchor")
    assert not [c for c in anchor["status"].get("conditions") or () if c["type"] == "DisruptionTarget"]
    assert await pool.node_of("high") is None


async def test_a_gang_preemptor_gets_room_on_several_nodes_and_every_member_is_bound(pool: Pool) -> None:
    """Issue 21, item 4: a gang preemptor. Both nodes are full of priority-10 pods (two of 2 CPU
    each); a priority-100000 pod group of three 2-CPU members needs 6 CPU, so victims on both nodes:
    three of the four low pods, not all of them. Checked from outside: every member bound, only three
    victims gone, no node holds more than its 4 CPU, and the RM holds no reservation beyond the
    bound pods' (nothing leaked by the plan or the group's reserve)."""
    placed = await pool.fill()
    custom = client.CustomObjectsApi(pool.api)
    await custom.create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", pool.namespace, "podgroups", pod_group("train", min_count=3)
    )
    members = [f"train-{i}" for i in range(3)]
    for name in members:
        await pool.create(
            name, priority_class="high", labels={"gang": "train"}, schedulingGroup={"podGroupName": "train"}
        )

    async def all_bound() -> dict[str, str] | None:
        nodes = {name: await pool.node_of(name) for name in members}
        return {n: node for n, node in nodes.items() if node} if all(nodes.values()) else None

    bound = await eventually(all_bound, within=90, what="every member of the gang preemptor bound")
    assert len(set(bound.values())) == 2, f"three 2-CPU members need both nodes: {bound}"
    left = await pool.existing(list(placed))
    assert len(left) == 1, f"expected three victims evicted, {len(left)} low pods left: {left}"
    listed = await client.CoreV1Api(pool.api).list_namespaced_pod(namespace=pool.namespace)
    per_node: dict[str, int] = {}
    for pod in listed.items:
        if pod.spec.node_name and pod.metadata.deletion_timestamp is None:
            per_node[pod.spec.node_name] = per_node.get(pod.spec.node_name, 0) + 2
    assert all(cpu <= 4 for cpu in per_node.values()), per_node
    uids = {pod.metadata.uid for pod in listed.items if pod.spec.node_name}

    async def no_leak() -> list[str] | None:
        held = await pool.rm.reservations()
        stray = [
            f"{r.pod_uid} {r.state.value}"
            for r in held
            if r.pod_uid not in uids or r.state.value != "committed"
        ]
        return None if stray else [r.id for r in held]

    await eventually(no_leak, within=30, what="the RM holding only the bound pods' reservations")
    member_uids = {pod.metadata.uid for pod in listed.items if pod.metadata.name in members}
    for victim in set(placed) - set(left):  # kube-scheduler's event, naming a member and the victim's node
        events = await events_of(pool.api, namespace=pool.namespace, pod_name=victim)
        notes = [str(e.get("note")) for e in events if e.get("reason") == "Preempted"]
        assert len(notes) == 1, events
        by, _, node = notes[0].removeprefix("Preempted by pod ").partition(" on node ")
        assert (by in member_uids, node) == (True, placed[victim]), notes
    for name in members:
        pod = await read_pod(pool.api, namespace=pool.namespace, name=name)
        assert not pod["status"].get("nominatedNodeName"), pod["status"]


async def test_a_gang_preemptor_whose_plan_needs_protected_victims_evicts_nothing_and_each_member_is_told(
    pool: Pool,
) -> None:
    """The gang's refusal path is the pod's: both nodes hold two priority-50 pods a budget protects
    (it allows no disruption), so the group's plan can only name protected victims. Nothing is
    evicted, no pod is made a disruption target, and every member's FailedScheduling event names the
    budget and says nothing was evicted for it."""
    first, second = pool.nodes
    layout = [(f"kept-{i}", node) for i, node in enumerate((first, first, second, second))]
    for name, node in layout:
        await pool.place(name, node, priority_class="mid", labels={"kept": "yes"})
    await pool.budget("keep-mid", selector={"kept": "yes"}, min_available=4)
    custom = client.CustomObjectsApi(pool.api)
    await custom.create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", pool.namespace, "podgroups", pod_group("train", min_count=2)
    )
    members = [f"train-{i}" for i in range(2)]
    for name in members:
        await pool.create(
            name, priority_class="high", labels={"gang": "train"}, schedulingGroup={"podGroupName": "train"}
        )

    async def told(name: str) -> list[str] | None:
        events = await events_of(pool.api, namespace=pool.namespace, pod_name=name)
        notes = [str(e.get("note")) for e in events if e.get("reason") == "FailedScheduling"]
        return [n for n in notes if "keep-mid" in n and "nothing was evicted" in n] or None

    for name in members:
        await eventually(
            functools.partial(told, name), within=60, what=f"member {name} told about the budget"
        )
    # The group backs off as a whole, under its own key: the queue view shows it for each member.
    assert pool.operator is not None
    runtime = pool.operator.runtime
    view = QueueView(
        runners=lambda: runtime.runners, pods=runtime.pods, leading=lambda: True, served=lambda _: True
    )

    async def backed_off() -> dict[str, Any] | None:
        served = view.pod(namespace=pool.namespace, name=members[0])[1]
        return served if "preemption_backoff" in served else None

    served = await eventually(backed_off, within=30, what="the group's back-off in a member's queue view")
    assert served["preemption_group"] == f"{pool.namespace}/train", served
    assert "keep-mid" in served["preemption_backoff"]["reason"], served
    names = [name for name, _ in layout]
    assert await pool.existing(names) == names
    assert pool.preemptions("victim_evicted") == 0
    assert pool.preemptions("confirmed") == 0
    for name in names:
        pod = await read_pod(pool.api, namespace=pool.namespace, name=name)
        assert not [c for c in pod["status"].get("conditions") or () if c["type"] == "DisruptionTarget"], pod
    for name in members:
        assert await pool.node_of(name) is None
        pod = await read_pod(pool.api, namespace=pool.namespace, name=name)
        assert not pod["status"].get("nominatedNodeName"), pod["status"]


async def test_a_gang_preemptor_evicts_a_gang_spread_over_nodes_whole(pool: Pool) -> None:
    """Gangs are preempted as a whole, also across nodes: a priority-10 gang has a member on each
    node, beside a priority-50 pod on each. A priority-100000 group of two 2-CPU members needs a
    slot on each node: the whole low gang goes (both nodes), the priority-50 pods stay, and each
    member is bound on its own node."""
    first, second = pool.nodes
    gang = {"schedulingGroup": {"podGroupName": "low-gang"}}
    await pool.place("g0", first, priority_class="low", labels={}, **gang)
    await pool.place("g1", second, priority_class="low", labels={}, **gang)
    await pool.place("mid0", first, priority_class="mid", labels={})
    await pool.place("mid1", second, priority_class="mid", labels={})
    custom = client.CustomObjectsApi(pool.api)
    await custom.create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", pool.namespace, "podgroups", pod_group("train", min_count=2)
    )
    members = [f"train-{i}" for i in range(2)]
    for name in members:
        await pool.create(
            name, priority_class="high", labels={"gang": "train"}, schedulingGroup={"podGroupName": "train"}
        )

    async def all_bound() -> dict[str, str] | None:
        nodes = {name: await pool.node_of(name) for name in members}
        return {n: node for n, node in nodes.items() if node} if all(nodes.values()) else None

    bound = await eventually(all_bound, within=60, what="both members of the gang preemptor bound")
    assert sorted(bound.values()) == sorted([first, second]), bound
    assert await pool.existing(["g0", "g1", "mid0", "mid1"]) == ["mid0", "mid1"]
    assert pool.preemptions("victim_evicted") == 2


#: A finalizer the plan test puts on its victims so that they stay Terminating until it lifts it
#: (this plane has no kubelet; a grace period would keep them forever).
HOLD = "bindery.dev/test-hold"


async def test_explain_shows_a_pending_plan_and_its_victim_while_the_victim_terminates(pool: Pool) -> None:
    """Issue 21, item 5: while the victims terminate, the plan lives only in the operator's memory
    and the RM's database; the queue view (what /debug/queue serves, what `bindery explain` reads)
    shows its id, node, victims, what it waits for and its lease end."""
    placed = await pool.fill()
    core = client.CoreV1Api(pool.api)
    for name in placed:
        await core.patch_namespaced_pod(
            name=name, namespace=pool.namespace, body={"metadata": {"finalizers": [HOLD]}}
        )
    assert pool.operator is not None
    runtime = pool.operator.runtime
    view = QueueView(
        runners=lambda: runtime.runners, pods=runtime.pods, leading=lambda: True, served=lambda _: True
    )
    try:
        await pool.create("high", priority_class="high")

        async def waiting() -> dict[str, Any] | None:
            status, served = view.pod(namespace=pool.namespace, name="high")
            plan = served.get("preemption_plan") if status == 200 else None
            terminating = plan is not None and any(v["state"] == "terminating" for v in plan["victims"])
            return served if terminating else None

        served = await eventually(waiting, within=60, what="the pending plan and its terminating victim")
        plan = served["preemption_plan"]
        (victim,) = plan["victims"]
        namespace, _, name = victim["pod"].partition("/")
        assert (namespace, placed[name]) == (pool.namespace, plan["node"]), (plan, placed)
        body = await read_pod(pool.api, namespace=pool.namespace, name=name)
        assert body["metadata"].get("deletionTimestamp"), body["metadata"]
        assert plan["waits_for"] == "victims", plan
        assert plan["lease_until"], plan
        said = preemption_plan(served)
        assert said is not None
        assert f"plan {plan['id']} on node {plan['node']}" in said, said
        assert f"{pool.namespace}/{name} (terminating)" in said, said
        assert "waits for its victims to terminate" in said, said
        assert await pool.node_of("high") is None  # the victim still holds its room
    finally:
        for name in await pool.existing(list(placed)):
            with contextlib.suppress(client.ApiException):
                await core.patch_namespaced_pod(
                    name=name, namespace=pool.namespace, body={"metadata": {"finalizers": None}}
                )
    await eventually(lambda: pool.node_of("high"), within=60, what="the preemptor bound once its victim left")
    status, served = view.pod(namespace=pool.namespace, name="high")
    assert status == 404 or "preemption_plan" not in served, served


async def test_a_spread_preemptor_evicts_the_two_low_pods_its_rule_needs_gone(pool: Pool) -> None:
    """Kubernetes' e2e "PodTopologySpread Preemption", in small: node 0 holds a high-priority pod
    (0.9 of the node), node 1 three low-priority ones (0.3 each). The medium pod (0.3, spread by
    hostname with maxSkew 1 over the pods of the label) does not fit node 0 (whose only pod is of
    higher priority), and its spread excludes node 1 until two low pods are gone; room alone needs
    one. The RM chooses victims by room, so Bindery names the two pods the rule needs gone
    (contract v1.2 ``rulePreemption``): two are evicted, the third stays, and medium is bound."""
    first, second = pool.nodes
    label = {"pts": ""}
    await pool.place("high", first, priority_class="high", labels=label, cpu="3600m")
    lows = [f"low-{i}" for i in range(3)]
    for name in lows:
        await pool.place(name, second, priority_class="low", labels=label, cpu="1200m")
    spread = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchExpressions": [{"key": "pts", "operator": "Exists"}]},
    }
    await pool.create(
        "medium", priority_class="mid", labels=label, cpu="1200m", topologySpreadConstraints=[spread]
    )
    node = await eventually(lambda: pool.node_of("medium"), within=90, what="the spread preemptor bound")
    assert node == second
    left = await pool.existing(lows)
    assert len(left) == 1, f"expected two low pods evicted for the spread, left: {left}"
    assert await pool.node_of("high") == first
    assert pool.preemptions("victim_evicted") == 2


async def test_an_anti_affinity_preemptor_excluded_from_every_node_evicts_the_pod_its_rule_forbids(
    pool: Pool,
) -> None:
    """Each node holds one low-priority pod the preemptor's required anti-affinity (by hostname)
    forbids, and room for it beside: its rule excludes every node, so it used to be refused before
    any reserve. Now it names, per node, the one pod its rule needs gone; one is evicted, the other
    stays, and it is bound where its victim was."""
    first, second = pool.nodes
    for name, node in (("x0", first), ("x1", second)):
        await pool.place(name, node, priority_class="low", labels={"app": "x"}, cpu="1")
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}
    await pool.create(
        "high",
        priority_class="high",
        cpu="1",
        affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
    )
    node = await eventually(lambda: pool.node_of("high"), within=90, what="the anti-affinity preemptor bound")
    left = await pool.existing(["x0", "x1"])
    assert len(left) == 1, left
    assert await pool.node_of(left[0]) != node
    assert pool.preemptions("victim_evicted") == 1
