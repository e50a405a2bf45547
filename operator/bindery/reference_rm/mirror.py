"""Mirror the cluster's Node objects, and the pods bound to them, into the reference RM.

In this mode the RM owns the pool of nodes selected by a label selector and sees each one's
``status.allocatable``, labels, taints and ``spec.unschedulable`` as they change.  Only Ready nodes
that are not being deleted count (see :func:`bindery.reference_rm.inventory.node_from_object`).

The nodes are shared: kube-scheduler, DaemonSets, static pods and other schedulers put pods there
too, and those pods use capacity the RM must not hand out again.  So the RM also follows every pod
bound to a node (field selector ``spec.nodeName!=``) and hands an immutable snapshot of them to the
store (see :mod:`bindery.reference_rm.accounting`).  It is not ready (``/readyz`` 503, reserve 503) until it
knows both the nodes and the pods: a reservation placed before the pods are known could land on a
node that is already full.

Both are :func:`bindery.apiserver.watching.list_watch` loops: a watch that ends, breaks or goes silent
resumes from the last resourceVersion after one capped backoff, so a restarted apiserver is survived
without a restart of the RM; only a ``410 Gone`` relists, and that relist is diffed against the
objects known, so one deleted while the watch was down arrives as DELETED and disappears.

Retrying for ever is right, but the RM must not look healthy meanwhile: it places on the last
snapshot, which grows staler by the minute. So each mirror keeps a :class:`MirrorHealth`: once its
list or watch has failed without a success in between for longer than ``stale_after`` seconds,
:meth:`MirrorHealth.stale_reason` says so and ``/readyz`` answers 503 with it; the next list or
watch the apiserver answers makes the RM ready again.  A success is a list completed or a watch
request answered, so a quiet set whose watches simply end and resume is never stale; a half-open
stream only counts as a failure once the watch's read timeout (a little over its own timeout)
notices it.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bindery.apiserver import resources
from bindery.apiserver.api import ApiClient
from bindery.apiserver.errors import ApiError, Forbidden
from bindery.apiserver.resources import Resource
from bindery.apiserver.watching import WATCH_BACKOFF, Cursor, Event, Listed, list_watch, object_key
from bindery.backoff import Backoff, BackoffPolicy
from bindery.podresources import PodResourcesError
from bindery.reference_rm.accounting import BoundPod, ClusterPods, bound_pod
from bindery.reference_rm.inventory import node_from_object
from bindery.reference_rm.placement import InventoryNode
from bindery.reference_rm.preemption import Budget, BudgetIndex, budget_from

__all__ = [
    "DEFAULT_POD_PAGE_SIZE",
    "DEFAULT_STALE_AFTER",
    "BudgetMirror",
    "MirrorGate",
    "MirrorHealth",
    "NodeMirror",
    "PodMirror",
]

log = logging.getLogger(__name__)

#: Bound of one page of a (re)list.
LIST_TIMEOUT_SECONDS = 60
#: How long a mirror's list or watch may fail, without a success in between, before the RM is unready.
DEFAULT_STALE_AFTER = 60.0
#: Pods a page of the pod mirror's list. The RM is unready until that list is complete, and its pages
#: come one after another (each needs the last one's continue token): at the apiserver's default for
#: pods (50, which bounds the operator's memory) 10,000 bound pods were 200 round trips. The mirror
#: keeps only a small projection of each pod and drops the page before reading the next, so the
#: page bounds the RM's peak alone: 500 pods of ordinary size are a few MB of JSON, but 500 pods
#: with 1,000 tolerations each are about 37 MB (``--mirror-pod-page-size`` lowers it).
DEFAULT_POD_PAGE_SIZE = 500


class MirrorHealth:
    """Whether one mirror's list-then-watch has been failing for too long (see the module docstring).

    Fed by the loop itself: its backoff reports every failure it waits after, its cursor counts the
    lists completed and the watches answered, and its logger hands over the failure's message.
    """

    def __init__(self, *, what: str, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._what = what
        self._stale_after = stale_after
        self._clock = clock
        self.cursor = Cursor()
        self._failing_since: float | None = None
        self._progress_at_failure = (0, 0)
        self.last_error = ""
        self.ended = False

    def _progress(self) -> tuple[int, int]:
        return self.cursor.lists, self.cursor.watches

    def failed(self) -> None:
        """One more failure: it starts a streak unless the previous one had no success since."""
        if self._failing_since is None or self._progress() != self._progress_at_failure:
            self._failing_since = self._clock()
        self._progress_at_failure = self._progress()

    def stale_reason(self) -> str | None:
        """Why the mirror's snapshot may be stale (the reason ``/readyz`` gives), or None."""
        if self.ended:
            return f"the {self._what} mirror stopped ({self.last_error or 'see the log'}); restart the RM"
        if self._failing_since is None or self._progress() != self._progress_at_failure:
            return None  # never failed, or the apiserver answered since
        failing = self._clock() - self._failing_since
        if failing < self._stale_after:
            return None
        return (
            f"the {self._what} mirror has been failing for {failing:.0f} s "
            f"(last: {self.last_error or 'see the log'}), so placements rest on a snapshot that may be "
            f"stale: check that the RM reaches the apiserver and may list and watch {self._what}s; it "
            "turns ready again as soon as they answer"
        )


class _ReportingBackoff(Backoff):
    """The watch's backoff, telling the mirror's health of each failure it waits after."""

    def __init__(self, policy: BackoffPolicy, health: MirrorHealth) -> None:
        super().__init__(policy)
        self._health = health

    def next(self, *, retry_after: float | None = None) -> float:
        self._health.failed()
        return super().next(retry_after=retry_after)


class _RememberingLogger(logging.LoggerAdapter[logging.Logger]):
    """The mirror's logger, keeping the last failure it logged for the reason ``/readyz`` gives."""

    def __init__(self, logger: logging.Logger, health: MirrorHealth) -> None:
        super().__init__(logger, {})
        self._health = health

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level >= logging.WARNING:
            self._health.last_error = str(msg) % args if args else str(msg)
        super().log(level, msg, *args, **kwargs)


class _ListWatch(abc.ABC):
    """Follow one list-then-watch: the first list replaces the set, every later change applies."""

    what = "object"
    resource: Resource
    #: Objects a page of the first list (and of a relist); None: the resource's default.
    page_size: int | None = None

    def __init__(
        self, *, api: ApiClient, watch_timeout_seconds: int, max_backoff: float, stale_after: float
    ) -> None:
        self._api = api
        self._watch_timeout = watch_timeout_seconds
        self._max_backoff = max_backoff
        self.health = MirrorHealth(what=self.what, stale_after=stale_after)

    @abc.abstractmethod
    def _selectors(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def _listed(self, raw: Mapping[str, Any]) -> Any:
        """What is kept of one object of the first list (the raw object is not)."""

    @abc.abstractmethod
    def _replace(self, listed: Mapping[str, Any]) -> None:
        """The whole set, from the first list: `_listed` of each object, by object key."""

    @abc.abstractmethod
    def _apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        """One ADDED, MODIFIED or DELETED change (a watch event, or one of a relist's diff)."""

    def _hint(self, error: ApiError) -> str:
        if isinstance(error, Forbidden):
            return f" (grant the RM's service account get, list and watch on {self.what}s)"
        return ""

    async def run(self) -> None:
        """Run until cancelled; the mirror's health (see `MirrorHealth`) says when it ended."""
        try:
            await self._follow()
        except BaseException as error:
            self.health.ended = True
            self.health.last_error = repr(error)
            raise

    async def _follow(self) -> None:
        """Follow the objects: the first list is projected page by page as its objects arrive
        (only `_listed` of each is kept until the list is complete): holding its raw pages, as this
        did, kept every bound pod of the cluster in full at once, far past the RM's memory limit in
        a large cluster."""
        # The first list under way; None once it was applied, or when this run resumes where an
        # earlier one stopped (the health's cursor knows objects: no first list comes, only a watch
        # or a relist's diff, applied as they arrive).
        staged: dict[str, Any] | None = None if self.health.cursor.known else {}
        selected = self._selectors()
        policy = BackoffPolicy(initial=WATCH_BACKOFF.initial, maximum=self._max_backoff)
        async for item in list_watch(
            self._api,
            self.resource,
            watch_seconds=self._watch_timeout,
            list_timeout=LIST_TIMEOUT_SECONDS,
            cursor=self.health.cursor,
            backoff=_ReportingBackoff(policy, self.health),
            logger=_RememberingLogger(log, self.health),
            what=f"{self.what}s for the mirror",
            hint=self._hint,
            label_selector=selected.get("label_selector", ""),
            field_selector=selected.get("field_selector", ""),
            page_size=self.page_size,
        ):
            # Applied here, outside the loop's own error handling: one object that cannot be
            # applied must not end the mirror (a dead mirror leaves the RM placing on a frozen
            # snapshot, still ready), so it is logged and the next change applies as usual.
            try:
                if isinstance(item, Listed):
                    if staged is not None:
                        self._replace(staged)
                        staged = None
                    log.info(
                        "%s mirror: %d %s(s) match %s", self.what, item.count, self.what, self._selectors()
                    )
                elif isinstance(item, Event):
                    if staged is None:
                        self._apply(item.type or "ADDED", item.object)
                    elif item.type == "DELETED":  # delivered by a first list that failed half way
                        staged.pop(object_key(item.object), None)
                    else:
                        staged[object_key(item.object)] = self._listed(item.object)
            except Exception:
                log.exception("%s mirror: applying a change failed; following the next ones", self.what)


class NodeMirror(_ListWatch):
    """Keeps ``on_change`` fed with the current inventory of selected, Ready nodes.

    Each node is parsed once per event that touches it, and an event that leaves its inventory
    entry as it was (a status heartbeat, an annotation) publishes nothing: parsing every node on
    every event cost O(nodes) per event, and a new inventory makes the next placement evaluate
    every node's taints and labels again (see :func:`bindery.reference_rm.placement.choose_node`).
    """

    what = "node"
    resource = resources.NODES

    def __init__(
        self,
        *,
        api: ApiClient,
        label_selector: str = "",
        on_change: Callable[[Sequence[InventoryNode]], None],
        watch_timeout_seconds: int = 300,
        max_backoff: float = 10.0,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> None:
        super().__init__(
            api=api,
            watch_timeout_seconds=watch_timeout_seconds,
            max_backoff=max_backoff,
            stale_after=stale_after,
        )
        self._selector = label_selector
        self._on_change = on_change
        self._nodes: dict[str, InventoryNode] = {}  # the selected nodes that count, by object name

    def _selectors(self) -> dict[str, str]:
        return {"label_selector": self._selector}

    def _publish(self) -> None:
        self._on_change(list(self._nodes.values()))

    def _listed(self, raw: Mapping[str, Any]) -> tuple[str, InventoryNode | None]:
        return raw["metadata"]["name"], node_from_object(raw)

    def _replace(self, listed: Mapping[str, Any]) -> None:
        parsed: list[tuple[str, InventoryNode | None]] = list(listed.values())
        self._nodes = {name: node for name, node in parsed if node is not None}
        self._publish()

    def _apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        name = raw["metadata"]["name"]
        node = None if kind == "DELETED" else node_from_object(raw)
        if self._nodes.get(name) == node:
            return
        if node is None:
            del self._nodes[name]
        else:
            self._nodes[name] = node
        self._publish()


class PodMirror(_ListWatch):
    """Keeps ``on_change`` fed with a :class:`ClusterPods` snapshot of the non-terminal bound pods.

    Only the small :class:`BoundPod` projection of each pod is kept, not the pod body.  A watch
    event rebuilds the entry of the node(s) it touches and publishes a new snapshot (copy-on-write);
    an event that changes nothing the RM counts (a status write, a label) publishes nothing.
    """

    what = "pod"
    resource = resources.PODS

    def __init__(
        self,
        *,
        api: ApiClient,
        on_change: Callable[[ClusterPods], None],
        watch_timeout_seconds: int = 300,
        max_backoff: float = 10.0,
        stale_after: float = DEFAULT_STALE_AFTER,
        page_size: int = DEFAULT_POD_PAGE_SIZE,
    ) -> None:
        super().__init__(
            api=api,
            watch_timeout_seconds=watch_timeout_seconds,
            max_backoff=max_backoff,
            stale_after=stale_after,
        )
        self.page_size = page_size
        self._on_change = on_change
        self._pods: dict[str, BoundPod] = {}  # by UID
        self._by_node: dict[str, dict[str, BoundPod]] = {}
        self._snapshot = ClusterPods()

    def _selectors(self) -> dict[str, str]:
        return {"field_selector": "spec.nodeName!="}

    @staticmethod
    def _project(raw: Mapping[str, Any]) -> BoundPod | None:
        try:
            return bound_pod(raw)
        except PodResourcesError as error:
            metadata = raw.get("metadata") or {}
            log.warning(
                "pod mirror: not counting pod %s/%s: %s",
                metadata.get("namespace"),
                metadata.get("name"),
                error,
            )
            return None

    def _listed(self, raw: Mapping[str, Any]) -> BoundPod | None:
        return self._project(raw)

    def _replace(self, listed: Mapping[str, Any]) -> None:
        pods: list[BoundPod] = [pod for pod in listed.values() if pod is not None]
        self._pods = {pod.uid: pod for pod in pods}
        self._by_node = {}
        for pod in pods:
            self._by_node.setdefault(pod.node, {})[pod.uid] = pod
        self._snapshot = ClusterPods.of(pods)
        self._on_change(self._snapshot)

    def _apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        uid = str((raw.get("metadata") or {}).get("uid") or "")
        old = self._pods.get(uid)
        new = None if kind == "DELETED" else self._project(raw)
        if old == new:
            return
        if old is not None:
            del self._pods[uid]
            self._by_node.get(old.node, {}).pop(uid, None)
        if new is not None:
            self._pods[uid] = new
            self._by_node.setdefault(new.node, {})[uid] = new
        for node in {pod.node for pod in (old, new) if pod is not None}:
            members = self._by_node.get(node, {})
            if not members:
                self._by_node.pop(node, None)
            self._snapshot = self._snapshot.with_node(node, members.values())
        self._on_change(self._snapshot)


class BudgetMirror(_ListWatch):
    """Keeps ``on_change`` fed with the cluster's PodDisruptionBudgets (policy/v1), slim.

    Preemption alone reads them, to spare protected pods where it can (see
    :mod:`bindery.reference_rm.preemption`); placement does not. So they do not gate readiness: an
    RM whose service account may not list them (a chart older than this mirror) places as before,
    logs which permission it lacks, and chooses victims as if no budget existed.
    """

    what = "poddisruptionbudget"
    resource = resources.POD_DISRUPTION_BUDGETS

    def __init__(
        self,
        *,
        api: ApiClient,
        on_change: Callable[[BudgetIndex], None],
        watch_timeout_seconds: int = 300,
        max_backoff: float = 10.0,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> None:
        super().__init__(
            api=api,
            watch_timeout_seconds=watch_timeout_seconds,
            max_backoff=max_backoff,
            stale_after=stale_after,
        )
        self._on_change = on_change
        self._budgets = BudgetIndex()

    def _selectors(self) -> dict[str, str]:
        return {}

    def _listed(self, raw: Mapping[str, Any]) -> Budget:
        return budget_from(raw)

    def _replace(self, listed: Mapping[str, Any]) -> None:
        self._budgets = BudgetIndex.of(listed.values())
        self._on_change(self._budgets)

    def _apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        # Kept as events arrive: a change rebuilds its namespace's entry, not the cluster's list.
        budget = budget_from(raw)
        if kind == "DELETED":
            changed = self._budgets.remove(budget.namespace, budget.name)
        elif budget in self._budgets.in_namespace(budget.namespace):
            return
        else:
            changed = self._budgets.put(budget)
        if changed is self._budgets:
            return
        self._budgets = changed
        self._on_change(changed)


class MirrorGate:
    """Hands the RM its node inventory only once the pods bound to nodes are known as well.

    The server is ready as soon as it has an inventory; holding the inventory back until the first
    pod list arrived keeps it at 503 instead of placing reservations on nodes that may be full.
    """

    def __init__(
        self,
        *,
        set_inventory: Callable[[Sequence[InventoryNode]], None],
        set_bound_pods: Callable[[ClusterPods], None],
    ) -> None:
        self._set_inventory = set_inventory
        self._set_bound_pods = set_bound_pods
        self._held: Sequence[InventoryNode] | None = None
        self._pods_known = False

    def nodes(self, nodes: Sequence[InventoryNode]) -> None:
        if self._pods_known:
            self._set_inventory(nodes)
        else:
            self._held = nodes

    def pods(self, pods: ClusterPods) -> None:
        self._set_bound_pods(pods)
        if not self._pods_known:
            self._pods_known = True
            if self._held is not None:
                self._set_inventory(self._held)
                self._held = None
