"""What Kopf gets: its settings, and Bindery's handlers, registered onto a given registry so one
process can run several operators (tests).

Only handlers that write nothing onto the watched objects are used: `on.event` and `index`. No
on.create/update/delete (they add `kopf.zalando.org/*` annotations), no daemons or timers (they add
finalizers). All per-run state lives in the `Runtime` object stored in Kopf's memo, created at
startup and closed at cleanup, so handlers are plain functions of (event, runtime).

Neither pods nor Nodes are watched through Kopf: the runtime follows the unbound pods
(`bindery.controller.watches.unbound`) and the Nodes (`bindery.controller.watches.nodes`) itself,
since Kopf's per-event machinery cost far more than Bindery's own handling on those watches, and a
Kopf index would hold every handler back until it had listed all its objects. Kopf watches the
ResourceManagers only.

The settings follow (`configure`):

- Kopf watches no pods: the unbound pods (`spec.nodeName=`) are followed by
  `bindery.controller.watches.unbound` outside Kopf's per-event machinery. A pod that gets bound leaves the
  selector and arrives there as a DELETED event (the old object).
- Scanning is disabled: no cluster-wide listing of CRDs and namespaces (and no RBAC for it); the
  resources must exist at startup, which the chart guarantees by installing the CRD first.
- Posting is disabled: Kopf would write core/v1 Events about handler errors onto pods; Bindery
  writes its own events.k8s.io events, exactly like kube-scheduler's.
- Peering is standalone: no KopfPeering objects; high availability is a separate concern.
- No diff base: Kopf deep-copies every event's body into an "essence" to diff it against the last
  handled state, which only on.create/update/delete handlers and daemons use. Bindery has none
  (`on.event` and `index` only), so `NoDiffBase` builds an empty essence and the copy per pod
  event is saved. A changing handler added later must restore Kopf's default storage.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from bindery.apiserver.resources import RESOURCE_MANAGERS
from bindery.controller.startup.options import OperatorOptions
from bindery.controller.startup.runtime import Runtime


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff base that remembers nothing: every essence is empty, no last state is stored."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure(settings: kopf.OperatorSettings, *, watch_timeout: int = 300) -> None:
    """`watch_timeout`: seconds the apiserver keeps one watch request open before Kopf re-watches."""
    settings.scanning.disabled = True
    settings.posting.enabled = False
    settings.peering.standalone = True
    settings.peering.mandatory = False
    settings.watching.server_timeout = watch_timeout
    settings.watching.client_timeout = watch_timeout + 30
    settings.watching.connect_timeout = 10
    settings.queueing.worker_limit = None
    settings.persistence.diffbase_storage = NoDiffBase()


GROUP = RESOURCE_MANAGERS.group
VERSION = RESOURCE_MANAGERS.version
PLURAL = RESOURCE_MANAGERS.plural


def register(*, registry: kopf.OperatorRegistry, options: OperatorOptions | None = None) -> None:
    """Attach Bindery's handlers to `registry`; `options` apply when the memo brings none."""

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
        chosen = memo.get("options") or options or OperatorOptions()
        configure(settings, watch_timeout=chosen.watch_timeout)
        runtime = Runtime(options=chosen, logger=logging.getLogger("bindery.controller"))
        await runtime.start()
        memo["runtime"] = runtime

    @kopf.on.login(registry=registry)
    async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        runtime: Runtime = memo["runtime"]
        return await runtime.connection_info()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime | None = memo.get("runtime")
        if runtime is not None:
            await runtime.close()

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def resource_manager_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime = memo["runtime"]
        await runtime.on_resource_manager_event(event_type=event.get("type"), body=event["object"])
