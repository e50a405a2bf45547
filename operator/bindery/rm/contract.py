"""Locate and load the OpenAPI document of contract v1.

In a wheel the document is force-included as ``bindery/rm/openapi.yaml``; in a source checkout it
lives at ``contract/v1/openapi.yaml``.  Both the reference RM (which serves it) and the tests (which
validate and fuzz against it) must read the very same file, so there is exactly one loader.
"""

from __future__ import annotations

import functools
import importlib.resources
import pathlib
from typing import Any

import yaml

__all__ = ["load_openapi", "openapi_text"]

_REPO_PATH = pathlib.Path(__file__).resolve().parents[3] / "contract" / "v1" / "openapi.yaml"


@functools.cache
def openapi_text() -> str:
    """The document as text: the packaged copy if installed from a wheel, else the repository's."""
    packaged = importlib.resources.files("bindery.rm").joinpath("openapi.yaml")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    if _REPO_PATH.is_file():
        return _REPO_PATH.read_text(encoding="utf-8")
    raise FileNotFoundError(
        f"the RM contract document is missing: neither bindery/rm/openapi.yaml (wheel) nor {_REPO_PATH} "
        "(source checkout) exists; reinstall kube-bindery"
    )


def load_openapi() -> dict[str, Any]:
    """The document parsed into plain data (a fresh copy each call)."""
    document = yaml.safe_load(openapi_text())
    if not isinstance(document, dict):
        raise ValueError("the RM contract document is not a YAML mapping")
    return document
