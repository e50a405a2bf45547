"""kube-scheduler's fourth source of default spreading: the Services that select the pod
(``helper.DefaultSelector``), merged with the owner's selector; none when the pod states spread."""

from __future__ import annotations

from bindery.podrules.model import NO_SOFT
from bindery.podrules.parse import label_selector, soft_rules, with_service_spread

LABELS = {"app": "web", "tier": "front"}


def test_the_selectors_of_every_service_selecting_the_pod_are_merged() -> None:
    soft = with_service_spread(
        NO_SOFT, spread=False, labels=LABELS, services=[{"app": "web"}, {"tier": "front"}, {"app": "db"}]
    )
    assert soft.default_spread == label_selector({"matchLabels": LABELS})


def test_no_service_selecting_the_pod_leaves_its_rules_as_they_are() -> None:
    assert with_service_spread(NO_SOFT, spread=False, labels=LABELS, services=[{"app": "db"}, {}]) is NO_SOFT


def test_a_pod_stating_spread_constraints_gets_no_default_spreading() -> None:
    assert with_service_spread(NO_SOFT, spread=True, labels=LABELS, services=[{"app": "web"}]) is NO_SOFT


def test_the_owners_selector_and_the_services_are_anded() -> None:
    owned = soft_rules(
        {
            "metadata": {
                "labels": {"app": "web", "pod-template-hash": "abc"},
                "ownerReferences": [{"kind": "ReplicaSet", "name": "web-abc", "controller": True}],
            }
        }
    )
    assert owned.default_spread is not None
    soft = with_service_spread(
        owned, spread=False, labels={"app": "web", "pod-template-hash": "abc"}, services=[{"app": "web"}]
    )
    assert soft.default_spread is not None
    assert soft.default_spread.matches({"app": "web", "pod-template-hash": "abc"})
    assert not soft.default_spread.matches({"app": "web", "pod-template-hash": "other"})
