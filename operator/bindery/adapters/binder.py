"""Bind a pod by POSTing a Binding to `pods/{name}/binding`, the way kube-scheduler's default binder does.

Why the raw response: the apiserver answers a Binding with a `Status`, which the generated client
tries to deserialize as a `V1Binding` and fails on (kubernetes-client/python#547). The POST goes
through the raw apiserver layer (`bindery.apiserver.api.answer_of`: the client's session, auth and
headers, none of the generated method's per-call work) and only the status code is looked at.

Why `metadata.uid`: it is a precondition checked by the apiserver in the same write, so a pod that
was deleted and recreated under the same name is never bound on the old pod's reservation (409).
The reservation id travels in `metadata.annotations`; the apiserver copies them onto the pod in the
same write, so no extra PATCH is needed.

A 409 is ambiguous: the pod may already be on our node (a lost response to our own earlier
request), on another node (someone else won), gated, terminating, or replaced (UID precondition).
The apiserver's message says `pod X is already assigned to node "n1"` when the pod is bound, so the
current node is parsed from the answer. Being on our node is not enough to call it ours: another
scheduler, or a stale cycle of ours with an older reservation, may have bound it there. So on that
409 only, the pod is read once (within what is left of the attempt's timeout) and the conflict names
its UID and reservation annotation; if that read gets no answer, the Binding's fate is as unknown as
an unanswered one. The success path reads nothing.
"""

from __future__ import annotations

import collections
import json
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from bindery.adapters.counters import WriteCounter
from bindery.adapters.reads import read_pod
from bindery.apiserver import ApiClient, ApiError
from bindery.apiserver.api import answer_of
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import BindConflict, BindError, PodGone

#: How long one Binding POST may take. The generated client has no timeout at all, so a connection
#: that died silently would hold the cycle (and its reservation) forever; the apiserver itself gives
#: up on a request after 60 s by default, and a Binding normally takes milliseconds.
BIND_TIMEOUT_SECONDS = 30.0
RECENTLY_BOUND = 10_000  # the watch reports a bound pod leaving the selector within seconds
_MIN_READ_SECONDS = 0.5  # the read after a 409 gets at least this long (inside the lease margin)
_ASSIGNED = re.compile(r'is already assigned to node "([^"]+)"')


class KubeBinder:
    def __init__(
        self,
        *,
        api: ApiClient,
        counter: WriteCounter | None = None,
        timeout: float = BIND_TIMEOUT_SECONDS,
    ) -> None:
        self._api = api
        self._counter = counter or WriteCounter()
        self._timeout = timeout
        self._bound: collections.OrderedDict[str, None] = collections.OrderedDict()

    def bound_recently(self, uid: str) -> bool:
        """Whether this binder bound (or is binding) the pod: its DELETED event then means "left scope"."""
        return uid in self._bound

    def forget(self, uid: str) -> None:
        """The pod's departure from the unbound pods was handled: nothing asks about it any more."""
        self._bound.pop(uid, None)

    def remembered(self) -> int:
        """Pods remembered as bound by this binder (bounded; 0 once their departures were seen)."""
        return len(self._bound)

    async def bind(  # `timeout`: the cycle's bound for this attempt (within the lease)
        self,
        *,
        pod: PodInfo,
        node: str,
        annotations: Mapping[str, str],
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        body = binding_body(pod=pod, node=node, annotations=annotations)
        limit = self._timeout if timeout is None else min(self._timeout, timeout)
        started = time.monotonic()
        # Remembered before the POST: the watch may report the pod leaving before the answer arrives.
        self._remember(pod.uid)
        try:
            status, payload = await self._post_binding(pod=pod, body=body, limit=limit)
        except BaseException:
            self._bound.pop(pod.uid, None)
            raise
        if 200 <= status < 300:
            return
        self._bound.pop(pod.uid, None)
        message = status_message(payload) or f"HTTP {status}"
        if status == 404:
            raise PodGone(f"pod {pod.namespace}/{pod.name} no longer exists: {message}")
        if status == 409:
            current = assigned_node(message)
            refused = f"the apiserver refused to bind pod {pod.namespace}/{pod.name}: {message}"
            if current != node:
                raise BindConflict(refused, current_node=current)
            uid, holder = await self._holder(pod=pod, node=node, left=limit - (time.monotonic() - started))
            raise BindConflict(refused, current_node=current, pod_uid=uid, reservation_id=holder)
        raise BindError(
            f"binding pod {pod.namespace}/{pod.name} to node {node!r} failed: HTTP {status}: {message}",
            status=status,
        )

    async def _holder(self, *, pod: PodInfo, node: str, left: float) -> tuple[str | None, str | None]:
        """Who holds the pod on our node: its UID and reservation annotation (one read).

        Raises BindError without a status if the read gets no answer: the Binding may be ours.
        """
        try:
            body = await read_pod(
                api=self._api,
                namespace=pod.namespace,
                name=pod.name,
                timeout_seconds=max(left, _MIN_READ_SECONDS),
            )
        except ApiError as exc:
            raise BindError(
                f"binding pod {pod.namespace}/{pod.name}: the apiserver says it is already on node "
                f"{node!r}, and reading the pod to see whether our Binding put it there failed: "
                f"{exc or type(exc).__name__}"
            ) from exc
        if body is None:
            raise PodGone(f"pod {pod.namespace}/{pod.name} no longer exists")
        metadata = body.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        holder = annotations.get(RESERVATION_ANNOTATION)
        uid = metadata.get("uid")
        return (str(uid) if uid else None), (str(holder) if holder else None)

    async def _post_binding(self, *, pod: PodInfo, body: dict[str, Any], limit: float) -> tuple[int, bytes]:
        self._counter.add(kind="binding")
        try:
            return await answer_of(
                self._api,
                "POST",
                f"/api/v1/namespaces/{quote(pod.namespace, safe='')}/pods/{quote(pod.name, safe='')}/binding",
                body=body,
                request_timeout=limit,
            )
        except ApiError as exc:  # transport failures (answers are returned)
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


def status_message(payload: bytes) -> str:
    """The `message` of an apiserver Status body (its first 200 bytes if it is not JSON)."""
    try:
        data = json.loads(payload)
    except ValueError:
        return payload[:200].decode("utf-8", "replace")
    return str(data.get("message", "")) if isinstance(data, dict) else ""
