"""`bindery explain` on the real apiserver, with the reference RM and the operator as processes: a pod
the RM has no room for, a bound pod, a pod in backoff while its RM is down, a pod of a name nobody
serves, and a pod that does not exist. It runs as a user runs it (`python -m bindery explain`)."""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.startup.install import grant_debug_reader
from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import condition, create_pod, eventually, node_of, pod_body, read_pod
from tests.realrm import scene

pytestmark = pytest.mark.controlplane


async def _explain(kubeconfig: pathlib.Path, *args: str) -> tuple[int, str, str]:
    """Exit status, standard output, standard error (where the RM client's retries are logged)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bindery", "explain", *args, "--kubeconfig", str(kubeconfig),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _answer(kubeconfig: pathlib.Path, namespace: str, name: str, *args: str) -> dict[str, Any]:
    status, out, err = await _explain(kubeconfig, name, "-n", namespace, "-o", "json", *args)
    assert status == 0, out + err
    answer: dict[str, Any] = json.loads(out)
    return answer


async def _reader_token(kube_api: client.ApiClient, *, namespace: str) -> str:
    """A ServiceAccount bound to the queue views' reader role (as the chart's debug-reader), its token."""
    core = client.CoreV1Api(kube_api)
    await core.create_namespaced_service_account(
        namespace=namespace, body={"metadata": {"name": "explainer"}}
    )
    await grant_debug_reader(
        api=kube_api, user=f"system:serviceaccount:{namespace}:explainer", name=f"{namespace}-debug-reader"
    )
    answer = await core.create_namespaced_service_account_token(
        name="explainer", namespace=namespace, body={"spec": {"expirationSeconds": 3600}}
    )
    token: str = answer.status.token
    return token


async def test_explain_says_why_a_pod_is_pending_or_where_it_was_bound(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    admin = controlplane.kubeconfig
    async with scene(
        kube_api,
        admin_kubeconfig=admin,
        operator_kubeconfig=operator_kubeconfig,
        namespace=namespace,
        directory=tmp_path,
        capacity={"cpu": "2", "memory": "8Gi", "pods": "20"},
    ) as stage:
        # Bound: where, with which reservation, how long it took.
        await create_pod(
            kube_api, namespace=namespace, body=pod_body(name="fits", scheduler_name=stage.scheduler)
        )
        await eventually(lambda: node_of(kube_api, namespace=namespace, name="fits"), within=60, what="bound")

        async def committed() -> dict[str, Any] | None:
            answer = await _answer(admin, namespace, "fits")
            return answer if [r["state"] for r in answer["reservations"]] == ["committed"] else None

        bound = await eventually(committed, within=60, what="the reservation committed")
        assert bound["resource_manager"] == stage.rm_name
        assert bound["node"] == stage.node
        rid = bound["reservations"][0]["id"]
        assert bound["verdict"].startswith(f"bound to {stage.node}")
        assert f"with reservation {rid} (committed on {stage.node})" in bound["verdict"]
        assert bound["seconds_to_bind"] is not None
        assert [a["reason"] for a in bound["attempts"]] == ["Scheduled"]
        print("\n--- bindery explain fits ---\n" + (await _explain(admin, "fits", "-n", namespace))[1])

        # Pending: the RM has no room (2 CPU node, 1.9 free, 3 asked).
        await create_pod(
            kube_api, namespace=namespace, body=pod_body(name="big", scheduler_name=stage.scheduler, cpu="3")
        )

        async def explained() -> dict[str, Any] | None:
            answer = await _answer(admin, namespace, "big")
            return (
                answer if answer["condition"] and answer["condition"]["reason"] == "Unschedulable" else None
            )

        big = await eventually(explained, within=60, what="the no-room answer")
        assert big["node"] is None
        assert big["verdict"].startswith("not scheduled yet (Unschedulable, no room): ")
        assert "has no room for the pod" in big["verdict"]
        assert big["reservations"] == []
        assert big["attempts"][0]["reason"] == "FailedScheduling"
        # No operator Service in this cluster: explain says it could not see the queue, and why.
        [unseen] = [u for u in big["unseen"] if "next attempt" in u]
        assert unseen.startswith("the operator's queue: found no operator Service"), unseen
        assert big["queue"] is None
        # Through the apiserver's service proxy, as kubectl reaches a Service: one without a ready
        # endpoint is refused by the proxy, which explain reports as such.
        await client.CoreV1Api(kube_api).create_namespaced_service(
            namespace,
            {
                "metadata": {"name": "op-metrics"},
                "spec": {"ports": [{"name": "metrics", "port": 9090, "targetPort": 9090}]},
            },
        )
        proxied = await _answer(admin, namespace, "big", "--operator-service", f"{namespace}/op-metrics")
        [unseen] = [u for u in proxied["unseen"] if "next attempt" in u]
        assert f"service {namespace}/op-metrics:metrics (through the apiserver's proxy)" in unseen, unseen
        assert "the apiserver answered HTTP" in unseen, unseen
        # The operator's own queue (its metrics port; in a cluster, behind that proxy): parked as
        # unschedulable, with its failed attempts and when it is tried next.
        # It answers only a bearer token whose user may get /debug/queue: without one, explain says so.
        operator_url = (await stage.operator.metrics_url()).removesuffix("/metrics")
        refused = await _answer(admin, namespace, "big", "--operator-url", operator_url)
        [unseen] = [u for u in refused["unseen"] if "next attempt" in u]
        assert "refused us (HTTP 401) (pass --operator-token-file)" in unseen, unseen
        token_file = tmp_path / "reader-token"
        token_file.write_text(await _reader_token(kube_api, namespace=namespace))
        operator_url_args = ("--operator-url", operator_url, "--operator-token-file", str(token_file))

        async def parked() -> dict[str, Any] | None:
            answer = await _answer(admin, namespace, "big", *operator_url_args)
            queue = answer["queue"] or {}
            return answer if queue.get("queue") == "unschedulable" else None

        queued = await eventually(parked, within=60, what="the pod parked in the operator's queue")
        assert queued["queue"]["leading"] is True
        assert queued["queue"]["resource_manager"] == stage.rm_name
        assert queued["queue"]["attempts"] >= 1
        assert queued["queue"]["next_attempt_in_seconds"] is not None
        assert queued["next_attempt"].startswith("parked as unschedulable after ")
        assert not [u for u in queued["unseen"] if "next attempt" in u]
        status, text, _ = await _explain(admin, "big", "-n", namespace, *operator_url_args)
        assert status == 0
        assert "At the resource manager: no active reservation" in text
        assert "Operator queue:    parked as unschedulable after " in text
        print("--- bindery explain big ---\n" + text)

        # The RM is down: the pod is in backoff with a SchedulerError, and explain says it could not ask.
        stage.rm.kill()
        await stage.rm.wait()
        await create_pod(
            kube_api, namespace=namespace, body=pod_body(name="later", scheduler_name=stage.scheduler)
        )

        async def errored() -> dict[str, Any] | None:
            pod = await read_pod(kube_api, namespace=namespace, name="later")
            cond = condition(pod)
            if not cond or cond.get("reason") != "SchedulerError":
                return None
            return await _answer(admin, namespace, "later")

        later = await eventually(errored, within=60, what="the SchedulerError answer")
        assert later["verdict"].startswith("not scheduled yet (SchedulerError, an error): ")
        assert any(f"could not ask ResourceManager {stage.rm_name!r}" in u for u in later["unseen"]), later

        async def backing_off() -> dict[str, Any] | None:
            answer = await _answer(admin, namespace, "later", *operator_url_args)
            return answer if (answer["queue"] or {}).get("queue") == "backoff" else None

        later = await eventually(backing_off, within=60, what="the pod backing off in the operator's queue")
        assert later["next_attempt"].startswith("backing off after ")
        print(
            "--- bindery explain later (RM down) ---\n"
            + (await _explain(admin, "later", "-n", namespace, *operator_url_args))[1]
        )
        await stage.rm.restart()
        await eventually(
            lambda: node_of(kube_api, namespace=namespace, name="later"), within=60, what="bound"
        )

    # A name nobody serves, and a pod that does not exist.
    await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="stray", scheduler_name="nobody-serves-this")
    )
    stray = await _answer(admin, namespace, "stray")
    assert stray["resource_manager"] is None
    assert stray["verdict"] == (
        'no ResourceManager serves scheduler name "nobody-serves-this": Bindery does not schedule this pod'
    )
    status, text, err = await _explain(admin, "ghost", "-n", namespace)
    assert status == 1
    assert text == ""
    assert f"pod {namespace}/ghost not found" in err
