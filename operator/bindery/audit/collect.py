"""Read what `bindery audit` judges: ResourceManagers, their reservations, pods and nodes.

The audit needs nothing but the caller's kubeconfig: it reads the ResourceManager objects and their
token Secrets exactly as the operator does (`bindery.controller.secrets`), so it sees each resource
manager through the same endpoint and credentials, and it never writes anything. Whatever it cannot
read (a Secret it may not get, an RM that does not answer) is reported as a gap, not skipped
silently: an audit that did not look must not pass.

An RM may serve other clusters too, whose pods this audit cannot see: it asks an RM of contract
v1.2 only for this cluster's reservations (the cluster id the operator sends, by default the UID of
the `kube-system` namespace) and those made without a cluster id, so another cluster's allocations
are not reported as leaks.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import tempfile
from collections.abc import Mapping
from typing import Any

from bindery.adapters.identity import ClusterIdentityError, cluster_identity
from bindery.apiserver import ApiClient, ApiError, list_all, resources
from bindery.audit.findings import (
    Finding,
    leaked_reservations,
    overcommitted_nodes,
    unexplained_pending,
    unreserved_pods,
)
from bindery.config import ConfigError, ResourceManagerConfig, parse_resource_manager, route_scheduler_names
from bindery.controller.secrets import CredentialsError, reservations_at
from bindery.rm.errors import RMError
from bindery.rm.models import Reservation


@dataclasses.dataclass
class Audit:
    """The findings, what could not be checked, and how much was looked at."""

    findings: list[Finding] = dataclasses.field(default_factory=list)
    gaps: list[str] = dataclasses.field(default_factory=list)
    checked: dict[str, int] = dataclasses.field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "findings": [f.as_json() for f in self.findings],
            "gaps": list(self.gaps),
            "checked": dict(self.checked),
        }


async def _reservations(
    *, api: ApiClient, config: ResourceManagerConfig, directory: pathlib.Path, cluster_id: str | None
) -> list[Reservation]:
    """The active reservations of this cluster, and those made without a cluster id.

    The second kind (made by a v1.1 client, or before the RM spoke v1.2) no reconcile pass of a
    cluster that sends its id sees any more, so the audit is what still finds their leaks.
    """
    listed = await reservations_at(api=api, config=config, directory=directory, cluster_id=cluster_id)
    if cluster_id is not None:
        known = {r.id for r in listed}
        every = await reservations_at(api=api, config=config, directory=directory)
        listed += [r for r in every if r.cluster_id is None and r.id not in known]
    return [r for r in listed if r.state.active]


async def run_audit(
    *,
    api: ApiClient,
    namespaces: tuple[str, ...] = (),
    grace: datetime.timedelta = datetime.timedelta(seconds=60),
    now: datetime.datetime | None = None,
    cluster_id: str | None = None,
) -> Audit:
    """Audit the cluster of `api`; with `namespaces`, only pods and reservations in them.

    `cluster_id` is the id the operator sends (its `--cluster-id`); None derives it as the operator
    does. If it cannot be derived, that is a gap and RMs are asked for every cluster's reservations.
    """
    audit = Audit()
    try:
        cluster = await cluster_identity(api, configured=cluster_id)
    except ClusterIdentityError as exc:
        audit.gaps.append(f"{exc}; reservations of other clusters sharing an RM may be reported as leaks")
        cluster = None
    configs: list[ResourceManagerConfig] = []
    for body in (await list_all(api, resources.RESOURCE_MANAGERS)).items:
        try:
            configs.append(parse_resource_manager(body=body))
        except ConfigError as exc:
            audit.gaps.append(
                f"ResourceManager {(body.get('metadata') or {}).get('name')!r} is invalid: {exc}"
            )
    routing = route_scheduler_names(configs=configs)

    if namespaces:
        pods = [p for ns in namespaces for p in (await list_all(api, resources.PODS, namespace=ns)).items]
    else:
        pods = (await list_all(api, resources.PODS)).items
    try:
        bound = (await list_all(api, resources.PODS, field_selector="spec.nodeName!=")).items
        nodes = (await list_all(api, resources.NODES)).items
    except ApiError as exc:
        audit.gaps.append(
            f"could not list bound pods and nodes to check for overcommitment: {exc.reason or exc.message}"
        )
        bound, nodes = [], []

    reservation_count = 0
    with tempfile.TemporaryDirectory(prefix="bindery-audit-") as directory:
        for config in configs:
            try:
                reservations = await _reservations(
                    api=api, config=config, directory=pathlib.Path(directory), cluster_id=cluster
                )
            except (CredentialsError, RMError, ValueError, OSError) as exc:
                audit.gaps.append(
                    f"could not list the reservations of ResourceManager {config.name!r}: {exc}"
                )
                continue
            if namespaces:
                reservations = [r for r in reservations if r.namespace in namespaces]
            reservation_count += len(reservations)
            names = [n for n, owner in routing.served.items() if owner == config.name]
            audit.findings += leaked_reservations(
                resource_manager=config.name, reservations=reservations, pods=pods
            )
            audit.findings += unreserved_pods(
                resource_manager=config.name, scheduler_names=names, reservations=reservations, pods=pods
            )
    audit.findings += overcommitted_nodes(nodes=nodes, pods=bound)
    audit.findings += unexplained_pending(
        pods=pods, served=routing.served, now=now or datetime.datetime.now(datetime.UTC), grace=grace
    )
    audit.checked = {
        "resourceManagers": len(configs),
        "reservations": reservation_count,
        "pods": len(pods),
        "nodes": len(nodes),
    }
    return audit


def table(audit: Audit) -> str:
    """The human report: one row per finding, then the gaps, then a one-line summary."""
    rows = [("KIND", "OBJECT", "RESOURCE MANAGER", "WHAT IS WRONG")]
    rows += [(f.kind, f.subject, f.resource_manager or "-", f.message) for f in audit.findings]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    if audit.findings:
        lines += [
            "  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)) for row in rows
        ]
    lines += [f"could not check: {gap}" for gap in audit.gaps]
    checked = ", ".join(f"{count} {what}" for what, count in _plain(audit.checked).items())
    verdict = f"{len(audit.findings)} finding(s)" if audit.findings else "no findings"
    lines.append(f"{verdict}{'; audit incomplete' if audit.gaps else ''} ({checked})")
    return "\n".join(lines)


def _plain(checked: Mapping[str, int]) -> dict[str, int]:
    words = {"resourceManagers": "resource managers"}
    return {words.get(key, key): value for key, value in checked.items()}
