"""Bind a pod by POSTing a Binding to `pods/{name}/binding`, the way kube-scheduler's default binder does.

Why the raw response: the apiserver answers a Binding with a `Status`, which the generated client
tries to deserialize as a `V1Binding` and fails on (kubernetes-client/python#547). We ask for the raw
response (`_preload_content=False`) and look only at the status code.

Why `metadata.uid`: it is a precondition checked by the apiserver in the same write, so a pod that
was deleted and recreated under the same name is never bound on the old pod's reservation (409).
The reservation id travels in `metadata.annotations`; the apiserver copies them onto the pod in the
same write, so no extra PATCH is needed.

A 409 is ambiguous: the pod may already be on our node (a lost response to our own earlier
request), on another node (someone else won), gated, terminating, or replaced (UID precondition).
The apiserver's message says `pod X is already assigned to node "n1"` when the pod is bound, so the
current node is parsed from the answer: no read on any path.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from bindery.kube.counters import WriteCounter
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import BindConflict, BindError, PodGone

#: How long one Binding POST may take. The generated client has no timeout at all, so a connection
#: that died silently would hold the cycle (and its reservation) forever; the apiserver itself gives
#: up on a request after 60 s by default, and a Binding normally takes milliseconds.
BIND_TIMEOUT_SECONDS = 30.0
RECENTLY_BOUND = 10_000  # the watch reports a bound pod leaving the selector within seconds
_ASSIGNED = re.compile(r'is already assigned to node "([^"]+)"')


class KubeBinder:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        counter: WriteCounter | None = None,
        timeout: float = BIND_TIMEOUT_SECONDS,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._counter = counter or WriteCounter()
        self._timeout = timeout
        self._bound: collections.OrderedDict[str, None] = collections.OrderedDict()

    def bound_recently(self, uid: str) -> bool:
        """Whether this binder bound (or is binding) the pod: its DELETED event then means "left scope"."""
        return uid in self._bound

    async def bind(self, *, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        body = binding_body(pod=pod, node=node, annotations=annotations)
        # Remembered before the POST: the watch may report the pod leaving before the answer arrives.
        self._remember(pod.uid)
        try:
            status, payload = await self._post_binding(pod=pod, body=body)
        except BaseException:
            self._bound.pop(pod.uid, None)
            raise
        if 200 <= status < 300:
            return
        self._bound.pop(pod.uid, None)
        message = _status_message(payload) or f"HTTP {status}"
        if status == 404:
            raise PodGone(f"pod {pod.namespace}/{pod.name} no longer exists: {message}")
        if status == 409:
            raise BindConflict(
                f"the apiserver refused to bind pod {pod.namespace}/{pod.name}: {message}",
                current_node=assigned_node(message),
            )
        raise BindError(
            f"binding pod {pod.namespace}/{pod.name} to node {node!r} failed: HTTP {status}: {message}",
            status=status,
        )

    async def _post_binding(self, *, pod: PodInfo, body: dict[str, Any]) -> tuple[int, bytes]:
        self._counter.add(kind="binding")
        try:
            response = await self._core.create_namespaced_pod_binding(
                name=pod.name,
                namespace=pod.namespace,
                body=body,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
            try:
                return int(response.status), await response.read()
            finally:
                response.release()
        except (client.ApiException, aiohttp.ClientError, TimeoutError) as exc:  # transport failures
            raise BindError(
                f"binding pod {pod.namespace}/{pod.name} failed: the apiserver did not answer: "
                f"{exc or type(exc).__name__}"
            ) from exc

    def _remember(self, uid: str) -> None:
        self._bound[uid] = None
        while len(self._bound) > RECENTLY_BOUND:
            self._bound.popitem(last=False)


def binding_body(*, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def assigned_node(message: str) -> str | None:
    """The node named by the apiserver's 'already assigned to node "n1"' conflict, if any."""
    match = _ASSIGNED.search(message)
    return match.group(1) if match else None


def _status_message(payload: bytes) -> str:
    try:
        data = json.loads(payload)
    except ValueError:
        return payload[:200].decode("utf-8", "replace")
    return str(data.get("message", "")) if isinstance(data, dict) else ""
