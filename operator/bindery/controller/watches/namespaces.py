"""The labels of every namespace, for ResourceManagers' `spec.namespaceSelector`.

Why a watch and not a read per pod: routing runs on the hot path, once per pod event, without I/O;
and a namespace's labels change at run time (a cluster administrator admits a namespace to a pool,
or takes it out), which must take effect without a restart. So the operator follows namespaces
with the one list-then-watch loop (:func:`bindery.apiserver.watching.list_watch`) and keeps only each
one's labels (a few per namespace). A relabel reaches `on_change` as soon as the watch delivers it
(one watch event: no polling, no periodic resync); the pending pods of that namespace are then
routed again. A namespace not seen yet (the watch has not listed, or a new namespace's event is behind
its first pod's) is unknown: its pods wait for it, neither offered nor refused. The first list
is announced once (`on_synced`), not namespace by namespace: routing every pending pod again per
listed namespace would cost namespaces × pods at start.

Started by the runtime only once some ResourceManager has a selector, so an operator without one
keeps its former requests (and needs no permission on namespaces until then).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bindery.apiserver import resources
from bindery.apiserver.api import ApiClient
from bindery.apiserver.errors import ApiError
from bindery.apiserver.watching import WATCH_BACKOFF, Cursor, Event, Listed, identity, list_watch
from bindery.backoff import Backoff, BackoffPolicy
from bindery.typedefs import Logger

#: Explicit bound on one page of the LIST.
LIST_TIMEOUT_SECONDS = 60.0


class NamespaceLabels:
    """name → labels of every namespace, kept current by :meth:`run` until cancelled."""

    def __init__(
        self,
        *,
        api: ApiClient,
        on_change: Callable[[str], None],
        on_synced: Callable[[], None],
        logger: Logger,
        watch_seconds: int = 300,
        max_backoff: float = 10.0,
    ) -> None:
        self._api = api
        self._on_change = on_change
        self._on_synced = on_synced
        self._logger = logger
        self._watch_seconds = watch_seconds
        self._max_backoff = max_backoff
        self._labels: dict[str, Mapping[str, str]] = {}
        self.lists = 0  #: completed lists (tests wait on it)

    def labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels, or None while it is unknown (not listed or watched yet)."""
        return self._labels.get(namespace)

    def __len__(self) -> int:
        return len(self._labels)

    async def run(self) -> None:
        async for item in list_watch(
            self._api,
            resources.NAMESPACES,
            watch_seconds=self._watch_seconds,
            list_timeout=LIST_TIMEOUT_SECONDS,
            cursor=Cursor(remember=identity),
            backoff=Backoff(BackoffPolicy(initial=WATCH_BACKOFF.initial, maximum=self._max_backoff)),
            logger=self._logger,
            what="namespaces (for ResourceManagers' spec.namespaceSelector)",
            hint=_hint,
        ):
            if isinstance(item, Listed):
                self.lists += 1
                if self.lists == 1:
                    self._notify(self._on_synced, "every namespace")
            elif isinstance(item, Event):
                self._handle(item.type, item.object)

    def _handle(self, event_type: str | None, namespace: Mapping[str, Any]) -> None:
        metadata = namespace.get("metadata") or {}
        name = str(metadata.get("name") or "")
        if not name:
            return
        if event_type == "DELETED":
            self._labels.pop(name, None)
            return  # its pods are deleted with it; nothing to route
        labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
        if self._labels.get(name) == labels:
            return
        self._labels[name] = labels
        if self.lists:  # the first list's namespaces are announced together, by on_synced
            self._notify(lambda: self._on_change(name), f"namespace {name}")

    def _notify(self, call: Callable[[], None], what: str) -> None:
        try:
            call()
        except Exception as exc:  # one namespace's routing must not end the watch of all
            self._logger.warning(f"routing the pending pods of {what} after its labels changed failed: {exc}")


def _hint(error: ApiError) -> str:
    if error.status == 403:
        return (
            "the operator needs list and watch on namespaces for ResourceManagers with "
            "spec.namespaceSelector (bindery.controller.startup.rbac); their pods wait until it can read them"
        )
    return ""
