"""The kube-apiserver restarts with the same flags while etcd keeps every object."""

from __future__ import annotations

import uuid

import pytest

from bindery.devcluster.plane import ControlPlane, ControlPlaneError

pytestmark = pytest.mark.controlplane


def test_the_apiserver_restarts_on_the_same_address_and_keeps_what_etcd_holds() -> None:
    with ControlPlane.start() as plane:
        name = f"kept-{uuid.uuid4().hex[:6]}"
        plane.kubectl("create", "configmap", name, "--from-literal=k=v")
        server = plane.server
        plane.stop_apiserver()
        down = plane.kubectl("get", "configmap", name, "--request-timeout=5s", check=False)
        assert down.returncode != 0
        assert "refused" in down.stderr
        plane.start_apiserver()
        assert plane.server == server
        kept = plane.kubectl("get", "configmap", name, "-o", "jsonpath={.data.k}")
        assert kept.stdout == "v"
        plane.restart_apiserver(down_seconds=0.5)
        assert plane.kubectl("get", "configmap", name, "-o", "name").stdout.strip() == f"configmap/{name}"
        with pytest.raises(ControlPlaneError, match="is running"):
            plane.start_apiserver()  # already running: refused rather than a second process
