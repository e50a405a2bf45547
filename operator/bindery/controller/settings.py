"""Kopf settings for a scheduler: watch little, write nothing, post no events of Kopf's own.

- Kopf watches no pods: the unbound pods (`UNBOUND_PODS`, `spec.nodeName=`) are followed by
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

from typing import Any

import kopf

UNBOUND_PODS = "spec.nodeName="


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
