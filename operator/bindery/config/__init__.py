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

__all__ = [
    "NODE_CHECK_VALUES",
    "ConfigError",
    "ResourceManagerConfig",
    "Routing",
    "SecretKeyRef",
    "parse_resource_manager",
    "route_scheduler_names",
]
