"""Which Kubernetes cluster this is, as the RM contract v1.2 names it (``clusterId``).

Several clusters may share one resource manager and one scheduler name. Each cluster's operator
lists, reconciles and audits reservations, and judges a reservation whose pod it cannot find as
leaked; so it must list only its own cluster's, which needs a name for "its own" that the RM stores
on every reservation. A configured id (``bindery run --cluster-id``, the chart's ``clusterId``)
wins; otherwise the UID of the ``kube-system`` namespace, which every cluster has, which nothing
renames, and which differs between clusters (two clusters restored from one etcd backup share it:
configure an id then). It is read once at start: it must not change while reservations carry it.
"""

from __future__ import annotations

import asyncio

from bindery.apiserver import ApiClient, ApiError, Unavailable, get, resources

__all__ = ["ClusterIdentityError", "cluster_identity"]

#: The namespace whose UID names the cluster by default.
IDENTITY_NAMESPACE = "kube-system"
READ_TIMEOUT_SECONDS = 10.0
#: Waits before reading again after no answer, a 429 or a 5xx (an apiserver still starting).
RETRY_WAITS = (1.0, 2.0, 4.0)


class ClusterIdentityError(RuntimeError):
    """The cluster id could not be derived; the message says why and what to configure."""


async def cluster_identity(api: ApiClient, *, configured: str | None = None) -> str:
    """``configured`` if given, else the UID of the ``kube-system`` namespace.

    Raises :class:`ClusterIdentityError` when that namespace cannot be read (refused, or no answer
    after the waits of ``RETRY_WAITS``).
    """
    if configured:
        return configured
    try:
        for wait in (*RETRY_WAITS, None):
            try:
                namespace = await get(
                    api, resources.NAMESPACES, name=IDENTITY_NAMESPACE, request_timeout=READ_TIMEOUT_SECONDS
                )
                break
            except Unavailable:
                if wait is None:
                    raise
                await asyncio.sleep(wait)
    except ApiError as exc:
        raise ClusterIdentityError(
            f"cannot read namespace {IDENTITY_NAMESPACE} to derive the cluster id (HTTP {exc.status or '-'} "
            f"{exc.reason or exc.message}); grant `get` on namespaces/{IDENTITY_NAMESPACE}, or set the "
            "cluster id explicitly (--cluster-id, the chart's clusterId)"
        ) from exc
    uid = (namespace.get("metadata") or {}).get("uid")
    if not uid:
        raise ClusterIdentityError(
            f"namespace {IDENTITY_NAMESPACE} has no UID; set the cluster id explicitly (--cluster-id, the "
            "chart's clusterId)"
        )
    return str(uid)
