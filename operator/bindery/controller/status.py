"""The status of a ResourceManager object, computed without I/O.

Ready = the operator schedules pods for this object: the spec parsed, none of its scheduler names
is contested, and the RM answered its readiness probe, which authenticates (a token the RM refuses
is reason TokenRefused, not a failed pod per cycle). Reachable reports the probe alone, so a user
can tell "my spec is wrong" from "my RM is down". A condition's lastTransitionTime changes only when
its status does, as the Kubernetes API conventions require.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Observation:
    generation: int
    config_error: str | None = None
    credentials_error: str | None = None
    conflicts: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    reachable: bool | None = None  # None = not probed yet
    reach_message: str | None = None
    #: the RM answered but refused the bearer token (reachable is False then)
    token_refused: bool = False


def compute_status(
    *, observation: Observation, previous: Mapping[str, Any] | None, now: datetime.datetime
) -> dict[str, Any]:
    reachable = _reachable_condition(observation)
    ready = _ready_condition(observation)
    old = {c.get("type"): c for c in (previous or {}).get("conditions") or ()}
    conditions = [
        _stamp(new, old.get(new["type"]), now, observation.generation) for new in (ready, reachable)
    ]
    last_error = observation.config_error or observation.credentials_error or _conflict_text(observation)
    if last_error is None and observation.reachable is False:
        last_error = observation.reach_message
    return {
        "observedGeneration": observation.generation,
        "conditions": conditions,
        "conflicts": sorted({rm for others in observation.conflicts.values() for rm in others}),
        "lastError": last_error or "",
    }


def status_changed(*, new: Mapping[str, Any], previous: Mapping[str, Any] | None) -> bool:
    """Whether writing `new` changes anything a reader sees (ignores identical timestamps)."""
    return _comparable(new) != _comparable(previous or {})


def _comparable(status: Mapping[str, Any]) -> tuple[object, ...]:
    conditions: Sequence[Mapping[str, Any]] = status.get("conditions") or ()
    return (
        status.get("observedGeneration"),
        status.get("lastError") or "",
        tuple(status.get("conflicts") or ()),
        tuple(
            sorted((c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in conditions)
        ),
    )


def _reachable_condition(observation: Observation) -> dict[str, Any]:
    if observation.reachable is None:
        return _condition("Reachable", "Unknown", "NotProbed", "the resource manager has not been probed yet")
    if observation.reachable:
        return _condition(
            "Reachable", "True", "ProbeSucceeded", "the resource manager answered its readiness probe"
        )
    if observation.token_refused:
        return _condition("Reachable", "False", "TokenRefused", observation.reach_message or "token refused")
    return _condition("Reachable", "False", "ProbeFailed", observation.reach_message or "the probe failed")


def _ready_condition(observation: Observation) -> dict[str, Any]:
    if observation.config_error:
        return _condition("Ready", "False", "InvalidSpec", observation.config_error)
    if observation.credentials_error:
        return _condition("Ready", "False", "CredentialsUnavailable", observation.credentials_error)
    conflict = _conflict_text(observation)
    if conflict:
        return _condition("Ready", "False", "SchedulerNameConflict", conflict)
    if observation.reachable is None:
        return _condition("Ready", "Unknown", "Probing", "waiting for the first readiness probe")
    if not observation.reachable and observation.token_refused:
        return _condition("Ready", "False", "TokenRefused", observation.reach_message or "token refused")
    if not observation.reachable:
        return _condition("Ready", "False", "Unreachable", observation.reach_message or "the probe failed")
    return _condition("Ready", "True", "Scheduling", "pods of the listed scheduler names are being scheduled")


def _conflict_text(observation: Observation) -> str | None:
    if not observation.conflicts:
        return None
    parts = [
        f'"{name}" is also claimed by {", ".join(others)}'
        for name, others in sorted(observation.conflicts.items())
    ]
    return (
        "scheduler names claimed by more than one ResourceManager are scheduled by none of them: "
        + "; ".join(parts)
        + ". Remove each name from all but one ResourceManager."
    )


def _condition(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def _stamp(
    new: dict[str, Any], old: Mapping[str, Any] | None, now: datetime.datetime, generation: int
) -> dict[str, Any]:
    unchanged = old is not None and old.get("status") == new["status"] and old.get("lastTransitionTime")
    stamp = old["lastTransitionTime"] if unchanged and old is not None else _rfc3339(now)
    return {**new, "observedGeneration": generation, "lastTransitionTime": stamp}


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
