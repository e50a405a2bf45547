"""The RM credentials a ResourceManager references: never logged, used only from opted-in Secrets.

Issue 20, scenarios 5, 8 and 10: `bindery run --verbose` must not write a token (or a TLS key) it
read from a Secret to its log; a ResourceManager author must not be able to make the operator read,
send away or describe a Secret that was not meant for it; rotating the token fails no pod, and a
token the RM refuses shows in the ResourceManager's status.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.secrets import CREDENTIALS_LABEL
from tests.operator.conftest import Bindery, RealStage, eventually, resource_manager
from tests.operator.fakerm import FakeRM
from tests.realrm import operator_process


async def test_verbose_logging_never_writes_the_token_read_from_a_secret(
    *,
    real_stage: RealStage,
    operator_kubeconfig: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    token = real_stage.rm.token
    async with (
        operator_process(kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--verbose"]) as op,
        real_stage.served(),
    ):
        await real_stage.create("p")
        # Bound: the operator has read the token Secret and used its value at the RM.
        assert await eventually(lambda: real_stage.node_of("p"), within=60, what="the pod bound")
        log = op.log()
    assert " DEBUG " in log, "the operator did not log at DEBUG: the test proves nothing"
    encoded = base64.b64encode(token.encode()).decode()
    leaks = [line for line in log.splitlines() if token in line or encoded in line]
    assert not leaks, "the RM token is in the operator's log:\n" + "\n".join(leaks[:3])


async def _ready(api: client.ApiClient, name: str) -> dict[str, Any]:
    body: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
        group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=name
    )
    found = (body.get("status") or {}).get("conditions") or ()
    return next((c for c in found if c["type"] == "Ready"), {})


async def test_a_secret_without_the_credentials_label_is_not_used_until_labelled(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
) -> None:
    """Scenario 8: a ResourceManager may name any Secret the operator can read; only one its owner
    labelled is sent to the endpoint."""
    name, secret = uniq("rm"), uniq("someone-elses")
    core = client.CoreV1Api(kube_api)
    await core.create_namespaced_secret(
        namespace=namespace, body={"metadata": {"name": secret}, "stringData": {"token": "not-for-you"}}
    )
    auth = {"tokenSecretRef": {"namespace": namespace, "name": secret}}
    async with resource_manager(
        kube_api, name=name, scheduler_names=[uniq("s")], endpoint=fake_rm.url, auth=auth
    ):

        async def refused() -> dict[str, Any] | None:
            ready = await _ready(kube_api, name)
            return ready if ready.get("reason") == "CredentialsUnavailable" else None

        ready = await eventually(refused, within=30, what="Ready=False/CredentialsUnavailable")
        assert ready["status"] == "False"
        assert f"{CREDENTIALS_LABEL}=true" in ready["message"]
        assert f"kubectl label secret -n {namespace} {secret} {CREDENTIALS_LABEL}=true" in ready["message"]

        await core.patch_namespaced_secret(
            name=secret, namespace=namespace, body={"metadata": {"labels": {CREDENTIALS_LABEL: "true"}}}
        )

        async def scheduling() -> bool:
            return (await _ready(kube_api, name)).get("reason") == "Scheduling"

        await eventually(scheduling, within=60, what="Ready=True once the Secret is labelled")


async def test_the_status_never_lists_the_key_names_of_a_secret(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
) -> None:
    name, secret = uniq("rm"), uniq("creds")
    await client.CoreV1Api(kube_api).create_namespaced_secret(
        namespace=namespace,
        body={
            "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
            "stringData": {"db-password-of-team-a": "x"},
        },
    )
    auth = {"tokenSecretRef": {"namespace": namespace, "name": secret}}
    async with resource_manager(
        kube_api, name=name, scheduler_names=[uniq("s")], endpoint=fake_rm.url, auth=auth
    ):

        async def refused() -> dict[str, Any] | None:
            ready = await _ready(kube_api, name)
            return ready if ready.get("reason") == "CredentialsUnavailable" else None

        ready = await eventually(refused, within=30, what="Ready=False/CredentialsUnavailable")
        assert "'token'" in ready["message"]
        assert "db-password-of-team-a" not in ready["message"]
        body = await client.CustomObjectsApi(kube_api).get_cluster_custom_object(
            group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=name
        )
        assert "db-password-of-team-a" not in str(body.get("status"))


def _replace_atomically(path: pathlib.Path, content: str) -> None:
    """As the kubelet's atomic writer updates a mounted Secret: the new file appears in one rename."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(content)
    os.replace(staged, path)


async def _set_secret_token(api: client.ApiClient, *, namespace: str, name: str, token: str) -> None:
    await client.CoreV1Api(api).patch_namespaced_secret(
        name=name, namespace=namespace, body={"stringData": {"token": token}}
    )


async def test_rotating_the_token_while_pods_are_scheduled_fails_no_pod(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    real_stage: RealStage,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario 10 in both orders: the operator's Secret changes before the RM's token file (the RM
    refuses the new token: the operator falls back to the previous one), then the RM's file changes
    first (the RM accepts the previous token for its overlap; the operator re-reads its Secret after
    any 401). Pods are created throughout; none gets a FailedScheduling."""
    caplog.set_level(logging.INFO)
    stage = real_stage
    names: list[str] = []

    async def create(prefix: str, count: int) -> None:
        for i in range(count):
            names.append(f"{prefix}-{i}")
            await stage.create(names[-1])
            await asyncio.sleep(0.2)  # spread over the rotation (pacing, not a wait for anything)

    async def rotated(times: int) -> bool:
        return caplog.text.count("credentials rotated, new RM client") >= times

    async def all_bound() -> bool:
        return all([await stage.node_of(name) for name in names])

    async with stage.served():
        await create("first", 2)
        await eventually(all_bound, within=60, what="the first pods bound")

        # The Secret first: once the operator uses "two", the RM (still on "one") refuses it.
        await _set_secret_token(kube_api, namespace=namespace, name=stage.secret, token="two")
        await eventually(lambda: rotated(1), within=30, what="the operator to read the new token")
        await create("a", 5)
        await eventually(all_bound, within=60, what="the pods created before the RM knew the token")
        _replace_atomically(stage.rm.token_file, "two")
        await create("b", 3)

        # The RM first: it accepts "two" during its overlap; the Secret follows.
        _replace_atomically(stage.rm.token_file, "three")
        creating = asyncio.create_task(create("c", 5))
        await _set_secret_token(kube_api, namespace=namespace, name=stage.secret, token="three")
        await eventually(lambda: rotated(2), within=30, what="the operator to read the second token")
        await creating
        await create("d", 3)

        await eventually(all_bound, within=120, what="every pod bound")
        events = await client.EventsV1Api(kube_api).list_namespaced_event(namespace=namespace)
        failed = [f"{e.regarding.name}: {e.note}" for e in events.items if e.reason == "FailedScheduling"]
        assert not failed, "pods failed during the rotation:\n" + "\n".join(failed)


async def test_a_token_the_rm_refuses_shows_ready_false_token_refused(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    real_stage: RealStage,
    uniq: Callable[[str], str],
) -> None:
    name, secret = uniq("rm-wrong"), uniq("wrong-token")
    await client.CoreV1Api(kube_api).create_namespaced_secret(
        namespace=namespace,
        body={
            "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
            "stringData": {"token": "not-the-rms-token"},
        },
    )
    auth = {"tokenSecretRef": {"namespace": namespace, "name": secret}}
    async with resource_manager(
        kube_api, name=name, scheduler_names=[uniq("s")], endpoint=real_stage.rm.url, auth=auth
    ):

        async def settled() -> dict[str, Any] | None:
            ready = await _ready(kube_api, name)
            return ready if ready.get("status") in ("True", "False") else None

        ready = await eventually(settled, within=60, what="Ready True or False")
        assert (ready["status"], ready["reason"]) == ("False", "TokenRefused"), ready
        assert "refused the bearer token" in ready["message"]

        await _set_secret_token(kube_api, namespace=namespace, name=secret, token=real_stage.rm.token)

        async def scheduling() -> bool:
            return (await _ready(kube_api, name)).get("reason") == "Scheduling"

        await eventually(scheduling, within=60, what="Ready=True once the Secret holds the RM's token")
