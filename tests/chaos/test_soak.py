"""A 12 s run of the soak's loop (`scripts/soak` runs it for as long as asked): the figures it prints
are really read, and the operator's per-pod structures drain to 0 once every pod is gone. Three
samples 4 s apart are as many as the loop's checks need; the churn acts every 0.2-0.8 s, so the
structures fill within the first (a 30 s run read 16 queue entries at its first sample, 10 s in)."""

from __future__ import annotations

import pathlib

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.chaos.harness import chaos_seed
from tests.chaos.soak import soak

pytestmark = [pytest.mark.chaos, pytest.mark.controlplane, pytest.mark.timeout(300)]


async def test_soak_loop_samples_and_drains_per_pod_structures(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    seed = chaos_seed()
    samples = await soak(
        api=kube_api,
        admin_kubeconfig=controlplane.kubeconfig,
        operator_kubeconfig=operator_kubeconfig,
        namespace=namespace,
        directory=tmp_path,
        seconds=12,
        interval=4,
        seed=seed,
    )
    *during, drained = samples
    assert len(during) >= 3, samples
    assert all(s.rss_kib > 0 and s.fds > 0 and s.tasks for s in samples), samples
    assert max(s.created for s in during) > 0, f"seed={seed}: the churn created no pods"
    assert drained.per_pod, f"seed={seed}: the operator exposes no bindery_per_pod_entries"
    # Pods that fit no node stay pending meanwhile: the gauges read structures that really fill.
    assert any(any(s.per_pod.values()) for s in during), f"seed={seed}: per-pod entries never above 0"
    assert drained.pods == 0, drained.line()
    left = {k: v for k, v in drained.per_pod.items() if v}
    assert not left, f"seed={seed}: per-pod entries left after every pod was deleted: {left}"
