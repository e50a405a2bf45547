"""Create Nodes through the API that kube-scheduler (and Bindery) treat as schedulable.

No kubelet runs in the dev plane, so a Node is only an object: it is created, then its
status (capacity, allocatable, a ``Ready=True`` condition) is written through the
``nodes/status`` subresource, which is what a kubelet would report.

A kwok node (:func:`create_kwok_node`, on a plane started with ``kwok=True``) gets only its
capacity here; kwok then plays its kubelet: it reports it Ready, renews its Lease, runs the pods
bound to it (Running; Job pods then Succeeded) and finishes their deletion.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from bindery.apiserver import ApiClient, create, patch, resources
from bindery.apiserver.api import STRATEGIC_PATCH
from bindery.devcluster.plane import KWOK_NODE_LABEL

DEFAULT_CAPACITY: Mapping[str, str] = {"cpu": "4", "memory": "8Gi", "pods": "110"}


def node_body(
    *,
    name: str,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"unschedulable": unschedulable, "taints": [dict(t) for t in taints or ()]},
    }


def node_status(
    *, capacity: Mapping[str, str], allocatable: Mapping[str, str] | None = None
) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "capacity": dict(capacity),
        "allocatable": dict(allocatable if allocatable is not None else capacity),
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "created by bindery.devcluster",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
    }


async def create_node(
    api: ApiClient,
    *,
    name: str,
    capacity: Mapping[str, str] = DEFAULT_CAPACITY,
    allocatable: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """Create a Ready Node with the given resources; returns the Node as the API stored it."""
    body = node_body(name=name, labels=labels, taints=taints, unschedulable=unschedulable)
    await create(api, resources.NODES, body=body)
    status = node_status(capacity=capacity, allocatable=allocatable)
    return await patch(
        api,
        resources.NODES,
        name=name,
        subresource="status",
        body={"status": status},
        content_type=STRATEGIC_PATCH,
    )


async def create_kwok_node(
    api: ApiClient,
    *,
    name: str,
    capacity: Mapping[str, str] = DEFAULT_CAPACITY,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Create a Node that kwok manages (its label); kwok reports it Ready within seconds.

    The capacity goes into the create itself (a Node may carry its status from creation), not into
    a later status patch: kwok's first stage writes ``allocatable`` from the Node as it saw it, and
    seeing it before such a patch it wrote its default (1000 CPUs) over ours, at random, so a
    3-CPU node sometimes took 8 pods.
    """
    key, value = KWOK_NODE_LABEL
    body = node_body(name=name, labels={key: value, **(labels or {})}, taints=taints)
    body["metadata"]["annotations"] = {"kwok.x-k8s.io/node": "fake"}
    body["status"] = {"capacity": dict(capacity), "allocatable": dict(capacity)}
    return await create(api, resources.NODES, body=body)
