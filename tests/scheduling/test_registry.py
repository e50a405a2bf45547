"""PluginRegistry: programmatic registration, entry-point loading, and clear configuration errors."""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import EntryPoint

import pytest

from bindery.scheduling.registry import ENTRY_POINT_GROUP, PluginError, PluginRegistry, register_plugin
from tests.scheduling.fakes import Calls
from tests.scheduling.plugins import Announcer, CustomBinder, EntryPointPlugin, EveryPoint, GateKeeper


def entry_points(*pairs: tuple[str, str]) -> PluginRegistry:
    points = [EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP) for name, value in pairs]

    def lookup(group: str) -> Iterable[EntryPoint]:
        assert group == ENTRY_POINT_GROUP
        return points

    return PluginRegistry(entry_points=lookup)


def test_registered_objects_fill_their_extension_points() -> None:
    registry = entry_points()
    calls = Calls()
    gate, binder, announcer = GateKeeper(calls), CustomBinder(calls), Announcer(calls)
    registry.register(name="gate", plugin=gate)
    registry.register(name="binder", plugin=binder)
    registry.register(name="announce", plugin=announcer)
    plugins = registry.plugin_set(pre_bind=["gate", "gate"], bind="binder", post_bind=["announce"])
    assert plugins.pre_bind == (gate,)  # listed twice, runs once
    assert plugins.bind == (binder,)
    assert plugins.post_bind == (announcer,)
    assert registry.plugin_set().bind is None  # no replacement: the default binder


def test_one_plugin_may_serve_several_points_and_classes_are_instantiated_once() -> None:
    registry = entry_points()
    registry.register(name="every-point", plugin=EveryPoint)
    plugins = registry.plugin_set(
        reserve=["every-point"], pre_bind=["every-point"], post_bind=["every-point"]
    )
    assert len({id(plugins.reserve[0]), id(plugins.pre_bind[0]), id(plugins.post_bind[0])}) == 1


def test_entry_points_are_loaded_by_name_and_cached() -> None:
    registry = entry_points(("from-entry-point", "tests.scheduling.plugins:EntryPointPlugin"))
    before = EntryPointPlugin.instances
    first = registry.plugin_set(pre_bind=["from-entry-point"])
    second = registry.plugin_set(pre_bind=["from-entry-point"])
    assert isinstance(first.pre_bind[0], EntryPointPlugin)
    assert first.pre_bind[0] is second.pre_bind[0]
    assert EntryPointPlugin.instances == before + 1


def test_registered_plugins_take_precedence_over_entry_points() -> None:
    registry = entry_points(("gate", "tests.scheduling.plugins:EntryPointPlugin"))
    gate = GateKeeper(Calls())
    registry.register(name="gate", plugin=gate)
    assert registry.plugin_set(pre_bind=["gate"]).pre_bind == (gate,)


def test_every_problem_is_reported_at_once_with_the_fix() -> None:
    registry = entry_points(("broken", "tests.scheduling.no_such_module:Plugin"))
    registry.register(name="announce", plugin=Announcer(Calls()))
    with pytest.raises(PluginError) as caught:
        registry.plugin_set(pre_bind=["missing", "announce", "broken"])
    message = str(caught.value)
    assert (
        "plugin 'missing' is not installed: no entry point named 'missing' in group 'bindery.plugins'"
        in message
    )
    assert "plugin 'announce' is listed under spec.plugins.preBind but does not implement it" in message
    assert "plugin 'broken' failed to load from 'tests.scheduling.no_such_module:Plugin'" in message


def test_default_plugin_names_are_reserved() -> None:
    registry = entry_points()
    with pytest.raises(PluginError, match="name of a default plugin"):
        registry.register(name="NodeCheck", plugin=GateKeeper(Calls()))
    with pytest.raises(PluginError, match="default plugin and always enabled"):
        registry.plugin_set(pre_bind=["NodeCheck"])


def test_objects_implementing_nothing_are_refused() -> None:
    registry = entry_points()
    with pytest.raises(PluginError, match="implements no extension point"):
        registry.register(name="nothing", plugin=object())

    def failing_factory() -> object:
        raise RuntimeError("needs a config file")

    with pytest.raises(PluginError, match="could not be created: needs a config file"):
        registry.register(name="factory", plugin=failing_factory)


def test_process_wide_registry() -> None:
    from bindery.scheduling.registry import default_registry

    gate = GateKeeper(Calls(), name="process-wide-gate")
    register_plugin(name="process-wide-gate", plugin=gate)
    try:
        assert default_registry.plugin_set(pre_bind=["process-wide-gate"]).pre_bind == (gate,)
    finally:
        default_registry.unregister(name="process-wide-gate")
