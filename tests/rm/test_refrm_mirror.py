"""The reference RM mirroring Node objects of the REAL dev control plane (no mocked API)."""

from __future__ import annotations

import asyncio
import pathlib
import signal
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from bindery.reference_rm import serve_reference_rm
from bindery.reference_rm.cli import serve_command, served_url
from bindery.reference_rm.mirror import NodeMirror
from bindery.reference_rm.placement import InventoryNode
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnavailable, RMUnschedulable
from bindery.rm.models import Placement, PodIdentity, ReservationRequest

from .conftest import TOKEN


async def eventually(condition: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(30):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


def gpu_request(uid: str, *, tolerate: bool = False) -> ReservationRequest:
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace="ns", name=uid, scheduler_name="bindery"),
        resources={"cpu": "1", "nvidia.com/gpu": "1"},
        placement=Placement.model_validate({"tolerations": [{"operator": "Exists"}] if tolerate else []}),
        idempotency_key=uid,
        ttl_seconds=60,
    )


@pytest.mark.controlplane
async def test_a_node_event_that_changes_no_inventory_entry_publishes_nothing(
    kube_api: client.ApiClient,
) -> None:
    """A heartbeat (a condition's timestamps) leaves the node's inventory entry as it was: no new
    inventory is published (it would make the next placement re-evaluate every node).  Proven by
    order, not by waiting: the heartbeat's event arrives before the label change's, so the label
    change must be the one publish after the first list."""
    pool = uuid.uuid4().hex[:8]
    labels = {"bindery.dev/test-pool": pool}
    name = f"mirror-{pool}-quiet"
    core = client.CoreV1Api(kube_api)
    published: list[list[InventoryNode]] = []
    mirror = NodeMirror(
        api=kube_api,
        label_selector=f"bindery.dev/test-pool={pool}",
        on_change=lambda n: published.append(list(n)),
    )
    await create_node(kube_api, name=name, capacity={"cpu": "4", "pods": "110"}, labels=labels)
    task = asyncio.create_task(mirror.run())
    try:
        await eventually(
            lambda: bool(published) and [n.name for n in published[-1]] == [name], "the node listed"
        )
        listed = len(published)
        heartbeat = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "lastHeartbeatTime": "2030-01-01T00:00:00Z",
        }
        await core.patch_node_status(name=name, body={"status": {"conditions": [heartbeat]}})
        await core.patch_node(name=name, body={"metadata": {"labels": {"zone": "b"}}})
        await eventually(
            lambda: any(n.labels.get("zone") == "b" for nodes in published for n in nodes),
            "the label mirrored",
        )
        assert len(published) == listed + 1, [[n.labels for n in nodes] for nodes in published[listed:]]
    finally:
        task.cancel()
        await core.delete_node(name=name)


@pytest.mark.controlplane
async def test_mirrors_selected_ready_nodes(kube_api: client.ApiClient, tmp_path: pathlib.Path) -> None:
    pool = uuid.uuid4().hex[:8]
    selector = f"bindery.dev/test-pool={pool}"
    labels = {"bindery.dev/test-pool": pool}
    names = [f"mirror-{pool}-{suffix}" for suffix in ("gpu", "tainted", "other")]
    core = client.CoreV1Api(kube_api)
    async with serve_reference_rm(db_path=tmp_path / "rm.sqlite", inventory=None, token=TOKEN) as server:
        mirror = NodeMirror(api=kube_api, label_selector=selector, on_change=server.rm.set_inventory)
        task = asyncio.create_task(mirror.run())
        try:
            async with ResourceManagerClient(
                base_url=server.url, token=TOKEN, allow_insecure_http=True, max_attempts=1
            ) as rm:
                await eventually(lambda: server.rm.inventory is not None, "the first list arrived")
                await rm.check_ready()
                gpu = {"cpu": "4", "memory": "8Gi", "pods": "110", "nvidia.com/gpu": "2"}
                await create_node(kube_api, name=names[0], capacity=gpu, labels=labels)
                await create_node(
                    kube_api,
                    name=names[1],
                    capacity=gpu,
                    labels=labels,
                    taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}],
                )
                await create_node(kube_api, name=names[2], capacity=gpu)  # not in the pool
                await eventually(
                    lambda: {n.name for n in server.rm.inventory or ()} == set(names[:2]),
                    "both pool nodes mirrored",
                )
                mirrored = next(n for n in server.rm.inventory or () if n.name == names[0])
                assert mirrored.allocatable["nvidia.com/gpu"] == 2
                assert (await rm.reserve(gpu_request("p1"))).node == names[0]
                assert (await rm.reserve(gpu_request("p2", tolerate=True))).node == names[0]  # bin-pack
                assert (await rm.reserve(gpu_request("p3", tolerate=True))).node == names[1]

                # The GPU node goes NotReady: the mirror drops it and nothing else fits.
                status = {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}
                await core.patch_node_status(name=names[0], body={"status": status})
                await eventually(
                    lambda: {n.name for n in server.rm.inventory or ()} == {names[1]},
                    "the NotReady node dropped",
                )
                with pytest.raises(RMUnschedulable) as unschedulable:
                    await rm.reserve(gpu_request("p4"))
                assert unschedulable.value.reason == (
                    "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: x}."
                )
                # Relabelled out of the pool: gone as well.
                await core.patch_node(
                    name=names[1], body={"metadata": {"labels": {"bindery.dev/test-pool": "elsewhere"}}}
                )
                await eventually(lambda: not server.rm.inventory, "the relabelled node dropped")
        finally:
            task.cancel()
            for name in names:
                await core.delete_node(name=name)


async def test_not_ready_until_inventory_known(tmp_path: pathlib.Path) -> None:
    async with (
        serve_reference_rm(db_path=tmp_path / "rm.sqlite", inventory=None, token=TOKEN) as server,
        ResourceManagerClient(
            base_url=server.url, token=TOKEN, allow_insecure_http=True, max_attempts=1
        ) as rm,
    ):
        with pytest.raises(RMUnavailable, match="inventory is not loaded"):
            await rm.check_ready()
        with pytest.raises(RMUnavailable, match="HTTP 503"):
            await rm.reserve(gpu_request("early"))


@pytest.mark.controlplane
async def test_cli_mirror_mode_end_to_end(
    controlplane: Any, kube_api: client.ApiClient, tmp_path: pathlib.Path, token_file: pathlib.Path
) -> None:
    """`bindery rm serve --mirror-nodes` as a process, reading the real apiserver through a kubeconfig."""
    pool = uuid.uuid4().hex[:8]
    name = f"cli-mirror-{pool}"
    options = [
        "--mirror-nodes",
        "--node-selector",
        f"bindery.dev/test-pool={pool}",
        "--kubeconfig",
        str(controlplane.kubeconfig),
    ]
    process = await asyncio.create_subprocess_exec(
        *serve_command(db=tmp_path / "rm.sqlite", token_file=token_file, options=options),
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        url = served_url(await asyncio.wait_for(process.stdout.readline(), timeout=60))
        await create_node(
            kube_api,
            name=name,
            capacity={"cpu": "2", "memory": "1Gi", "pods": "10", "nvidia.com/gpu": "1"},
            labels={"bindery.dev/test-pool": pool},
        )
        async with ResourceManagerClient(base_url=url, token_file=token_file, allow_insecure_http=True) as rm:
            async with asyncio.timeout(60):
                while True:
                    try:
                        reservation = await rm.reserve(gpu_request(f"cli-{pool}"))
                        break
                    except (RMUnavailable, RMUnschedulable):
                        await asyncio.sleep(0.1)  # not ready, or the node not mirrored yet
            assert reservation.node == name
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=30) == 0
        await client.CoreV1Api(kube_api).delete_node(name=name)
