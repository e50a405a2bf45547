"""Two `bindery run --leader-elect` processes and the reference RM as its own process: what a
leader's crash or freeze does to the pods being scheduled.

- SIGKILL of the leader mid-burst: the standby takes over after the lease, binds the rest, and
  every pod ends up bound exactly once with its reservation committed there. The time from the
  kill to the standby's first Binding is printed (the figure the issue asks for).
- SIGSTOP of the leader for longer than the lease, then SIGCONT: the standby took over meanwhile;
  the old leader, on waking, starts no Binding and none it sends binds anything (counted by an API
  proxy in front of it, so the count does not depend on the process's own reporting), and nothing is
  bound twice or on a released reservation. A Binding whose write was under way in the very step
  the process froze in still goes out on waking: no process can fence its own next instruction (CI
  saw one, 1 run in 3); the apiserver refuses it (409), since the standby bound that pod.
- The leader's lease calls hang (a proxy holds every coordination.k8s.io request unanswered, the
  rest of its traffic flows): it must stop binding at its renew deadline, before the standby may
  take over, instead of waiting forever on a call without a timeout while it keeps binding.

Short lease timings (4 / 3 / 1 s) keep each test around a minute; the nodes are exactly full once
every pod is bound, so a reservation lost or held twice leaves a pod pending and fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import re
import signal
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from bindery.controller.startup.rbac import leader_election_rules
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from tests.conftest import OPERATOR_USER
from tests.operator.apiproxy import serve_api_proxy
from tests.operator.conftest import create_pod, delete_rm, eventually, pod_body
from tests.operator.fakerm import serve_app
from tests.realrm import OperatorProcess, RMProcess, serve_with, settled_invariants

pytestmark = pytest.mark.controlplane

LEASE, RENEW, RETRY = 4.0, 3.0, 1.0
TIMING_ARGS = [
    "--lease-duration",
    f"{LEASE:g}",
    "--renew-deadline",
    f"{RENEW:g}",
    "--retry-period",
    f"{RETRY:g}",
]
PODS = 60
NODES = 3
_BINDING_PATH = re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/binding$")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
_BINDINGS = re.compile(r'^bindery_apiserver_writes_total\{kind="binding"\} (\S+)$', re.MULTILINE)


async def binding_writes(metrics_url: str) -> int:
    """Binding POSTs the process has made (its own counter, scraped from /metrics)."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(metrics_url) as response,
    ):
        text = await response.text()
    match = _BINDINGS.search(text)
    return int(float(match.group(1))) if match else 0


async def grant_lease(api: client.ApiClient, *, namespace: str, lease_name: str | None) -> None:
    """The operator's user may use exactly this Lease (the Role the chart creates); None: every
    Lease of the namespace (a Lease per ResourceManager)."""
    rbac = client.RbacAuthorizationV1Api(api)
    role = f"bindery-lease-{lease_name or 'per-rm'}"
    await rbac.create_namespaced_role(
        namespace=namespace,
        body={"metadata": {"name": role}, "rules": leader_election_rules(lease_name=lease_name)},
    )
    await rbac.create_namespaced_role_binding(
        namespace=namespace,
        body={
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}],
        },
    )


class LeaseProxy:
    """What `lease_proxy` lets the test see and do: Binding POSTs (monotonic times) and held leases."""

    def __init__(self) -> None:
        self.url = ""
        self.hold_leases = False
        self.binding_posts: list[float] = []


@contextlib.asynccontextmanager
async def lease_proxy(*, plane: ControlPlane, user: str) -> AsyncIterator[LeaseProxy]:
    """A TLS proxy in front of the apiserver (as `user`) that can leave Lease calls unanswered.

    Everything else, watches included, is streamed through unchanged, so the operator behind it
    keeps watching and binding while its lease calls hang, as with a stuck connection.
    """
    proxy = LeaseProxy()
    pki = plane.workdir / "pki"
    upstream_tls = ssl.create_default_context(cafile=str(plane.ca_file))
    upstream_tls.load_cert_chain(str(pki / f"{user}.crt"), str(pki / f"{user}.key"))
    cert, key = plane.issue_serving_certificate(stem="lease-proxy")
    serving_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving_tls.load_cert_chain(str(cert), str(key))
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=upstream_tls),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
    )
    loop = asyncio.get_running_loop()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        while proxy.hold_leases and request.path.startswith("/apis/coordination.k8s.io/"):
            await asyncio.sleep(0.05)
        if request.method == "POST" and _BINDING_PATH.match(request.path):
            proxy.binding_posts.append(loop.time())
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with session.request(
            request.method, plane.server + request.path_qs, headers=headers, data=body or None
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", forward)
    try:
        async with serve_app(app, ssl_context=serving_tls, handler_cancellation=True) as port:
            proxy.url = f"https://127.0.0.1:{port}"
            yield proxy
    finally:
        await session.close()


class Cluster:
    """The pool of nodes, the reference RM process and its ResourceManager, for one test."""

    def __init__(self, *, api: client.ApiClient, namespace: str, rm: RMProcess, scheduler: str) -> None:
        self.api = api
        self.namespace = namespace
        self.rm = rm
        self.scheduler = scheduler

    async def create_pods(self, names: list[str]) -> None:
        for start in range(0, len(names), 10):
            await asyncio.gather(
                *(
                    create_pod(
                        self.api,
                        namespace=self.namespace,
                        body=pod_body(name=name, scheduler_name=self.scheduler, cpu="100m"),
                    )
                    for name in names[start : start + 10]
                )
            )

    async def pods(self) -> list[dict[str, Any]]:
        answer = await client.CoreV1Api(self.api).list_namespaced_pod(self.namespace, _preload_content=False)
        items: list[dict[str, Any]] = (await answer.json())["items"]
        return items

    async def bound(self) -> int:
        return len(await self.bound_names())

    async def bound_names(self) -> set[str]:
        return {
            pod["metadata"]["name"] for pod in await self.pods() if (pod.get("spec") or {}).get("nodeName")
        }

    async def all_bound(self, count: int) -> bool:
        return await self.bound() == count

    async def scheduled_events(self) -> dict[str, int]:
        """Scheduled events per pod name (events.k8s.io)."""
        answer = await client.EventsV1Api(self.api).list_namespaced_event(
            self.namespace, _preload_content=False
        )
        counts: dict[str, int] = {}
        for event in (await answer.json())["items"]:
            if event.get("reason") == "Scheduled":
                name = (event.get("regarding") or {}).get("name", "")
                counts[name] = counts.get(name, 0) + 1
        return counts


@contextlib.asynccontextmanager
async def cluster(
    *, controlplane: ControlPlane, api: client.ApiClient, namespace: str, tmp_path: pathlib.Path, pods: int
) -> AsyncIterator[Cluster]:
    """`NODES` nodes with room for exactly `pods` pods of 100m between them."""
    pool = uuid.uuid4().hex[:8]
    nodes = [f"lp-{pool}-{i}" for i in range(NODES)]
    for i, node in enumerate(nodes):
        slots = pods // NODES + (1 if i < pods % NODES else 0)
        await create_node(
            api,
            name=node,
            capacity={"cpu": f"{slots * 100}m", "memory": "64Gi", "pods": str(max(110, slots))},
            labels={"bindery.dev/test-pool": pool},
        )
    scheduler, rm_name = f"lp-{pool}", f"lp-{pool}"
    try:
        async with RMProcess(
            kubeconfig=controlplane.kubeconfig,
            directory=tmp_path / "rm",
            node_selector=f"bindery.dev/test-pool={pool}",
        ) as rm:
            await serve_with(api, rm=rm, name=rm_name, scheduler_names=[scheduler], namespace=namespace)
            yield Cluster(api=api, namespace=namespace, rm=rm, scheduler=scheduler)
    finally:
        await delete_rm(api, name=rm_name)
        for node in nodes:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(api).delete_node(name=node)


@contextlib.asynccontextmanager
async def replica(
    *, kubeconfig: pathlib.Path, directory: pathlib.Path, name: str, namespace: str, lease: str
) -> AsyncIterator[OperatorProcess]:
    args = ["--namespace", namespace, "--leader-elect", "--lease-namespace", namespace, "--lease-name", lease]
    process = OperatorProcess(
        kubeconfig=kubeconfig, directory=directory, args=[*args, *TIMING_ARGS], name=name
    )
    await process.start()
    try:
        yield process
    except BaseException:
        print(f"--- {name} log (tail) ---\n" + "\n".join(process.log().splitlines()[-60:]))
        raise
    finally:
        await process.stop()


async def _leader(*candidates: OperatorProcess) -> OperatorProcess:
    async def which() -> OperatorProcess | None:
        return next((c for c in candidates if "became the leader" in c.log()), None)

    leader: OperatorProcess = await eventually(which, within=60, what="a leader")
    return leader


async def test_sigkill_of_the_leader_mid_burst_the_standby_binds_the_rest_once(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
) -> None:
    lease = uniq("lease")
    await grant_lease(kube_api, namespace=namespace, lease_name=lease)
    names = [f"p{i:03d}" for i in range(PODS)]
    async with (
        cluster(
            controlplane=controlplane, api=kube_api, namespace=namespace, tmp_path=tmp_path, pods=PODS
        ) as pool,
        replica(
            kubeconfig=operator_kubeconfig, directory=tmp_path, name="first", namespace=namespace, lease=lease
        ) as first,
    ):
        await _leader(first)
        async with replica(
            kubeconfig=operator_kubeconfig,
            directory=tmp_path,
            name="second",
            namespace=namespace,
            lease=lease,
        ) as second:
            standby_metrics = await second.metrics_url()
            await first.metrics_url()
            await pool.create_pods(names[:30])
            await eventually(lambda: _at_least(pool, 5), within=60, what="the leader binding its first pods")
            loop = asyncio.get_running_loop()
            first.kill(signal.SIGKILL)
            killed_at = loop.time()
            bound_at_kill = await pool.bound_names()
            pending_at_kill = PODS - len(bound_at_kill)
            await pool.create_pods(names[30:])  # the burst goes on while nobody leads
            assert await binding_writes(standby_metrics) == 0

            async def standby_bound() -> bool:
                return await binding_writes(standby_metrics) > 0

            await eventually(standby_bound, within=60, interval=0.05, what="the standby's first Binding")
            took = loop.time() - killed_at
            print(
                f"\nstandby's first Binding {took:.2f} s after SIGKILL of the leader "
                f"(lease {LEASE:g} s, renew deadline {RENEW:g} s, retry period {RETRY:g} s; "
                f"{pending_at_kill} of {PODS} pods were not bound at the kill)"
            )
            assert "became the leader" in second.log()
            await eventually(lambda: pool.all_bound(PODS), within=90, what=f"all {PODS} pods bound")
            await settled_invariants(
                api=kube_api, rm=pool.rm, namespace=namespace, scheduler_names=[pool.scheduler], within=60
            )
            events = await pool.scheduled_events()
            assert all(count == 1 for count in events.values()), events
            # A pod whose Binding the leader sent before the kill may miss its event (as with
            # kube-scheduler): it was bound when the kill was read, or its Binding landed just after
            # and the standby's first reconcile pass committed it. Every pod the standby bound has
            # exactly one. (A count of at most 16 such pods held until a run where the kill caught
            # 25 Bindings of one burst in flight.)
            dead_leaders = bound_at_kill | set(
                re.findall(r"of pod [^/\s]+/(\S+) \(.*commit was lost", second.log())
            )
            missing = set(names) - set(events)
            assert missing <= dead_leaders, sorted(missing - dead_leaders)
            # The standby counts the lease from when it saw the last renewal (up to a retry period
            # after the leader wrote it) and looks every retry period: lease + 2 retry periods at
            # worst, plus its first cycle.
            assert took <= LEASE + 2 * RETRY + 1.0, f"the standby took {took:.2f} s to bind"


async def test_a_leader_frozen_past_its_lease_binds_nothing_when_it_wakes(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
) -> None:
    lease = uniq("lease")
    await grant_lease(kube_api, namespace=namespace, lease_name=lease)
    # The pods keep coming while the leader is frozen (created in the background, ten at a time):
    # created first and frozen after, they were all bound before the freeze (256 cycles in flight
    # bind as fast as the pods appear), and nothing was tested.
    burst = 10 * PODS
    names = [f"p{i:03d}" for i in range(burst)]
    async with (
        cluster(
            controlplane=controlplane, api=kube_api, namespace=namespace, tmp_path=tmp_path, pods=burst + 5
        ) as pool,
        serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as proxy,
    ):
        proxied = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=proxy.url
        )
        async with replica(
            kubeconfig=proxied, directory=tmp_path, name="frozen", namespace=namespace, lease=lease
        ) as frozen:
            await _leader(frozen)  # the proxied replica leads: its Bindings are counted by the proxy
            async with replica(
                kubeconfig=operator_kubeconfig,
                directory=tmp_path,
                name="standby",
                namespace=namespace,
                lease=lease,
            ) as standby:
                await standby.metrics_url()
                creating = asyncio.create_task(pool.create_pods(names))
                await eventually(
                    lambda: _at_least(pool, 5), within=60, what="the leader binding its first pods"
                )
                frozen.pause()
                pending_at_stop = burst - await pool.bound()
                await creating
                await standby.wait_for_log("became the leader", within=60)
                await eventually(lambda: pool.all_bound(burst), within=90, what=f"all {burst} pods bound")
                before_wake = len(proxy.bindings)
                frozen.resume()
                # Positive signal that the woken process had its chance: it reports the lost lease
                # (and exits), or at least logs that it stopped leading.
                await frozen.wait_for_log("stopped leading|exits|exiting", within=60)
                # ... and time went by with it awake: the standby binds more pods meanwhile.
                await pool.create_pods([f"q{i}" for i in range(5)])
                await eventually(
                    lambda: pool.all_bound(burst + 5), within=60, what="the pods after waking bound"
                )
                late = proxy.bindings[before_wake:]
                print(
                    f"\n{pending_at_stop} of {burst} pods were not bound when the leader froze; "
                    f"Bindings it sent after waking: {late}; still running: {frozen.running}"
                )
                # At most what was being written when it froze, and none of it applied.
                assert all(status == 409 for _, status in late), f"the woken leader bound pods: {late}"
                await settled_invariants(
                    api=kube_api, rm=pool.rm, namespace=namespace, scheduler_names=[pool.scheduler], within=60
                )
                events = await pool.scheduled_events()
                assert all(count == 1 for count in events.values()), events
                assert pending_at_stop > 0, "the burst was over before the freeze: nothing was tested"


async def _at_least(pool: Cluster, count: int) -> bool:
    return await pool.bound() >= count


async def test_a_leader_whose_lease_calls_hang_stops_binding_before_the_standby_takes_over(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
) -> None:
    lease = uniq("lease")
    await grant_lease(kube_api, namespace=namespace, lease_name=lease)
    async with (
        cluster(
            controlplane=controlplane, api=kube_api, namespace=namespace, tmp_path=tmp_path, pods=120
        ) as pool,
        lease_proxy(plane=controlplane, user=OPERATOR_USER) as proxy,
    ):
        behind = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "lease.kubeconfig", server=proxy.url
        )
        async with replica(
            kubeconfig=behind, directory=tmp_path, name="stuck", namespace=namespace, lease=lease
        ) as stuck:
            await _leader(stuck)
            async with replica(
                kubeconfig=operator_kubeconfig,
                directory=tmp_path,
                name="standby",
                namespace=namespace,
                lease=lease,
            ) as standby:
                await standby.metrics_url()
                await pool.create_pods([f"a{i:02d}" for i in range(10)])
                await eventually(
                    lambda: pool.all_bound(10), within=60, what="the first pods bound by the leader"
                )
                loop = asyncio.get_running_loop()
                proxy.hold_leases = True
                held_at = loop.time()
                # Pods keep coming while the leader's lease calls hang, until well after the standby
                # took over: the stuck leader must stop binding within its renew deadline, not go on
                # binding next to the new leader.
                created, led_at = 10, None
                while led_at is None or loop.time() < led_at + 3 * RETRY:
                    assert loop.time() < held_at + 60, "the standby never took over"
                    await pool.create_pods([f"b{created + i:03d}" for i in range(2)])
                    created += 2
                    if led_at is None and "became the leader" in standby.log():
                        led_at = loop.time()
                    await asyncio.sleep(0.4)
                await eventually(lambda: pool.all_bound(created), within=90, what=f"all {created} pods bound")
                late = [round(t - held_at, 2) for t in proxy.binding_posts if t > held_at + RENEW + 0.5]
                print(
                    f"\nBindings of the stuck leader after its lease calls hung: "
                    f"{[round(t - held_at, 2) for t in proxy.binding_posts if t > held_at]} s after the hang"
                )
                assert stuck.running or "exit" in stuck.log()
                assert late == [], f"the leader kept binding {late} s after its lease calls hung"
                await settled_invariants(
                    api=kube_api, rm=pool.rm, namespace=namespace, scheduler_names=[pool.scheduler], within=60
                )
