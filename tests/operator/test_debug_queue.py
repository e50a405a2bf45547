"""Where the operator serves /debug/queue, and to whom (issue 20, scenario 9).

The view says which pods of every tenant wait and when they are tried next. It used to be served
beside /metrics on every interface the metrics address named (the chart's 0.0.0.0:9090), to anyone
who reached the port. Now it listens on loopback only, unless the operator is given an address for
it explicitly (`bindery run --debug-addr`), and wherever it listens it answers only a bearer token
the apiserver accepts (TokenReview) of a user RBAC lets get the URL (SubjectAccessReview).
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from kubernetes_asyncio import client

from bindery.adapters.access import AccessReviewer, bearer_token
from bindery.controller.metrics import debug_queue_placement, is_loopback
from bindery.controller.startup.entry import EmbeddedOperator
from bindery.controller.startup.options import OperatorOptions
from bindery.devcluster.plane import ControlPlane
from tests.conftest import api_client_for
from tests.operator.conftest import Stage, eventually


def test_the_queue_views_stay_on_loopback_unless_given_an_address_of_their_own() -> None:
    assert debug_queue_placement(metrics_address="0.0.0.0:9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address=":9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="[::]:9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="10.0.0.7:9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="metrics.example:9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="127.0.0.1:9090", debug_address=None) == "metrics"
    assert debug_queue_placement(metrics_address="[::1]:9090", debug_address=None) == "metrics"
    assert debug_queue_placement(metrics_address="localhost:9090", debug_address=None) == "metrics"
    assert debug_queue_placement(metrics_address=None, debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="0.0.0.0:9090", debug_address="0.0.0.0:9091") == "own"
    assert is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0")


def test_only_a_bearer_header_carries_a_token() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token(None) is None
    assert bearer_token("Bearer ") is None
    assert bearer_token("Basic dXNlcjpwYXNz") is None


@pytest.fixture
async def exposed(operator_kubeconfig: pathlib.Path) -> AsyncIterator[EmbeddedOperator]:
    """Metrics on every interface, as the chart runs it; the queue views on a loopback port of their own."""
    operator = EmbeddedOperator(
        options=OperatorOptions(
            kubeconfig=operator_kubeconfig,
            probe_interval=2.0,
            metrics_address="0.0.0.0:0",
            debug_address="127.0.0.1:0",
        )
    )
    await operator.start()
    try:
        yield operator
    finally:
        await operator.stop()


async def test_metrics_on_every_interface_do_not_carry_the_queue_views(exposed: EmbeddedOperator) -> None:
    metrics, debug = exposed.runtime.metrics_server, exposed.runtime.debug_server
    assert metrics is not None
    assert debug is not None
    async with httpx.AsyncClient() as http:
        scraped = await http.get(f"http://127.0.0.1:{metrics.port}/metrics")
        on_metrics = await http.get(f"http://127.0.0.1:{metrics.port}/debug/queue")
        on_metrics_pod = await http.get(f"http://127.0.0.1:{metrics.port}/debug/queue/default/p")
        own = await http.get(f"http://127.0.0.1:{debug.port}/debug/queue")
        own_metrics = await http.get(f"http://127.0.0.1:{debug.port}/metrics")
    assert scraped.status_code == 200
    assert (on_metrics.status_code, on_metrics_pod.status_code) == (404, 404)  # no such route there
    assert own.status_code == 401  # served there, to a bearer token RBAC allows (tested below)
    assert own_metrics.status_code == 404  # the debug listener serves the views only


# Who may read the queue views (issue 20, item 8): only a bearer token the apiserver accepts, of a
# user RBAC lets `get` the URL. The ClusterRole is spelled out here as the docs tell users to write
# it (the chart's debug-reader), so the test holds the operator to what users are told.
READER_RULES = [{"nonResourceURLs": ["/debug/queue", "/debug/queue/*"], "verbs": ["get"]}]


async def _token(core: client.CoreV1Api, *, namespace: str, sa: str) -> str:
    """A fresh ServiceAccount and a token for it (TokenRequest, as `kubectl create token` does)."""
    await core.create_namespaced_service_account(namespace=namespace, body={"metadata": {"name": sa}})
    answer = await core.create_namespaced_service_account_token(
        name=sa, namespace=namespace, body={"spec": {"expirationSeconds": 3600}}
    )
    token: str = answer.status.token
    return token


async def _bind_reader(kube_api: client.ApiClient, *, role: str, namespace: str, sa: str) -> None:
    rbac = client.RbacAuthorizationV1Api(kube_api)
    await rbac.create_cluster_role(body={"metadata": {"name": role}, "rules": READER_RULES})
    await rbac.create_cluster_role_binding(
        body={
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
        }
    )


@pytest.mark.controlplane
async def test_the_queue_views_answer_only_a_token_rbac_allows(
    *,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    stage: Stage,
    uniq: Callable[[str], str],
) -> None:
    namespace = stage.namespace
    core = client.CoreV1Api(kube_api)
    reader = await _token(core, namespace=namespace, sa="reader")
    stranger = await _token(core, namespace=namespace, sa="stranger")
    role = uniq("debug-reader")
    await _bind_reader(kube_api, role=role, namespace=namespace, sa="reader")
    stage.rm.slots[stage.node] = 0  # the pod waits in the queue
    operator = EmbeddedOperator(
        options=OperatorOptions(
            kubeconfig=operator_kubeconfig, probe_interval=2.0, debug_address="127.0.0.1:0"
        )
    )
    await operator.start()
    try:
        debug = operator.runtime.debug_server
        assert debug is not None
        base = f"http://127.0.0.1:{debug.port}/debug/queue"
        pod_url = f"{base}/{namespace}/waiting"
        async with stage.served(), httpx.AsyncClient(timeout=10) as http:
            uid = (await stage.create("waiting"))["metadata"]["uid"]

            async def queued() -> httpx.Response | None:
                answer = await http.get(pod_url, headers={"Authorization": f"Bearer {reader}"})
                return answer if answer.status_code == 200 else None

            allowed = await eventually(queued, within=30, what="the pod in the operator's queue")
            summary = await http.get(base, headers={"Authorization": f"Bearer {reader}"})
            anonymous = await http.get(pod_url)
            anonymous_summary = await http.get(base)
            bad = await http.get(pod_url, headers={"Authorization": "Bearer not-a-kubernetes-token"})
            other = await http.get(pod_url, headers={"Authorization": f"Bearer {stranger}"})
            before = dict(operator.runtime.access.reviews)
            for _ in range(50):  # a poller: its reviews come from the cache (a figure, not asserted)
                await http.get(pod_url, headers={"Authorization": f"Bearer {reader}"})
            print(
                f"\nreviews sent to the apiserver for 50 more authorized GETs: "
                f"{dict(operator.runtime.access.reviews)} (before them: {before})"
            )
    finally:
        await operator.stop()

    assert allowed.json()["resource_manager"] == stage.rm_name
    assert summary.status_code == 200
    assert stage.rm_name in summary.json()["resource_managers"]
    assert allowed.json()["uid"] == uid
    for refused in (anonymous, anonymous_summary, bad, other):
        # Nothing the operator knows: neither the pod's UID nor its resource manager nor the queues.
        assert uid not in refused.text
        assert stage.rm_name not in refused.text
        assert "resource_managers" not in refused.text
    for refused in (anonymous, anonymous_summary, bad):
        assert refused.status_code == 401, refused.text
        assert "kubectl create token" in refused.text  # says what to do
    assert "no Authorization: Bearer header" in anonymous.text
    assert "did not accept this bearer token" in bad.text
    assert other.status_code == 403, other.text
    assert f"system:serviceaccount:{namespace}:stranger" in other.text
    assert "kubectl create clusterrolebinding" in other.text


@pytest.mark.controlplane
async def test_review_answers_are_cached_briefly_in_a_bounded_table(
    *, operator_api: client.ApiClient, kube_api: client.ApiClient, namespace: str, uniq: Callable[[str], str]
) -> None:
    """A scraper polling every second costs two reviews per TTL, not two per request; unknown tokens
    are remembered as such (negative answers too) and cannot grow the table past its bound."""
    core = client.CoreV1Api(kube_api)
    reader = await _token(core, namespace=namespace, sa="reader")
    await _bind_reader(kube_api, role=uniq("debug-reader"), namespace=namespace, sa="reader")
    now = [0.0]
    access = AccessReviewer(api=lambda: operator_api, ttl=10.0, size=2, clock=lambda: now[0])
    header = f"Bearer {reader}"
    for _ in range(5):
        assert (await access.check(authorization=header, path="/debug/queue")).status == 200
    assert access.reviews == {"TokenReview": 1, "SubjectAccessReview": 1}
    for _ in range(3):
        assert (await access.check(authorization="Bearer bogus", path="/debug/queue")).status == 401
    assert access.reviews["TokenReview"] == 2  # the refusal was cached too
    now[0] = 11.0  # past the TTL: asked again
    assert (await access.check(authorization=header, path="/debug/queue")).status == 200
    assert access.reviews == {"TokenReview": 3, "SubjectAccessReview": 2}
    for n in range(5):
        await access.check(authorization=f"Bearer bogus-{n}", path="/debug/queue")
    assert access.cached() <= (2, 2)


@pytest.mark.controlplane
async def test_concurrent_first_requests_with_one_token_share_one_review(
    *, operator_api: client.ApiClient, kube_api: client.ApiClient, namespace: str, uniq: Callable[[str], str]
) -> None:
    """A dashboard opening 20 panels at once, or a caller retrying in parallel, sent 20 TokenReviews
    and 20 SubjectAccessReviews before the first answer was cached; the apiserver's cost must not
    grow with the requests in flight for one token."""
    core = client.CoreV1Api(kube_api)
    reader = await _token(core, namespace=namespace, sa="parallel")
    await _bind_reader(kube_api, role=uniq("debug-reader"), namespace=namespace, sa="parallel")
    access = AccessReviewer(api=lambda: operator_api)
    decisions = await asyncio.gather(
        *(access.check(authorization=f"Bearer {reader}", path="/debug/queue") for _ in range(20))
    )
    assert [d.status for d in decisions] == [200] * 20
    assert access.reviews == {"TokenReview": 1, "SubjectAccessReview": 1}
    refusals = await asyncio.gather(
        *(access.check(authorization="Bearer made-up", path="/debug/queue") for _ in range(10))
    )
    assert {d.status for d in refusals} == {401}
    assert access.reviews["TokenReview"] == 2


@pytest.mark.controlplane
async def test_an_operator_that_may_not_review_tokens_says_so_and_caches_nothing(
    *, controlplane: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    """An identity without create on tokenreviews (an old ClusterRole): 503 naming the missing
    permission, never a 200, and the failure is not cached (it is asked again next time)."""
    reader = await _token(client.CoreV1Api(kube_api), namespace=namespace, sa="reader")
    api = await api_client_for(str(controlplane.mint_kubeconfig(user=f"no-reviews-{namespace}")))
    try:
        access = AccessReviewer(api=lambda: api)
        first = await access.check(authorization=f"Bearer {reader}", path="/debug/queue")
        second = await access.check(authorization=f"Bearer {reader}", path="/debug/queue")
    finally:
        await api.close()
    assert first.status == second.status == 503
    assert "needs create on tokenreviews.authentication.k8s.io" in first.message
    assert access.reviews["TokenReview"] == 2
    assert access.cached() == (0, 0)
