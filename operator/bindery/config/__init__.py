"""Typed configuration parsed from ResourceManager objects.

Pure: turns Kubernetes JSON bodies into frozen dataclasses and decides which scheduler names are
served by which ResourceManager. No I/O, so the controller can rebuild profiles from any event and
the decisions are unit-testable.
"""

from bindery.config.resourcemanager import (
    NODE_CHECK_VALUES,
    ConfigError,
    ResourceManagerConfig,
    SecretKeyRef,
    parse_resource_manager,
)
from bindery.config.routing import Routing, route_scheduler_names
from bindery.config.selector import NamespaceSelector, parse_namespace_selector

__all__ = [
    "NODE_CHECK_VALUES",
    "ConfigError",
    "NamespaceSelector",
    "ResourceManagerConfig",
    "Routing",
    "SecretKeyRef",
    "parse_namespace_selector",
    "parse_resource_manager",
    "route_scheduler_names",
]
