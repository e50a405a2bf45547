"""The unbound pods this process has seen, and where each goes: the runtime's pod half.

Pod events are handled without I/O except for contested scheduler names, pods refused for their
spec and namespaces outside a ResourceManager's selector (a FailedScheduling event and condition,
aggregated): the handler only updates the in-memory map and offers the pod to the right profile's
queue. Only pods of claimed scheduler names arrive (the watch follows those names alone, see
:mod:`bindery.controller.watches.unbound`); a ResourceManager created later lists its names' pods
afresh, which picks up pods that were already waiting. Pods of names no ResourceManager claims are
never read, kept or written to.

A pod whose placement inputs pass the caps of contract v1 (more than 256 tolerations, say) could
never be reserved: it is refused with a FailedScheduling event that names the field and the cap,
and only its identity is kept (:meth:`bindery.scheduling.podspec.PodInfo.slim`), never its spec.

The routing (which ResourceManager serves which scheduler name; contested names are served by
nobody) is decided by the runtime when a ResourceManager changes and kept here, where every pod is
routed by it. A ResourceManager with a `spec.namespaceSelector` is offered only pods of the
namespaces it selects (their labels come from the namespace watch,
bindery.controller.watches.namespaces); a pod of another namespace gets FailedScheduling and
PodScheduled=False (Unschedulable) naming the ResourceManager and the rule, is withdrawn from its
queue, and is routed again when its namespace's labels change. A periodic sweep forgets remembered
unbound pods a fresh list no longer has (a pod that vanished while its watch was down; a pod of a
name no longer claimed). It lists metadata only, per claimed name: it reads UIDs and nothing else.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from bindery.adapters import KubeBinder, KubeConditionWriter, KubeEventSink, UnboundPods
from bindery.apiserver import ApiClient, list_pages, resources
from bindery.config import Routing
from bindery.config.routing import namespace_refusal
from bindery.controller.metrics import Metrics
from bindery.controller.profile.runner import ProfileRunner
from bindery.controller.watches.unbound import unbound_pods_selector
from bindery.podrules.model import PlacedPod
from bindery.scheduling.decisions import REASON_SCHEDULER_ERROR, REASON_UNSCHEDULABLE
from bindery.scheduling.placementrules import touch_of
from bindery.scheduling.podspec import PodInfo, PodSpecError, beyond_contract
from bindery.scheduling.queue import Touch
from bindery.scheduling.throttle import EventThrottle
from bindery.typedefs import Logger

#: How long parked pods wait after a Node event before they are retried: the RM (the reference RM's
#: mirror) learns of the Node through a watch of its own, and a pod retried before the RM saw the
#: change is refused again and parked for up to 5 minutes.
NODE_EVENT_SETTLE_SECONDS = 2.0


class PendingPods:
    """The map of unbound pods, the routing, and the sweep that forgets vanished pods."""

    def __init__(
        self,
        *,
        api: ApiClient,
        binder: KubeBinder,
        events: KubeEventSink,
        conditions: KubeConditionWriter,
        runners: Callable[[], Mapping[str, ProfileRunner]],
        leading: Callable[[], bool],
        sweep_interval: Callable[[], float],
        metrics: Metrics,
        logger: Logger,
        namespaces: tuple[str, ...] = (),
    ) -> None:
        self.pods = UnboundPods()
        #: Set by the runtime whenever the ResourceManagers change.
        self.routing = Routing(served={}, contested={})
        #: Drops a pod's assumed copy from the placed-pod cache; set by the runtime with that cache.
        self.forget_placed: Callable[[str], None] = lambda uid: None
        #: A namespace's labels, None while unknown; set by the runtime once it watches namespaces.
        self.namespace_labels: Callable[[str], Mapping[str, str] | None] = lambda namespace: None
        self._reports: set[asyncio.Task[None]] = set()  # refusals reported outside an event
        self.sweeps = 0  #: passes of the unbound-pod sweep (tests wait on it)
        self._api = api
        self._binder = binder
        self._events = events
        self._conditions = conditions
        self._runners = runners
        self._leading = leading
        self._sweep_interval = sweep_interval
        self._metrics = metrics
        self._logger = logger
        self._namespaces = namespaces
        self._conflict_throttle = EventThrottle()
        #: node name -> digest of what placement reads of it (see `on_node_event`)
        self._nodes: dict[str, str] = {}
        #: pods of served names refused for their spec (see `beyond_contract`), by UID: slim only
        self._refused: dict[str, PodInfo] = {}

    def sizes(self) -> dict[str, int]:
        """Entries held per pod, by structure (see Runtime.per_pod_sizes); only takes sizes."""
        return {
            "pods": len(self.pods),
            "refused": len(self._refused),
            "first_seen": self._metrics.pods_seen(),
            "conflict_throttle": len(self._conflict_throttle),
            "conditions_written": len(self._conditions._written),
            "recently_bound": self._binder.remembered(),
        }

    # -- pods -----------------------------------------------------------------------------------

    async def on_pod_event(self, *, event_type: str | None, body: Mapping[str, Any]) -> None:
        if event_type == "DELETED":
            # Every pod bound leaves the `spec.nodeName=` selector with one: what identifies it is
            # all its departure reads, so its placement inputs are not parsed (nor its caps checked).
            self._depart(PodInfo.slim(body))
            return
        refusal = beyond_contract(body)
        if refusal is not None:
            await self._refuse(pod=PodInfo.slim(body), message=refusal)
            return
        self._drop_refused(str((body.get("metadata") or {}).get("uid") or ""))
        try:
            pod = PodInfo.from_body(body)
        except PodSpecError as exc:
            self._logger.warning(f"ignoring a pod event that does not parse: {exc}")
            return
        if not pod.schedulable:
            self._depart(pod)
            return
        if self._binder.bound_recently(pod.uid):
            # An event older than our Binding (it is on the wire, or landed and the DELETED that says
            # so is next): the pod is not pending. Taking it as pending would requeue it, and mark
            # it seen after its cycle forgot it, with nothing left to forget it again.
            return
        self.pods.put(pod)
        self._metrics.pod_seen(pod.uid)
        await self._route(pod)

    def _depart(self, pod: PodInfo) -> None:
        """Deleted, bound, terminating or gated: no longer pending (`pod` may be slim)."""
        self._drop_refused(pod.uid)
        if not pod.node_name and not self._binder.bound_recently(pod.uid):
            # Left unbound (deleted or terminating while pending): the placed-pod watch never sees
            # it, so a copy a cycle assumed before an unanswered Binding would stay for good.
            # A pod this process bound (or is binding) leaves the `spec.nodeName=` selector with
            # the same DELETED and its last unbound state: its assumed copy stays until the
            # placed-pod watch reports it bound, or its spread and anti-affinity go uncounted.
            self.forget_placed(pod.uid)
        self._forget(pod)

    async def _refuse(self, *, pod: PodInfo, message: str) -> None:
        """A pod whose spec passes the contract's caps, or asks for what Bindery does not do (DRA
        claims; see `beyond_contract`): not scheduled, not projected, told why."""
        if not pod.schedulable:
            self._depart(pod)
            return
        if self.pods.get(pod.uid) is not None:  # it grew past a cap (tolerations may be added)
            self._forget(pod)
        self._refused[pod.uid] = pod
        if pod.scheduler_name in self.routing.served:
            await self._report(pod=pod, key="BeyondContract", reason=REASON_SCHEDULER_ERROR, message=message)
        else:  # a contested name: the conflict is what keeps it pending first
            await self._route(pod)

    def _drop_refused(self, uid: str) -> None:
        if self._refused.pop(uid, None) is not None:
            self._conflict_throttle.forget(uid)
            self._conditions.forget(uid=uid)

    def _forget(self, pod: PodInfo) -> None:
        """Deleted, bound (left the `spec.nodeName=` selector), terminating or gated.

        An in-flight cycle notices through PodLookup (or a 404/409 on bind) and releases its
        reservation, and that release retries the parked pods. The departure itself frees nothing:
        a pending pod holds no capacity (one we bound merely left the selector; one bound by someone
        else takes capacity), so parked pods are not retried here. They were, once, and a tenant's
        create/delete loop of pending pods then sent every parked pod of the ResourceManager back to
        the RM on each deletion (issue 20). Capacity comes back through a release, a bound pod gone
        (its release), a Node added or changed, a ResourceManager change, the RM's retryAfterSeconds
        or the 5-minute cap.
        """
        known = self.pods.pop(pod.uid)
        if known is None:
            return
        self._conflict_throttle.forget(pod.uid)
        self._conditions.forget(uid=pod.uid)
        for runner in self._runners().values():
            runner.withdraw(pod.uid)
        ours = self._binder.bound_recently(pod.uid)
        self._binder.forget(pod.uid)
        if not ours:  # a pod we bound is forgotten by its cycle, which observes its latency
            self._metrics.pod_forgotten(pod.uid)

    def drop(self, uid: str) -> None:
        """A cycle found the pod gone or bound elsewhere: stop remembering it (a relist may miss it)."""
        self.pods.pop(uid)
        self._metrics.pod_forgotten(uid)
        self._conflict_throttle.forget(uid)
        self._conditions.forget(uid=uid)

    async def _route(self, pod: PodInfo) -> None:
        runners = self._runners()
        rm_name = self.routing.served.get(pod.scheduler_name)
        if rm_name is not None and rm_name in runners:
            admitted, refusal = self._admission(pod, rm_name)
            if admitted:
                runners[rm_name].offer(pod)
                return
            runners[rm_name].withdraw(pod.uid)
            if refusal is not None:
                await self._report_refusal(pod=pod, message=refusal)
            return
        conflict = self.routing.conflict_message(scheduler_name=pod.scheduler_name)
        if conflict is not None:
            await self._report_conflict(pod=pod, message=conflict)

    def _admission(self, pod: PodInfo, rm_name: str) -> tuple[bool, str | None]:
        """(offer the pod to `rm_name`?, why not if it is refused) by the RM's namespaceSelector.

        A pod of a namespace whose labels are not known yet is neither offered nor refused: it
        waits for the namespace watch, which routes it again (refusing it on a guess would write a
        false FailedScheduling; offering it would reserve for a namespace that may be outside).
        """
        selector = self.routing.selectors.get(rm_name)
        if selector is None:
            return True, None
        labels = self.namespace_labels(pod.namespace)
        if labels is None:
            return False, None
        if selector.matches(labels):
            return True, None
        return False, namespace_refusal(rm_name=rm_name, selector=selector, namespace=pod.namespace)

    async def _report_conflict(self, *, pod: PodInfo, message: str) -> None:
        await self._report(
            pod=pod, key="SchedulerNameConflict", reason=REASON_SCHEDULER_ERROR, message=message
        )

    async def _report_refusal(self, *, pod: PodInfo, message: str) -> None:
        await self._report(pod=pod, key="NamespaceSelector", reason=REASON_UNSCHEDULABLE, message=message)

    async def _report(self, *, pod: PodInfo, key: str, reason: str, message: str) -> None:
        """FailedScheduling (throttled) and PodScheduled=False for a pod no cycle will try."""
        if not self._leading():
            return
        note = self._conflict_throttle.admit(uid=pod.uid, key=key, message=message)
        try:
            if note is not None:
                await self._events.failed_scheduling(pod=pod, message=note, scheduler_name=pod.scheduler_name)
            await self._conditions.pod_scheduled_false(pod=pod, reason=reason, message=message)
        except Exception as exc:  # reporting is best effort; the pod stays pending anyway
            self._logger.warning(f"could not report why pod {pod.key} is not scheduled ({key}): {exc}")

    def released(self, rm_name: str) -> None:
        """A reservation of ResourceManager `rm_name` was released: room at that RM alone.

        Its runner wakes the pods refused for room (coalesced, `ProfileRunner.capacity_freed`), and
        so does every runner whose ResourceManager names the same endpoint (one RM behind several
        objects shares its room). Other RMs' parked pods stay: a release elsewhere frees nothing
        for them, and waking them cost their RMs a reserve per pod on every release.
        """
        runners = self._runners()
        source = runners.get(rm_name)
        if source is None:
            return
        for runner in runners.values():
            if runner is source or runner.config.endpoint == source.config.endpoint:
                runner.capacity_freed()

    def retry_parked(self, reason: str, *, settle: float = 0.0, event: str = "other") -> None:
        for runner in self._runners().values():
            runner.queue.move_all_to_active(reason=reason, settle=settle, event=event)
            runner.podgroups.retry()

    def on_placed_change(self, pod: PlacedPod) -> None:
        """A pod on a node arrived, changed or left (the placed-pod cache): wake the pods the
        placement rules refused that it may concern."""
        touch = touch_of(pod)
        for runner in self._runners().values():
            runner.queue.wake(touch, event="placed-pod")
            runner.podgroups.wake(touch)
            if pod.group:  # a member placed or gone: its group counts them again
                runner.podgroups.changed(namespace=pod.namespace, name=pod.group)

    def on_namespace_relabelled(self, namespace: str) -> None:
        """A namespace's labels changed: the rules' namespaceSelector terms may see it now (or not)."""
        for runner in self._runners().values():
            runner.queue.wake(Touch(namespace=namespace), event="namespace")
            runner.podgroups.wake(Touch(namespace=namespace))

    def on_node_event(self, *, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A Node added, or changed where placement looks (labels, taints, cordon, capacity,
        readiness), may make parked pods fit: retry them. Heartbeats and other status churn do not;
        a relist that repeats known Nodes moves nothing. A Node going away frees no room, but may
        lift a topology spread's refusal: those pods alone are retried."""
        name = str((body.get("metadata") or {}).get("name") or "")
        if event_type == "DELETED":
            if self._nodes.pop(name, None) is not None:
                for runner in self._runners().values():
                    runner.queue.node_deleted()
            return
        digest = _placement_digest(body)
        before = self._nodes.get(name)
        self._nodes[name] = digest
        if before != digest:
            what = "added" if before is None else "changed"
            self.retry_parked(f"node {name} {what}", settle=NODE_EVENT_SETTLE_SECONDS, event="node")

    def claimed(self) -> frozenset[str]:
        """The scheduler names some ResourceManager claims (served or contested): those followed."""
        return frozenset(self.routing.served) | frozenset(self.routing.contested)

    def reoffer_all(self, namespace: str | None = None) -> None:
        """Put every remembered pod (of `namespace`, if given) where the current routing says it
        belongs; a pod its owner's namespaceSelector now refuses is withdrawn and told why; forget
        the pods of names nobody claims any more (their watch stopped: nothing would forget them)."""
        runners = self._runners()
        claimed = self.claimed()
        for uid, refused in list(self._refused.items()):
            if refused.scheduler_name not in claimed:
                self._drop_refused(uid)
        for uid in self.pods.uids():
            pod = self.pods.get(uid)
            if pod is None or (namespace is not None and pod.namespace != namespace):
                continue
            if pod.scheduler_name not in claimed:
                self._forget(pod)
                continue
            owner = self.routing.served.get(pod.scheduler_name)
            refusal = None
            if owner is not None and owner in runners:
                admitted, refusal = self._admission(pod, owner)
                owner = owner if admitted else None
            for name, runner in runners.items():
                if name == owner:
                    runner.offer(pod)
                else:
                    runner.withdraw(uid)
            if refusal is not None:
                task = asyncio.create_task(self._report_refusal(pod=pod, message=refusal))
                self._reports.add(task)
                task.add_done_callback(self._reports.discard)

    # -- unbound-pod sweep -----------------------------------------------------------------------

    async def sweep_forever(self) -> None:
        """Every reconcile interval (the shortest of the ResourceManagers'), forget vanished pods."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            if time.monotonic() - last < self._sweep_interval():
                continue
            last = time.monotonic()
            try:
                await self.sweep_unbound()
            except Exception as exc:  # the next sweep tries again
                self._logger.warning(f"could not list unbound pods to forget vanished ones: {exc}")

    async def sweep_unbound(self) -> int:
        """Forget remembered unbound pods that a fresh list does not have; returns how many.

        Only pods remembered before the list began are judged, so one added meanwhile is kept.
        """
        known = self.pods.uids() | set(self._refused)
        listed = await self._unbound_uids() if known else set()
        gone = known - listed
        for uid in gone:
            self._drop_refused(uid)
            pod = self.pods.get(uid)
            if pod is not None:
                self._forget(pod)
        if gone:
            self._logger.info(f"forgot {len(gone)} unbound pods that no longer exist or were bound")
        self._conditions.retain(uids=self.pods.uids() | set(self._refused))
        self.sweeps += 1
        return len(gone)

    async def _unbound_uids(self) -> set[str]:
        """UIDs of the unbound pods of the claimed names in scope: a paged LIST of metadata only
        (PartialObjectMetadata) per name, each page reduced to its UIDs before the next is read."""
        uids: set[str] = set()
        for name in sorted(self.claimed()):
            for namespace in self._namespaces or (None,):
                async for page in list_pages(
                    self._api,
                    resources.PODS,
                    namespace=namespace,
                    field_selector=unbound_pods_selector(scheduler_name=name),
                    metadata_only=True,
                ):
                    uids.update(str(item["metadata"]["uid"]) for item in page.get("items") or ())
        return uids


def _placement_digest(body: Mapping[str, Any]) -> str:
    """Pure: a digest of the parts of a Node an RM may place by, and none of its status churn."""
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    spec: Mapping[str, Any] = body.get("spec") or {}
    status: Mapping[str, Any] = body.get("status") or {}
    ready = [c.get("status") for c in status.get("conditions") or () if c.get("type") == "Ready"]
    parts = {
        "labels": metadata.get("labels") or {},
        "deleting": metadata.get("deletionTimestamp") is not None,
        "taints": spec.get("taints") or [],
        "unschedulable": bool(spec.get("unschedulable")),
        "capacity": status.get("capacity") or {},
        "allocatable": status.get("allocatable") or {},
        "ready": ready,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
