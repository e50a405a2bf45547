"""Unit tests for the pure ResourceManager config parsing and scheduler-name routing."""

from typing import Any

import pytest

from bindery.config import ConfigError, parse_resource_manager, route_scheduler_names
from bindery.scheduling.preemption import VictimScope


def _body(name: str = "rm1", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"schedulerNames": ["bindery"], "endpoint": "https://rm.example:8443/"}
    base.update(spec)
    return {"metadata": {"name": name, "uid": "u-1", "generation": 3}, "spec": base}


def test_defaults_match_the_crd() -> None:
    config = parse_resource_manager(body=_body())
    assert config.endpoint == "https://rm.example:8443"
    assert (config.backoff_initial_seconds, config.backoff_max_seconds) == (1.0, 10.0)
    assert config.node_check == "Full"
    assert config.generation == 3
    assert config.token_ref is None


def test_plain_http_needs_explicit_opt_in() -> None:
    with pytest.raises(ConfigError, match="allowInsecureHTTP"):
        parse_resource_manager(body=_body(endpoint="http://127.0.0.1:1"))
    assert parse_resource_manager(body=_body(endpoint="http://127.0.0.1:1", allowInsecureHTTP=True))


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"schedulerNames": []}, "non-empty"),
        ({"schedulerNames": [""]}, "DNS name"),
        ({"schedulerNames": ["a", "a"]}, "twice"),
        ({"backoff": {"initialSeconds": 5, "maxSeconds": 2}}, "maxSeconds"),
        ({"nodeCheck": "Sometimes"}, "nodeCheck"),
        ({"auth": {"tokenSecretRef": {"name": "x"}}}, "namespace and name"),
        ({"preemption": {"victims": "Everyone"}}, "spec.preemption.victims"),
        ({"preemption": "Any"}, "spec.preemption must be an object"),
    ],
)
def test_bad_specs_are_refused_with_the_field_named(spec: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_resource_manager(body=_body(**spec))


def test_connection_key_changes_only_with_connection_fields() -> None:
    one = parse_resource_manager(body=_body())
    same = parse_resource_manager(body=_body(maxInFlight=3))
    other = parse_resource_manager(body=_body(endpoint="https://elsewhere"))
    assert one.connection_key() == same.connection_key()
    assert one.connection_key() != other.connection_key()


def test_contested_names_are_served_by_nobody_and_reported_to_every_claimant() -> None:
    a = parse_resource_manager(body=_body("a", schedulerNames=["shared", "only-a"]))
    b = parse_resource_manager(body=_body("b", schedulerNames=["shared"]))
    routing = route_scheduler_names(configs=[a, b])
    assert routing.served == {"only-a": "a"}
    assert routing.conflicts_of(rm_name="a") == {"shared": ("b",)}
    assert routing.conflicts_of(rm_name="b") == {"shared": ("a",)}
    message = routing.conflict_message(scheduler_name="shared")
    assert message is not None
    assert "'a', 'b'" in message
    assert routing.conflict_message(scheduler_name="only-a") is None


def test_the_binding_pool_has_a_default_size_and_no_per_namespace_share_unless_set() -> None:
    config = parse_resource_manager(body=_body())
    assert (config.max_binding_waits, config.max_binding_waits_per_namespace) == (64, None)
    config = parse_resource_manager(body=_body(maxBindingWaits=32, maxBindingWaitsPerNamespace=8))
    assert (config.max_binding_waits, config.max_binding_waits_per_namespace) == (32, 8)
    with pytest.raises(ConfigError, match=r"spec\.maxBindingWaits is 0"):
        parse_resource_manager(body=_body(maxBindingWaits=0))
    with pytest.raises(ConfigError, match=r"spec\.maxBindingWaitsPerNamespace is 0"):
        parse_resource_manager(body=_body(maxBindingWaitsPerNamespace=0))


def test_the_per_namespace_share_of_max_in_flight_is_off_unless_set() -> None:
    assert parse_resource_manager(body=_body()).max_in_flight_per_namespace is None
    config = parse_resource_manager(body=_body(maxInFlight=64, maxInFlightPerNamespace=16))
    assert (config.max_in_flight, config.max_in_flight_per_namespace) == (64, 16)
    with pytest.raises(ConfigError, match=r"spec\.maxInFlightPerNamespace is 0"):
        parse_resource_manager(body=_body(maxInFlightPerNamespace=0))


def test_preemption_victims_are_the_served_pods_unless_set_to_any() -> None:
    """Issue 35: an RM's plans may evict only pods it serves, unless its object says Any."""
    assert parse_resource_manager(body=_body()).preemption_victims is VictimScope.SERVED
    anyone = parse_resource_manager(body=_body(preemption={"victims": "Any"}))
    assert anyone.preemption_victims is VictimScope.ANY
