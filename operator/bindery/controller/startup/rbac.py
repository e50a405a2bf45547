"""The exact permissions the operator needs, as ClusterRole rules (the chart must match these).

Tests run the operator under a minted identity bound to exactly these rules, so a missing or extra
need shows up as a failing test rather than in a user's cluster.

- pods get/list/watch: the `spec.nodeName=` watch and the `spec.nodeName!=` one; `get` for the
  reconcile passes, the unconfirmed-Binding tracker and the check before a FailedScheduling event.
- pods/binding create: the Binding (one write per pod).
- pods/status patch: the PodScheduled=False condition after a failed attempt; a preemptor's
  nominatedNodeName and its victims' DisruptionTarget condition (contract v1.2 preemption).
- pods/eviction create: evicting a preemption plan's victims (the Eviction API enforces PDBs).
- poddisruptionbudgets list: counting a plan's victims per budget before evicting any (each
  eviction's dry run checks one victim alone).
- events (events.k8s.io) create/patch: Scheduled and FailedScheduling events, as kube-scheduler.
- nodes list/watch: the node index for pre-bind checks.
- services list/watch: their selectors, for kube-scheduler's default spreading of the pods a Service
  selects (bindery.controller.watches.services).
- namespaces list/watch: their labels, for ResourceManagers' spec.namespaceSelector (watched only
  once one has a selector; bindery.controller.watches.namespaces).
- resourcemanagers list/watch, resourcemanagers/status patch: configuration and its status.
- namespaces get, kube-system only: its UID is the default cluster id (contract v1.2 clusterId),
  read once at start (`bindery.adapters.identity`).
- secrets get: the bearer token / TLS material a ResourceManager references (the chart may narrow
  this with resourceNames or a namespaced Role).
- persistentvolumeclaims get/patch, persistentvolumes get/list/patch, storageclasses get: volume
  binding for pods with claims (bindery.scheduling.volumes): read the claims, their volumes and
  classes, set a claim's selected-node annotation, pre-bind a static volume (its claimRef).
- resourceclaims get/list/watch/update, resourceclaims/status update, resourceclaims/binding
  update, deviceclasses and resourceslices list/watch: DRA devices through the RM
  (bindery.scheduling.devices), as kube-scheduler's DynamicResources: read a pod's claims and
  their classes, write the finalizer, then the allocation and reservedFor, and undo them.
- tokenreviews create, subjectaccessreviews create: who asks for `/debug/queue` (and `/metrics`
  with `--metrics-auth`), and whether they may (bindery.adapters.access), as kube-scheduler's
  delegated authentication and authorization (the `system:auth-delegator` ClusterRole's rules).
Not needed: Kopf's peering objects (standalone), CRD listing (Kopf's scanning disabled), core
events (Kopf's posting disabled), finalizers or pod patches (no change-detection handlers).
"""

from __future__ import annotations

from typing import Any

OPERATOR_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["bindery.dev"], "resources": ["resourcemanagers"], "verbs": ["list", "watch"]},
    {"apiGroups": ["bindery.dev"], "resources": ["resourcemanagers/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get"]},
    {"apiGroups": ["storage.k8s.io"], "resources": ["csinodes"], "verbs": ["list"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims"],
        "verbs": ["get", "list", "watch", "update"],
    },
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["update"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"], "verbs": ["update"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["deviceclasses", "resourceslices"],
        "verbs": ["list", "watch"],
    },
    {"apiGroups": ["scheduling.k8s.io"], "resources": ["podgroups"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["scheduling.k8s.io"], "resources": ["podgroups/status"], "verbs": ["patch"]},
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]

#: What a reader of the operator's queue views needs (`bindery explain`, curl): the chart's
#: `RELEASE-bindery-debug-reader` ClusterRole; bind it to whoever may see every tenant's pending pods.
DEBUG_READER_RULES: list[dict[str, Any]] = [
    {"nonResourceURLs": ["/debug/queue", "/debug/queue/*"], "verbs": ["get"]},
]


def leader_election_rules(*, lease_name: str | None) -> list[dict[str, Any]]:
    """Only with leader election (`bindery run --leader-elect`), as a Role in the Lease's namespace.

    get/update are limited to the one Lease by name; `create` cannot be (RBAC cannot know the name
    of an object that does not exist yet), so it is granted on leases of that namespace alone.
    `lease_name=None` is a Lease per ResourceManager (`--lease-per-resource-manager`): their names
    follow the ResourceManagers created later, so get/update cover the namespace's leases too.
    """
    named: dict[str, Any] = {} if lease_name is None else {"resourceNames": [lease_name]}
    return [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], **named, "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]


def cluster_role(*, name: str, rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": OPERATOR_RULES if rules is None else rules,
    }


def cluster_role_binding(*, name: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
