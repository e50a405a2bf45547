"""The selectors of Services, for kube-scheduler's default spreading of the pods they select.

kube-scheduler spreads a pod that states no topology spread constraints with the selector of what
owns it (ReplicaSet, StatefulSet, ReplicationController) and of every Service that selects it
(``podtopologyspread/common.go`` ``buildDefaultConstraints``, ``helper.DefaultSelector``). The
owners are read from the pod itself (bindery.podrules.parse.soft_rules); Services are not, so the
operator follows them with one list-then-watch per scope (all namespaces, or each of its own) and
keeps only each one's ``spec.selector`` (a few labels), none for a Service without one.

Started with the placed-pod watch. Cycles do not wait for its first list: default spreading is a
preference, and a pod placed before the Services are known is placed as before this watch existed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bindery.apiserver import resources
from bindery.apiserver.api import ApiClient
from bindery.apiserver.errors import ApiError
from bindery.apiserver.watching import WATCH_BACKOFF, Cursor, Event, Listed, identity, list_watch, object_key
from bindery.backoff import Backoff, BackoffPolicy
from bindery.typedefs import Logger

LIST_TIMEOUT_SECONDS = 60.0


class ServiceSelectors:
    """namespace → Service (by UID) → selector, of the Services that have one; kept by :meth:`run`."""

    def __init__(
        self,
        *,
        api: ApiClient,
        logger: Logger,
        namespaces: Sequence[str] = (),
        watch_seconds: int = 300,
        max_backoff: float = 10.0,
    ) -> None:
        self._api = api
        self._logger = logger
        self._scopes: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._watch_seconds = watch_seconds
        self._max_backoff = max_backoff
        self._selectors: dict[str, dict[str, Mapping[str, str]]] = {}
        self.lists = 0  #: completed lists, over all scopes (tests wait on it)

    def selectors(self, namespace: str) -> Iterable[Mapping[str, str]]:
        """The selectors of the Services of `namespace` that have one."""
        return (self._selectors.get(namespace) or {}).values()

    def on_event(self, event_type: str | None, service: Mapping[str, Any]) -> None:
        metadata = service.get("metadata") or {}
        namespace, key = str(metadata.get("namespace") or ""), object_key(service)
        if not namespace:
            return
        selector = (service.get("spec") or {}).get("selector") or {}
        in_namespace = self._selectors.setdefault(namespace, {})
        if event_type == "DELETED" or not selector:
            in_namespace.pop(key, None)
        else:
            in_namespace[key] = {str(k): str(v) for k, v in selector.items()}
        if not in_namespace:
            del self._selectors[namespace]

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for scope in self._scopes:
                group.create_task(
                    self._follow(scope), name=f"bindery services in {scope or 'all namespaces'}"
                )

    async def _follow(self, namespace: str | None) -> None:
        async for item in list_watch(
            self._api,
            resources.SERVICES,
            namespace=namespace,
            watch_seconds=self._watch_seconds,
            list_timeout=LIST_TIMEOUT_SECONDS,
            cursor=Cursor(remember=identity),
            backoff=Backoff(BackoffPolicy(initial=WATCH_BACKOFF.initial, maximum=self._max_backoff)),
            logger=self._logger,
            what=f"services, for default spreading ({namespace or 'all namespaces'})",
            hint=_hint,
        ):
            if isinstance(item, Listed):
                self.lists += 1
            elif isinstance(item, Event):
                try:
                    self.on_event(item.type, item.object)
                except Exception as exc:  # one Service must not end the watch of all
                    self._logger.warning(f"handling a Service {item.type or 'listed'} event failed: {exc}")


def _hint(error: ApiError) -> str:
    if error.status == 403:
        return (
            "the operator needs list and watch on services for kube-scheduler's default spreading of the "
            "pods a Service selects (bindery.controller.startup.rbac); until then such pods are not "
            "spread by it"
        )
    return ""
