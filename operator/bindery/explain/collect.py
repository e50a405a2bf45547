"""Read what `bindery explain` joins: the pod, its events and claims, and its resource manager's view.

With the kubeconfig alone, read-only, like `bindery audit`: the ResourceManager objects and their
token Secrets are read as the operator reads them, so the RM is asked through the same endpoint and
credentials. What cannot be read is said in the answer, never silently left out.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import tempfile
import urllib.parse
from typing import Any

import httpx

from bindery.adapters.identity import ClusterIdentityError, cluster_identity
from bindery.adapters.placed import PlacedPodCache
from bindery.apiserver import ApiClient, ApiError, NotFound, get, list_all, resources
from bindery.apiserver.api import answer_of
from bindery.config import ConfigError, parse_resource_manager, route_scheduler_names
from bindery.controller.secrets import CredentialsError, reservations_at
from bindery.explain.facts import Explanation, GroupState, ReservationView, explain, group_state
from bindery.rm.errors import RMError
from bindery.scheduling.devices import pod_claims as device_claims
from bindery.scheduling.placementrules import rules_preferences, rules_verdict
from bindery.scheduling.podspec import PodInfo, PodSpecError, pod_claims
from bindery.scheduling.ports import NodeProjection

#: How `explain` finds the operator's metrics Service: the chart's labels and port name.
OPERATOR_SERVICE_SELECTOR = "app.kubernetes.io/part-of=bindery,app.kubernetes.io/component=operator"
OPERATOR_PORT_NAME = "metrics"
#: A Service spreads requests over the replicas, and only the leader's queue is the real one: ask
#: again a few times to meet it.
LEADER_TRIES = 6
OPERATOR_TIMEOUT = 10.0


class PodNotFound(LookupError):
    pass


@dataclasses.dataclass(frozen=True)
class OperatorAddress:
    """Where the operator serves /debug/queue: a URL (local runs), or a Service behind the apiserver's
    proxy (namespace, name, port name or number), or None: find the chart's Service."""

    url: str | None = None
    service: tuple[str, str, str] | None = None
    #: Bearer token sent to `url` (the operator checks it with the apiserver); the apiserver's proxy
    #: forwards no caller credentials, so a Service is asked without one.
    token: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def parse_service(cls, text: str) -> OperatorAddress:
        """`NAMESPACE/NAME[:PORT]` → an address; raises ValueError saying what is expected."""
        namespace, slash, rest = text.partition("/")
        name, _, port = rest.partition(":")
        if not slash or not namespace or not name:
            raise ValueError(
                f"--operator-service {text!r} is not NAMESPACE/NAME[:PORT], "
                "e.g. bindery-system/bindery-metrics:metrics"
            )
        return cls(service=(namespace, name, port or OPERATOR_PORT_NAME))


async def _read(
    api: ApiClient, resource: resources.Resource, *, namespace: str, name: str
) -> dict[str, Any] | None:
    """The object, or None if it does not exist."""
    try:
        return await get(api, resource, namespace=namespace, name=name)
    except NotFound:
        return None


async def explain_pod(
    *,
    api: ApiClient,
    namespace: str,
    name: str,
    operator: OperatorAddress | None = OperatorAddress(),
    cluster_id: str | None = None,
) -> Explanation:
    """`operator` None: do not ask the operator for the pod's queue position. `cluster_id` is the
    operator's (None: derived as the operator does); an RM of contract v1.2 is asked only for this
    cluster's reservations."""
    pod = await _read(api, resources.PODS, namespace=namespace, name=name)
    if pod is None:
        raise PodNotFound(f"pod {namespace}/{name} not found")
    uid = str(pod["metadata"].get("uid") or "")
    events = await list_all(
        api, resources.EVENTS, namespace=namespace, field_selector=f"involvedObject.uid={uid}"
    )
    claims = [
        (claim, await _read(api, resources.PVCS, namespace=namespace, name=claim))
        for claim in pod_claims(name=name, volumes=(pod.get("spec") or {}).get("volumes") or ())
    ]
    resolved = device_claims(pod)
    device_bodies = [
        (claim.name, await _read(api, resources.RESOURCE_CLAIMS, namespace=namespace, name=claim.name))
        for claim in (resolved if isinstance(resolved, tuple) else ())
    ]
    scheduler_name = str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")
    group, group_problem = await _group_of(api=api, pod=pod, namespace=namespace)
    configs = []
    for body in (await list_all(api, resources.RESOURCE_MANAGERS)).items:
        try:
            configs.append(parse_resource_manager(body=body))
        except ConfigError:
            continue  # an invalid one serves nothing (the operator skips it too)
    owner = route_scheduler_names(configs=configs).served.get(scheduler_name)
    config = next((c for c in configs if c.name == owner), None)
    reservations: list[ReservationView] | None = None
    problem = None
    queue: dict[str, Any] | None = None
    queue_problem: str | None = None
    if owner is not None and not (pod.get("spec") or {}).get("nodeName") and operator is not None:
        queue, queue_problem = await operator_queue(
            api=api, address=operator, namespace=namespace, name=name, uid=uid
        )
    if config is not None:
        try:
            cluster: str | None = await cluster_identity(api, configured=cluster_id)
        except ClusterIdentityError:
            cluster = None  # the pod's UID still picks its reservations out of every cluster's
        try:
            with tempfile.TemporaryDirectory(prefix="bindery-explain-") as directory:
                listed = await reservations_at(
                    api=api,
                    config=config,
                    directory=pathlib.Path(directory),
                    scheduler_name=scheduler_name,
                    cluster_id=cluster,
                )
            reservations = [
                ReservationView(
                    id=r.id,
                    state=r.state.value,
                    node=r.node,
                    expires_at=r.expires_at.isoformat() if r.expires_at else None,
                )
                for r in listed
                if r.pod_uid == uid
            ]
        except (CredentialsError, RMError, ValueError, OSError) as exc:
            problem = f"could not ask ResourceManager {config.name!r}: {exc}"
    rules, rules_problem = await placement_rules(api=api, pod=pod)
    answer = explain(
        pod=pod,
        resource_manager=owner,
        placement_rules=rules,
        events=events.items,
        reservations=reservations,
        claims=claims,
        device_claims=device_bodies,
        rm_problem=problem,
        queue=queue,
        queue_problem=queue_problem if operator is not None else "not asked (--no-operator)",
        group=group,
    )
    if group_problem is not None:
        answer.unseen.append(group_problem)
    if rules_problem is not None:
        answer.unseen.append(rules_problem)
    return answer


async def placement_rules(*, api: ApiClient, pod: dict[str, Any]) -> tuple[list[str], str | None]:
    """One line per inter-pod rule that shapes the pod's request (``zone spread allows zones a, c``),
    evaluated as the operator does, against the pods on nodes now (the pod itself not counted).

    Reads every node and every pod on a node: only for a pod with rules of its own, or a pending
    pod (whose placement other pods' anti-affinity may restrict).
    """
    try:
        info = PodInfo.from_body(pod)
    except PodSpecError:
        return [], None
    if not info.rules and (pod.get("spec") or {}).get("nodeName"):
        return [], None
    try:
        nodes = [NodeProjection.from_body(n) for n in (await list_all(api, resources.NODES)).items]
        placed = (await list_all(api, resources.PODS, field_selector="spec.nodeName!=")).items
        labels: dict[str, dict[str, str]] = {}
        soft_terms = (w.term for w in (*info.soft.affinity, *info.soft.anti_affinity))
        if any(
            t.namespace_selector is not None
            for t in (*info.rules.affinity, *info.rules.anti_affinity, *soft_terms)
        ):
            for namespace in (await list_all(api, resources.NAMESPACES)).items:
                metadata = namespace.get("metadata") or {}
                labels[str(metadata.get("name"))] = dict(metadata.get("labels") or {})
    except ApiError as exc:
        return [], f"the placement rules: could not read nodes, pods or namespaces: {exc}"
    cache = PlacedPodCache(nodes=lambda: nodes, namespace_labels=labels.get)
    for body in placed:
        cache.on_event("ADDED", body)
    verdict = rules_verdict(info, cache)
    lines = [] if verdict is None else [effect.summary for effect in verdict.effects]
    refusal = None if verdict is None else verdict.refusal()
    if refusal is not None:
        lines.append(f"no node is left: {refusal}")
    if not (pod.get("spec") or {}).get("nodeName"):
        # The soft rules' preferences as the next cycle would send them (a bound pod's are history).
        preferred = rules_preferences(info, cache, verdict)
        if preferred is not None and preferred.summary:
            lines.append(preferred.summary)
    return lines, None


async def _group_of(
    *, api: ApiClient, pod: dict[str, Any], namespace: str
) -> tuple[GroupState | None, str | None]:
    """The pod's group (PodGroup and members), or why it could not be read; (None, None) off a group."""
    name = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    if not name:
        return None, None
    podgroup: dict[str, Any] | None
    try:
        podgroup = await _read(api, resources.PODGROUPS, namespace=namespace, name=str(name))
    except ApiError as exc:
        return None, (
            f"pod group {name!r}: reading its PodGroup failed ({exc.status} {exc.reason or exc.message}); "
            "explain needs get on podgroups.scheduling.k8s.io"
        )
    try:
        pods = await list_all(api, resources.PODS, namespace=namespace)
    except ApiError as exc:
        return None, (
            f"pod group {name!r}: listing the namespace's pods to count its members failed "
            f"({exc.status} {exc.reason or exc.message}); explain needs list on pods"
        )
    return group_state(name=str(name), podgroup=podgroup, pods=pods.items), None


async def operator_queue(
    *, api: ApiClient, address: OperatorAddress, namespace: str, name: str, uid: str
) -> tuple[dict[str, Any] | None, str | None]:
    """The operator's view of the pod's place in its queue, and what kept us from seeing it (if so).

    A 404 from the operator is an answer (the pod is in no queue); a standby's answer is kept only
    when no leader answered.
    """
    pod_path = f"debug/queue/{urllib.parse.quote(namespace)}/{urllib.parse.quote(name)}"
    if address.url is not None:
        url = f"{address.url.rstrip('/')}/{pod_path}"
        headers = {"Authorization": f"Bearer {address.token}"} if address.token else {}
        try:
            async with httpx.AsyncClient(timeout=OPERATOR_TIMEOUT) as http:
                response = await http.get(url, params={"uid": uid}, headers=headers)
        except httpx.HTTPError as exc:
            return None, f"the operator at {address.url} did not answer: {exc or type(exc).__name__}"
        if response.status_code in (401, 403):  # the operator's own refusal says what to do
            text = response.text.strip()
            hint = "" if address.token else " (pass --operator-token-file)"
            return (
                None,
                f"the operator at {address.url} refused us (HTTP {response.status_code}){hint}: {text}",
            )
        return _queue_answer(response.status_code, response.content, where=address.url)
    if address.service is not None:
        services = [address.service]
    else:
        services, refused = await _operator_services(api)
        if not services:
            return None, (
                (refused or "found no operator Service")
                + f" (labels {OPERATOR_SERVICE_SELECTOR}, a port named {OPERATOR_PORT_NAME!r}); pass "
                "--operator-service NAMESPACE/NAME:PORT or --operator-url"
            )
    standby: dict[str, Any] | None = None
    problems = []
    for service_namespace, service, port in services:
        where = f"service {service_namespace}/{service}:{port}"
        path = f"/api/v1/namespaces/{service_namespace}/services/{service}:{port}/proxy/{pod_path}"
        for _ in range(LEADER_TRIES):
            try:
                status, body = await answer_of(
                    api, "GET", path, query={"uid": uid}, request_timeout=OPERATOR_TIMEOUT
                )
            except Exception as exc:  # no route, a timeout: say which and move on
                problems.append(f"{where} through the apiserver's proxy: {exc or type(exc).__name__}")
                break
            answer, problem = _queue_answer(status, body, where=f"{where} (through the apiserver's proxy)")
            if answer is None:
                problems.append(problem or where)
                break
            if answer.get("leading"):
                return answer, None
            standby = answer
    if standby is not None:
        return standby, "only a standby replica answered: its queue shows no attempts (the leader's does)"
    return None, "; ".join(problems)


async def _operator_services(api: ApiClient) -> tuple[list[tuple[str, str, str]], str | None]:
    """The chart's operator Services (namespace, name, port name), or why they could not be listed."""
    try:
        listed = await list_all(
            api,
            resources.SERVICES,
            label_selector=OPERATOR_SERVICE_SELECTOR,
            request_timeout=OPERATOR_TIMEOUT,
        )
    except ApiError as exc:  # e.g. no permission to list Services in every namespace
        return [], (
            f"could not list Services to find the operator's (HTTP {exc.status} {exc.reason or exc.message})"
        )
    found = [
        (str(svc["metadata"]["namespace"]), str(svc["metadata"]["name"]), OPERATOR_PORT_NAME)
        for svc in listed.items
        if any(port.get("name") == OPERATOR_PORT_NAME for port in (svc.get("spec") or {}).get("ports") or ())
    ]
    return found, None


def _queue_answer(status: int, body: bytes, *, where: str) -> tuple[dict[str, Any] | None, str | None]:
    """Pure: an HTTP answer of /debug/queue/NS/NAME → (the view, or None and why not)."""
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if status in (200, 404) and isinstance(document, dict) and "pod" in document:
        return document, None  # the operator's answer (a 404 says the pod is in no queue)
    if isinstance(document, dict) and document.get("kind") == "Status":  # the apiserver's own answer
        text = str(document.get("message") or document.get("reason") or "")
        return None, f"{where}: the apiserver answered HTTP {status}: {text}"
    text = body[:200].decode("utf-8", "replace").strip()
    if status == 403:
        return None, f"{where} refused us (HTTP 403: {text}); reading it needs get on services/proxy"
    if status == 503:
        return None, f"{where} is not reachable (HTTP 503: {text}): is the operator running and ready?"
    if status == 404:  # the operator's own 404 is JSON (above): this port does not serve the views
        return None, (
            f"{where} does not serve the queue views (HTTP 404: {text}): the operator serves them on "
            "loopback only, unless given --debug-addr; run `kubectl port-forward` to its debug port "
            "(the chart's operator.debugAddress) and pass --operator-url http://127.0.0.1:9091 "
            "--operator-token-file FILE (a token allowed get on /debug/queue)"
        )
    return None, f"{where} answered HTTP {status}: {text}"
