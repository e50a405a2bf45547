"""Startup reconciliation: no reservation survives a crash between reserve and commit.

If the operator died after the RM reserved capacity but before it committed, the reservation sits
in state `reserved` until its TTL expires, holding capacity nobody will use (or, if the pod got
bound, capacity that is used but never committed). Before a profile's workers start, every
`reserved` reservation of its scheduler names is settled:

- the pod exists with the reservation's UID, is bound to the reservation's node and has not
  finished → commit (the bind happened, only the commit was lost);
- otherwise (pod gone, replaced, bound elsewhere, finished, or still unbound) → release. A
  still-unbound pod simply gets a fresh reservation in its next cycle (same idempotency key).

The same decision (`pod_fate`) settles reservations whose Binding got no answer while running
(`bindery.controller.unconfirmed`), except that there a still-unbound pod keeps its reservation.

Committed reservations whose pod is no longer bound and running (it went away while no operator
was watching) are released as well.

This reads one pod per leftover reservation and lists the bound pods of each scheduler name, once
per profile start: the steady state pays nothing.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from bindery.controller.bound import TERMINAL_PHASES, BoundPodWatcher, stale_committed
from bindery.kube.reads import read_pod
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMError
from bindery.rm.models import Reservation


class Settle(enum.StrEnum):
    COMMIT = "commit"
    RELEASE = "release"


def pod_fate(*, pod_uid: str, node: str, pod: Mapping[str, Any] | None) -> Settle | None:
    """Pure: what a reservation held for `pod_uid` on `node` becomes, given the pod's current body.

    Commit if that pod is bound to that node and still running; release if it is gone (None),
    replaced under its name, bound elsewhere or finished; None while it is still unbound.
    """
    if pod is None:
        return Settle.RELEASE
    if (pod.get("metadata") or {}).get("uid") != pod_uid:
        return Settle.RELEASE  # replaced under the same name: the UID precondition kept it unbound
    bound_to = (pod.get("spec") or {}).get("nodeName")
    if not bound_to:
        return None
    if bound_to != node or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return Settle.RELEASE
    return Settle.COMMIT


def settle(*, reservation: Reservation, pod: Mapping[str, Any] | None) -> Settle:
    """Pure: what to do with a leftover `reserved` reservation; a still-unbound pod reserves afresh."""
    return pod_fate(pod_uid=reservation.pod_uid, node=reservation.node, pod=pod) or Settle.RELEASE


async def reconcile_reservations(
    *,
    rm: ResourceManagerClient,
    api: client.ApiClient,
    scheduler_names: frozenset[str],
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    namespaces: tuple[str, ...] = (),
) -> dict[str, Settle]:
    """Settle every `reserved` reservation of `scheduler_names`; returns id → action taken.

    With `namespaces` (a namespaced operator) only reservations of pods in them are touched.
    """
    core = client.CoreV1Api(api)
    done: dict[str, Settle] = {}
    for scheduler_name in sorted(scheduler_names):
        for reservation in await rm.list_reservations(scheduler_name=scheduler_name, state="reserved"):
            if namespaces and reservation.namespace not in namespaces:
                continue  # another operator's namespace
            pod = await _read_pod(core=core, reservation=reservation)
            action = settle(reservation=reservation, pod=pod)
            try:
                if action is Settle.COMMIT:
                    await rm.commit(reservation.id, pod_uid=reservation.pod_uid)
                else:
                    await rm.release(reservation.id, pod_uid=reservation.pod_uid)
            except RMError as exc:
                logger.warning(f"could not {action} leftover reservation {reservation.id}: {exc}")
                continue
            logger.info(
                f"settled leftover reservation {reservation.id} of pod "
                f"{reservation.namespace}/{reservation.name} ({reservation.pod_uid}): {action}"
            )
            done[reservation.id] = action
        await _release_departed(
            rm=rm, api=api, scheduler_name=scheduler_name, logger=logger, done=done, namespaces=namespaces
        )
    return done


async def _release_departed(
    *,
    rm: ResourceManagerClient,
    api: client.ApiClient,
    scheduler_name: str,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    done: dict[str, Settle],
    namespaces: tuple[str, ...],
) -> None:
    running: set[str] = set()
    for namespace in namespaces or (None,):
        watcher = BoundPodWatcher(
            api=api, scheduler_name=scheduler_name, rm=lambda: rm, logger=logger, namespace=namespace
        )
        running |= (await watcher.running_pod_uids())[0]
    committed = await rm.list_reservations(scheduler_name=scheduler_name, state="committed")
    for reservation in stale_committed(committed=committed, running_pod_uids=running, namespaces=namespaces):
        try:
            await rm.release(reservation.id, pod_uid=reservation.pod_uid)
        except RMError as exc:
            logger.warning(f"could not release reservation {reservation.id} of a departed pod: {exc}")
            continue
        logger.info(f"released reservation {reservation.id}: pod {reservation.pod_uid} is no longer running")
        done[reservation.id] = Settle.RELEASE


async def _read_pod(*, core: client.CoreV1Api, reservation: Reservation) -> dict[str, Any] | None:
    if not reservation.namespace or not reservation.name:
        return None  # the RM does not know the pod's name: nothing can be bound on it by us
    return await read_pod(core=core, namespace=reservation.namespace, name=reservation.name)
