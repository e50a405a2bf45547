"""Fixtures for the chart tests: the real helm binary, with its state kept in a temp directory."""

from __future__ import annotations

import os
import pathlib

import pytest

from bindery.devcluster import binaries


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm built with the dev control plane (`python -m bindery.devcluster build`)."""
    return str(binaries.binary("helm"))


@pytest.fixture(scope="session")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for offline helm commands (lint, template, package): no kubeconfig at all."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
        KUBECONFIG=str(pathlib.Path(home / "no-cluster.kubeconfig")),
    )
    return env
