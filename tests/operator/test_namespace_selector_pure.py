"""spec.namespaceSelector parsed and matched as a metav1.LabelSelector (pure)."""

from __future__ import annotations

import pytest

from bindery.config import ConfigError, parse_resource_manager
from bindery.config.routing import namespace_refusal, route_scheduler_names
from bindery.config.selector import NamespaceSelector, SelectorError, parse_namespace_selector


def _body(**spec: object) -> dict[str, object]:
    return {
        "metadata": {"name": "gpu"},
        "spec": {"schedulerNames": ["bindery-gpu"], "endpoint": "https://rm.example", **spec},
    }


def test_absent_means_every_namespace_and_empty_matches_every_namespace() -> None:
    assert parse_resource_manager(body=_body()).namespace_selector is None
    empty = parse_namespace_selector({})
    assert empty == NamespaceSelector()
    assert empty.matches({})
    assert empty.matches({"any": "thing"})


def test_match_labels_and_expressions_are_anded() -> None:
    selector = parse_namespace_selector(
        {
            "matchLabels": {"team": "a"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu", "cpu"]},
                {"key": "frozen", "operator": "DoesNotExist"},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "billing", "operator": "Exists"},
            ],
        }
    )
    assert selector is not None
    good = {"team": "a", "tier": "gpu", "billing": "x"}
    assert selector.matches(good)
    assert not selector.matches({**good, "team": "b"})
    assert not selector.matches({**good, "tier": "tpu"})
    assert not selector.matches({**good, "frozen": ""})
    assert not selector.matches({**good, "env": "prod"})
    assert selector.matches({**good, "env": "dev"})  # NotIn holds for another value and for none
    assert not selector.matches({"team": "a", "tier": "gpu"})  # billing must exist
    assert selector.describe() == "team=a,tier in (gpu,cpu),!frozen,env notin (prod),billing"


@pytest.mark.parametrize(
    ("selector", "complaint"),
    [
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "needs at least one value"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "takes no values"),
        ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "use one of"),
        ({"matchLabels": {"a": 1}}, "string values"),
        ("team=a", "label selector object"),
    ],
)
def test_a_selector_the_apiserver_would_refuse_is_a_config_error(selector: object, complaint: str) -> None:
    with pytest.raises(SelectorError, match=complaint):
        parse_namespace_selector(selector)
    with pytest.raises(ConfigError, match=r"spec\.namespaceSelector"):
        parse_resource_manager(body=_body(namespaceSelector=selector))


def test_routing_carries_each_resource_managers_selector_and_the_refusal_names_rm_and_rule() -> None:
    config = parse_resource_manager(body=_body(namespaceSelector={"matchLabels": {"team": "a"}}))
    routing = route_scheduler_names(configs=[config])
    assert routing.served == {"bindery-gpu": "gpu"}
    selector = routing.selectors["gpu"]
    message = namespace_refusal(rm_name="gpu", selector=selector, namespace="team-b")
    assert '"gpu"' in message
    assert "spec.namespaceSelector (team=a)" in message
    assert '"team-b"' in message
    assert route_scheduler_names(configs=[parse_resource_manager(body=_body())]).selectors == {}
