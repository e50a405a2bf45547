"""Fixtures of the chaos suite: the operator's identity and the CRD, shared with tests/operator."""

from __future__ import annotations

from tests.operator.conftest import crd, operator_kubeconfig, uniq

__all__ = ["crd", "operator_kubeconfig", "uniq"]
