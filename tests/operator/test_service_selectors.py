"""The Service watch for default spreading keeps each Service's selector, by namespace."""

from __future__ import annotations

from bindery.controller.watches.services import ServiceSelectors


def test_the_service_watch_keeps_selectors_by_namespace_and_forgets_deleted_services() -> None:
    services = ServiceSelectors(api=None, logger=None)  # type: ignore[arg-type]
    web = {"metadata": {"namespace": "ns", "name": "web", "uid": "u1"}, "spec": {"selector": {"app": "web"}}}
    headless = {"metadata": {"namespace": "ns", "name": "ext", "uid": "u2"}, "spec": {}}
    services.on_event("ADDED", web)
    services.on_event("ADDED", headless)
    assert list(services.selectors("ns")) == [{"app": "web"}]
    assert list(services.selectors("other")) == []
    services.on_event("MODIFIED", {**web, "spec": {"selector": {"app": "web2"}}})
    assert list(services.selectors("ns")) == [{"app": "web2"}]
    services.on_event("DELETED", web)
    assert list(services.selectors("ns")) == []
