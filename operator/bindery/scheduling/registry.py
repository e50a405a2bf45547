"""Find plugins by name: registered in-process, or installed under the ``bindery.plugins`` entry points.

A ResourceManager lists plugins by name (``spec.plugins.preBind: [gpu-driver-ready]``); a Python
package provides them by declaring an entry point::

    [project.entry-points."bindery.plugins"]
    gpu-driver-ready = "acme_bindery:GpuDriverReady"

The entry point may name a plugin class (instantiated once, without arguments), a zero-argument
factory, or a plugin instance.  A plugin implements one or more extension points
(:mod:`bindery.scheduling.framework`); a name listed under an extension point its plugin does not
implement is a configuration error, reported with the fix, when the profile is built rather than
in the middle of a cycle.

Tests and embedding applications register plugin objects directly with
:meth:`PluginRegistry.register` (or :func:`register_plugin` on the process-wide registry), which
take precedence over entry points.
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Callable, Iterable, Sequence

from bindery.scheduling.defaults import BUILTIN_NAMES
from bindery.scheduling.framework import BindPlugin, PluginSet, PostBindPlugin, PreBindPlugin, ReservePlugin

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginError",
    "PluginRegistry",
    "default_registry",
    "register_plugin",
]

ENTRY_POINT_GROUP = "bindery.plugins"

_POINTS: dict[str, tuple[type, str]] = {
    "reserve": (ReservePlugin, "async reserve(*, ctx) and async unreserve(*, ctx)"),
    "preBind": (PreBindPlugin, "async pre_bind(*, ctx)"),
    "bind": (BindPlugin, "async bind(*, ctx)"),
    "postBind": (PostBindPlugin, "async post_bind(*, ctx)"),
}


class PluginError(ValueError):
    """A configured plugin cannot be used; the message names the plugin and what to do."""


def _implements_any(obj: object) -> bool:
    return any(isinstance(obj, protocol) for protocol, _ in _POINTS.values())


class PluginRegistry:
    """Resolves plugin names to plugin objects (one instance per name, shared by all profiles)."""

    def __init__(
        self,
        *,
        group: str = ENTRY_POINT_GROUP,
        entry_points: Callable[[str], Iterable[importlib.metadata.EntryPoint]] | None = None,
    ) -> None:
        self._group = group
        self._entry_points = entry_points or (lambda group: importlib.metadata.entry_points(group=group))
        self._plugins: dict[str, object] = {}
        self._lock = threading.Lock()

    def register(self, *, name: str, plugin: object) -> None:
        """Make ``plugin`` (an object, class or zero-argument factory) available as ``name``."""
        if name in BUILTIN_NAMES:
            raise PluginError(f"{name!r} is the name of a default plugin; register yours under another name")
        with self._lock:
            self._plugins[name] = self._instantiate(name, plugin)

    def unregister(self, *, name: str) -> None:
        with self._lock:
            self._plugins.pop(name, None)

    def resolve(self, name: str) -> object:
        """The plugin called ``name``; raises :class:`PluginError` if none is registered or installed."""
        with self._lock:
            if name in self._plugins:
                return self._plugins[name]
        if name in BUILTIN_NAMES:
            raise PluginError(f"{name!r} is a default plugin and always enabled; remove it from spec.plugins")
        matches = [ep for ep in self._entry_points(self._group) if ep.name == name]
        if not matches:
            raise PluginError(
                f"plugin {name!r} is not installed: no entry point named {name!r} in group {self._group!r}; "
                "install the package that provides it into the operator's image, "
                "or remove it from spec.plugins"
            )
        try:
            loaded = matches[0].load()
        except Exception as error:
            raise PluginError(f"plugin {name!r} failed to load from {matches[0].value!r}: {error}") from error
        plugin = self._instantiate(name, loaded)
        with self._lock:
            return self._plugins.setdefault(name, plugin)

    def plugin_set(
        self,
        *,
        reserve: Sequence[str] = (),
        pre_bind: Sequence[str] = (),
        bind: str | None = None,
        post_bind: Sequence[str] = (),
    ) -> PluginSet:
        """The plugins a ResourceManager enables, checked against their extension points.

        Raises :class:`PluginError` listing every problem at once.
        """
        problems: list[str] = []
        reserve_plugins = self._for_point("reserve", reserve, problems)
        pre_bind_plugins = self._for_point("preBind", pre_bind, problems)
        bind_plugins = self._for_point("bind", [bind] if bind else [], problems)
        post_bind_plugins = self._for_point("postBind", post_bind, problems)
        if problems:
            raise PluginError("; ".join(problems))
        return PluginSet(
            reserve=tuple(p for p in reserve_plugins if isinstance(p, ReservePlugin)),
            pre_bind=tuple(p for p in pre_bind_plugins if isinstance(p, PreBindPlugin)),
            bind=tuple(p for p in bind_plugins if isinstance(p, BindPlugin)) if bind else None,
            post_bind=tuple(p for p in post_bind_plugins if isinstance(p, PostBindPlugin)),
        )

    def _for_point(self, point: str, names: Sequence[str], problems: list[str]) -> list[object]:
        protocol, shape = _POINTS[point]
        plugins: list[object] = []
        for name in dict.fromkeys(names):  # a name listed twice runs once
            try:
                plugin = self.resolve(name)
            except PluginError as error:
                problems.append(str(error))
                continue
            if not isinstance(plugin, protocol):
                problems.append(
                    f"plugin {name!r} is listed under spec.plugins.{point} but does not implement it "
                    f"(needs {shape} and a name); list it under the extension points it implements"
                )
                continue
            plugins.append(plugin)
        return plugins

    @staticmethod
    def _instantiate(name: str, obj: object) -> object:
        if isinstance(obj, type) or (callable(obj) and not _implements_any(obj)):
            try:
                obj = obj()
            except Exception as error:
                raise PluginError(f"plugin {name!r} could not be created: {error}") from error
        if not _implements_any(obj):
            raise PluginError(
                f"plugin {name!r} ({type(obj).__name__}) implements no extension point: "
                "give it a name and reserve/unreserve, pre_bind, bind or post_bind"
            )
        return obj


#: The process-wide registry the operator uses by default.
default_registry = PluginRegistry()


def register_plugin(*, name: str, plugin: object) -> None:
    """Register ``plugin`` under ``name`` in the process-wide registry (tests, embedding apps)."""
    default_registry.register(name=name, plugin=plugin)
