"""Read what `bindery explain` joins: the pod, its events and claims, and its resource manager's view.

With the kubeconfig alone, read-only, like `bindery audit`: the ResourceManager objects and their
token Secrets are read as the operator reads them, so the RM is asked through the same endpoint and
credentials. What cannot be read is said in the answer, never silently left out.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
from typing import Any

from kubernetes_asyncio import client

from bindery.config import ConfigError, parse_resource_manager, route_scheduler_names
from bindery.controller.secrets import CredentialsError, reservations_at
from bindery.explain.facts import Explanation, ReservationView, explain
from bindery.rm.errors import RMError
from bindery.scheduling.podspec import pod_claims

GROUP, VERSION, PLURAL = "bindery.dev", "v1alpha1", "resourcemanagers"


class PodNotFound(LookupError):
    pass


async def _json(response: Any) -> dict[str, Any] | None:
    try:
        if response.status == 404:
            return None
        text = await response.read()
        if response.status >= 300:
            raise client.ApiException(status=response.status, reason=text[:200].decode("utf-8", "replace"))
        body: dict[str, Any] = json.loads(text)
        return body
    finally:
        response.release()


async def explain_pod(*, api: client.ApiClient, namespace: str, name: str) -> Explanation:
    core = client.CoreV1Api(api)
    pod = await _json(await core.read_namespaced_pod(name, namespace, _preload_content=False))
    if pod is None:
        raise PodNotFound(f"pod {namespace}/{name} not found")
    uid = str(pod["metadata"].get("uid") or "")
    events = await _json(
        await core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.uid={uid}", _preload_content=False
        )
    )
    claims = [
        (
            claim,
            await _json(
                await core.read_namespaced_persistent_volume_claim(claim, namespace, _preload_content=False)
            ),
        )
        for claim in pod_claims(name=name, volumes=(pod.get("spec") or {}).get("volumes") or ())
    ]
    scheduler_name = str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")
    objects = await client.CustomObjectsApi(api).list_cluster_custom_object(
        group=GROUP, version=VERSION, plural=PLURAL
    )
    configs = []
    for body in objects.get("items") or ():
        try:
            configs.append(parse_resource_manager(body=body))
        except ConfigError:
            continue  # an invalid one serves nothing (the operator skips it too)
    owner = route_scheduler_names(configs=configs).served.get(scheduler_name)
    config = next((c for c in configs if c.name == owner), None)
    reservations: list[ReservationView] | None = None
    problem = None
    if config is not None:
        try:
            with tempfile.TemporaryDirectory(prefix="bindery-explain-") as directory:
                listed = await reservations_at(
                    api=api, config=config, directory=pathlib.Path(directory), scheduler_name=scheduler_name
                )
            reservations = [
                ReservationView(
                    id=r.id,
                    state=r.state.value,
                    node=r.node,
                    expires_at=r.expires_at.isoformat() if r.expires_at else None,
                )
                for r in listed
                if r.pod_uid == uid
            ]
        except (CredentialsError, RMError, ValueError, OSError) as exc:
            problem = f"could not ask ResourceManager {config.name!r}: {exc}"
    return explain(
        pod=pod,
        resource_manager=owner,
        events=(events or {}).get("items") or [],
        reservations=reservations,
        claims=claims,
        rm_problem=problem,
    )
