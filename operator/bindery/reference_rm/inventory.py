"""The reference RM's inventory: from a YAML file, or from Kubernetes Node objects.

Both sources end up as the same immutable tuple of :class:`InventoryNode`, which the server swaps
atomically when the mirror sees a change.  Parsing is pure and strict: a typo in an inventory file
must fail at start-up with the file position, not silently give a node zero GPUs.

File format::

    nodes:
      - name: gpu-1
        labels: {zone: a}
        taints: [{key: dedicated, value: gpu, effect: NoSchedule}]
        unschedulable: false
        allocatable: {cpu: "8", memory: 32Gi, pods: "110", nvidia.com/gpu: "4"}
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import yaml

from bindery.quantity import QuantityError, parse_nonnegative_quantity
from bindery.reference_rm.placement import InventoryNode
from bindery.rm.models import is_qualified_name

__all__ = ["InventoryError", "load_inventory_file", "node_from_object", "parse_inventory"]

_NODE_KEYS = {"name", "labels", "taints", "allocatable", "unschedulable"}
_TAINT_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}


class InventoryError(ValueError):
    """The inventory is malformed; the message names the node and field."""


def _string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InventoryError(f"{where} must be a mapping of strings to strings (quote numbers, e.g. '1')")
    return dict(value)


def _allocatable(value: Any, where: str) -> dict[str, Decimal]:
    if not isinstance(value, Mapping) or not value:
        raise InventoryError(f"{where}.allocatable must be a non-empty mapping of resource name to quantity")
    result: dict[str, Decimal] = {}
    for name, amount in value.items():
        if not isinstance(name, str) or not is_qualified_name(name):
            raise InventoryError(f"{where}.allocatable: {name!r} is not a valid resource name")
        if not isinstance(amount, str | int) or isinstance(amount, bool):
            raise InventoryError(f"{where}.allocatable.{name} must be a quantity string such as '4' or '8Gi'")
        try:
            result[name] = parse_nonnegative_quantity(amount, what=f"{where}.allocatable.{name}")
        except QuantityError as error:
            raise InventoryError(str(error)) from None
    return result


def _taints(value: Any, where: str) -> tuple[Mapping[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InventoryError(f"{where}.taints must be a list")
    taints = []
    for index, taint in enumerate(value):
        if not isinstance(taint, Mapping) or not isinstance(taint.get("key"), str) or not taint["key"]:
            raise InventoryError(f"{where}.taints[{index}] needs a non-empty string key")
        if taint.get("effect") not in _TAINT_EFFECTS:
            raise InventoryError(f"{where}.taints[{index}].effect must be one of {sorted(_TAINT_EFFECTS)}")
        taints.append(
            {"key": taint["key"], "value": str(taint.get("value") or ""), "effect": taint["effect"]}
        )
    return tuple(taints)


def parse_inventory(document: Any) -> tuple[InventoryNode, ...]:
    """Validate a parsed inventory document (``{nodes: [...]}``) into nodes sorted by name."""
    if not isinstance(document, Mapping) or not isinstance(document.get("nodes"), list):
        raise InventoryError("the inventory must be a mapping with a 'nodes' list")
    nodes: dict[str, InventoryNode] = {}
    for index, entry in enumerate(document["nodes"]):
        where = f"nodes[{index}]"
        if not isinstance(entry, Mapping):
            raise InventoryError(f"{where} must be a mapping")
        unknown = set(entry) - _NODE_KEYS
        if unknown:
            raise InventoryError(f"{where} has unknown keys {sorted(unknown)}; allowed: {sorted(_NODE_KEYS)}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise InventoryError(f"{where}.name must be a non-empty string")
        where = f"nodes[{index}] ({name})"
        if name in nodes:
            raise InventoryError(f"{where}: node {name!r} appears twice")
        unschedulable = entry.get("unschedulable", False)
        if not isinstance(unschedulable, bool):
            raise InventoryError(f"{where}.unschedulable must be true or false")
        nodes[name] = InventoryNode(
            name=name,
            allocatable=_allocatable(entry.get("allocatable"), where),
            labels=_string_map(entry.get("labels"), f"{where}.labels"),
            taints=_taints(entry.get("taints"), where),
            unschedulable=unschedulable,
        )
    return tuple(nodes[name] for name in sorted(nodes))


def load_inventory_file(path: pathlib.Path) -> tuple[InventoryNode, ...]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InventoryError(f"cannot read the inventory file {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise InventoryError(f"the inventory file {path} is not valid YAML: {error}") from None
    try:
        return parse_inventory(document)
    except InventoryError as error:
        raise InventoryError(f"{path}: {error}") from None


def _is_ready(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def node_from_object(obj: Mapping[str, Any]) -> InventoryNode | None:
    """A Kubernetes Node (JSON shape) as inventory, or None when it must not receive pods.

    Only Ready nodes that are not being deleted count; capacity is ``status.allocatable``.
    Resources whose quantity does not parse are skipped rather than failing the whole mirror.
    """
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    if metadata.get("deletionTimestamp") or not _is_ready(status):
        return None
    allocatable: dict[str, Decimal] = {}
    for name, amount in (status.get("allocatable") or {}).items():
        try:
            allocatable[name] = parse_nonnegative_quantity(amount)
        except QuantityError:
            continue
    taints = tuple(
        {"key": t.get("key", ""), "value": t.get("value") or "", "effect": t.get("effect", "")}
        for t in spec.get("taints") or []
    )
    return InventoryNode(
        name=str(metadata.get("name", "")),
        allocatable=allocatable,
        labels=dict(metadata.get("labels") or {}),
        taints=taints,
        unschedulable=bool(spec.get("unschedulable", False)),
    )
