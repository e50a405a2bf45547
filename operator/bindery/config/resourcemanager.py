"""Parse a ResourceManager object into a typed, immutable config.

The apiserver already validated the spec (structural schema + CEL, see crds/), but the operator
must not trust that blindly: the CRD may be older than the operator, or a field may be missing when
defaults were not applied (objects stored before a default existed). So every field is re-checked
here with the same rules and turned into a plain dataclass that the controller compares to decide
whether a profile needs rebuilding and whether its RM client must be replaced.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bindery.config.selector import NamespaceSelector, SelectorError, parse_namespace_selector
from bindery.scheduling.binding import DEFAULT_MAX_BINDING_WAITS
from bindery.scheduling.preemption import VictimScope
from bindery.scheduling.queue import DEFAULT_MAX_IN_FLIGHT
from bindery.scheduling.revocation import OnRevoked

NODE_CHECK_VALUES = ("Full", "Basic", "Off")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class ConfigError(ValueError):
    """The ResourceManager spec cannot be used; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class SecretKeyRef:
    namespace: str
    name: str
    key: str


@dataclasses.dataclass(frozen=True)
class ResourceManagerConfig:
    """Everything the operator needs from one ResourceManager object."""

    name: str
    uid: str
    generation: int
    scheduler_names: tuple[str, ...]
    endpoint: str
    allow_insecure_http: bool = False
    token_ref: SecretKeyRef | None = None
    ca_ref: SecretKeyRef | None = None
    ca_bundle: str | None = None
    client_cert_ref: SecretKeyRef | None = None  # key unused: the Secret is kubernetes.io/tls
    connect_timeout: float = 2.0
    read_timeout: float = 5.0
    reservation_ttl_seconds: int = 60
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    #: At most this many of them per namespace (spec.maxInFlightPerNamespace); None: no share.
    max_in_flight_per_namespace: int | None = None
    #: Pods waiting in PreBind at once, outside the in-flight budget (spec.maxBindingWaits).
    max_binding_waits: int = DEFAULT_MAX_BINDING_WAITS
    #: At most this many of them per namespace (spec.maxBindingWaitsPerNamespace); None: no share.
    max_binding_waits_per_namespace: int | None = None
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 10.0
    node_check: str = "Full"
    pre_bind: tuple[str, ...] = ()
    post_bind: tuple[str, ...] = ()
    bind: str | None = None
    #: Seconds between periodic reconcile passes (bindery.controller.reservations.reconcile): the configured
    #: spec.reconcileIntervalSeconds, capped at half the reservation TTL so that a reserved
    #: reservation whose commit was lost is committed by a pass well before the RM expires it.
    reconcile_interval_seconds: float = 30.0
    #: How long PreBind waits for a pod's volume claims to be bound (spec.volumeBindTimeoutSeconds).
    volume_bind_timeout_seconds: float = 600.0
    #: Which namespaces' pods this RM serves (spec.namespaceSelector); None = every namespace.
    namespace_selector: NamespaceSelector | None = None
    #: What a reconcile pass does with a running pod whose reservation the RM revoked (spec.onRevoked).
    on_revoked: OnRevoked = OnRevoked.EVICT
    #: Which pods its preemption plans may evict (spec.preemption.victims).
    preemption_victims: VictimScope = VictimScope.SERVED

    def connection_key(self) -> tuple[object, ...]:
        """The fields that require a new RM client when they change (others apply in place)."""
        return (
            self.endpoint,
            self.allow_insecure_http,
            self.token_ref,
            self.ca_ref,
            self.ca_bundle,
            self.client_cert_ref,
            self.connect_timeout,
            self.read_timeout,
        )


def parse_resource_manager(*, body: Mapping[str, Any]) -> ResourceManagerConfig:
    """Turn a ResourceManager body (Kubernetes JSON) into a config; raise ConfigError if unusable."""
    metadata = _mapping(body.get("metadata"), "metadata")
    spec = _mapping(body.get("spec"), "spec")
    name = str(metadata.get("name") or "")
    if not name:
        raise ConfigError("metadata.name is empty")
    names = _scheduler_names(spec.get("schedulerNames"))
    endpoint, insecure = _endpoint(spec)
    auth = _mapping(spec.get("auth"), "spec.auth")
    tls = _mapping(spec.get("tls"), "spec.tls")
    timeouts = _mapping(spec.get("timeouts"), "spec.timeouts")
    backoff = _mapping(spec.get("backoff"), "spec.backoff")
    plugins = _mapping(spec.get("plugins"), "spec.plugins")
    initial = _number(backoff.get("initialSeconds", 1.0), "spec.backoff.initialSeconds", low=0.1)
    maximum = _number(backoff.get("maxSeconds", 10.0), "spec.backoff.maxSeconds", low=0.1)
    if maximum < initial:
        raise ConfigError(
            f"spec.backoff.maxSeconds ({maximum:g}) is less than spec.backoff.initialSeconds ({initial:g}); "
            "raise maxSeconds or lower initialSeconds"
        )
    ca_ref = _secret_ref(tls.get("caSecretRef"), "spec.tls.caSecretRef", default_key="ca.crt")
    ca_bundle = tls.get("caBundle") or None
    if ca_ref is not None and ca_bundle is not None:
        raise ConfigError("set at most one of spec.tls.caSecretRef and spec.tls.caBundle")
    ttl = int(_number(spec.get("reservationTTLSeconds", 60), "spec.reservationTTLSeconds", low=5))
    interval = _number(spec.get("reconcileIntervalSeconds", 30), "spec.reconcileIntervalSeconds", low=5)
    node_check = str(spec.get("nodeCheck", "Full"))
    try:
        on_revoked = OnRevoked(str(spec.get("onRevoked", OnRevoked.EVICT.value)))
    except ValueError:
        raise ConfigError(
            f"spec.onRevoked is {spec.get('onRevoked')!r}; use one of {', '.join(v.value for v in OnRevoked)}"
        ) from None
    preemption = _mapping(spec.get("preemption"), "spec.preemption")
    try:
        victims = VictimScope(str(preemption.get("victims", VictimScope.SERVED.value)))
    except ValueError:
        raise ConfigError(
            f"spec.preemption.victims is {preemption.get('victims')!r}; use one of "
            f"{', '.join(v.value for v in VictimScope)} (Served: only pods this resource manager serves)"
        ) from None
    try:
        namespace_selector = parse_namespace_selector(spec.get("namespaceSelector"))
    except SelectorError as exc:
        raise ConfigError(str(exc)) from exc
    if node_check not in NODE_CHECK_VALUES:
        raise ConfigError(f"spec.nodeCheck is {node_check!r}; use one of {', '.join(NODE_CHECK_VALUES)}")
    return ResourceManagerConfig(
        name=name,
        uid=str(metadata.get("uid") or ""),
        generation=int(metadata.get("generation") or 0),
        scheduler_names=names,
        endpoint=endpoint,
        allow_insecure_http=insecure,
        token_ref=_secret_ref(auth.get("tokenSecretRef"), "spec.auth.tokenSecretRef", default_key="token"),
        ca_ref=ca_ref,
        ca_bundle=str(ca_bundle) if ca_bundle is not None else None,
        client_cert_ref=_secret_ref(
            tls.get("clientCertSecretRef"), "spec.tls.clientCertSecretRef", default_key="tls.crt"
        ),
        connect_timeout=_number(timeouts.get("connectSeconds", 2.0), "spec.timeouts.connectSeconds", low=0.1),
        read_timeout=_number(timeouts.get("readSeconds", 5.0), "spec.timeouts.readSeconds", low=0.1),
        reservation_ttl_seconds=ttl,
        max_in_flight=int(_number(spec.get("maxInFlight", DEFAULT_MAX_IN_FLIGHT), "spec.maxInFlight", low=1)),
        max_in_flight_per_namespace=(
            int(_number(spec["maxInFlightPerNamespace"], "spec.maxInFlightPerNamespace", low=1))
            if spec.get("maxInFlightPerNamespace") is not None
            else None
        ),
        max_binding_waits=int(
            _number(spec.get("maxBindingWaits", DEFAULT_MAX_BINDING_WAITS), "spec.maxBindingWaits", low=1)
        ),
        max_binding_waits_per_namespace=(
            int(_number(spec["maxBindingWaitsPerNamespace"], "spec.maxBindingWaitsPerNamespace", low=1))
            if spec.get("maxBindingWaitsPerNamespace") is not None
            else None
        ),
        backoff_initial_seconds=initial,
        backoff_max_seconds=maximum,
        node_check=node_check,
        pre_bind=_strings(plugins.get("preBind"), "spec.plugins.preBind"),
        post_bind=_strings(plugins.get("postBind"), "spec.plugins.postBind"),
        bind=str(plugins["bind"]) if plugins.get("bind") else None,
        reconcile_interval_seconds=reconcile_interval(configured=interval, reservation_ttl_seconds=ttl),
        volume_bind_timeout_seconds=_number(
            spec.get("volumeBindTimeoutSeconds", 600), "spec.volumeBindTimeoutSeconds", low=1
        ),
        namespace_selector=namespace_selector,
        on_revoked=on_revoked,
        preemption_victims=victims,
    )


def reconcile_interval(*, configured: float, reservation_ttl_seconds: int) -> float:
    """Pure: the periodic reconcile interval actually used: at most half the reservation lease.

    A pass is what commits a reserved reservation whose pod got bound while the commit was lost; it
    must come around at least twice per lease, or the RM may expire the reservation of a running pod
    and hand its capacity out again.
    """
    return min(configured, reservation_ttl_seconds / 2)


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{field} must be an object, got {type(value).__name__}")
    return value


def _scheduler_names(value: object) -> tuple[str, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ConfigError("spec.schedulerNames must be a non-empty list of scheduler names")
    names: list[str] = []
    for item in value:
        if not isinstance(item, str) or not _NAME_RE.match(item) or len(item) > 63:
            raise ConfigError(
                f"spec.schedulerNames contains {item!r}; each name must be a lowercase DNS name "
                "(a-z, 0-9, '-', '.'), at most 63 characters"
            )
        if item in names:
            raise ConfigError(f"spec.schedulerNames lists {item!r} twice; list each name once")
        names.append(item)
    return tuple(names)


def _endpoint(spec: Mapping[str, Any]) -> tuple[str, bool]:
    endpoint = spec.get("endpoint")
    insecure = bool(spec.get("allowInsecureHTTP", False))
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"spec.endpoint {endpoint!r} must be an absolute http:// or https:// URL")
    if endpoint.startswith("http://") and not insecure:
        raise ConfigError(
            "spec.endpoint uses plain http://, which sends the bearer token unencrypted; "
            "use https:// or set spec.allowInsecureHTTP: true (development only)"
        )
    return endpoint.rstrip("/"), insecure


def _secret_ref(value: object, field: str, *, default_key: str) -> SecretKeyRef | None:
    if value is None:
        return None
    ref = _mapping(value, field)
    namespace, name = ref.get("namespace"), ref.get("name")
    if not namespace or not name:
        raise ConfigError(f"{field} needs both namespace and name")
    return SecretKeyRef(namespace=str(namespace), name=str(name), key=str(ref.get("key") or default_key))


def _number(value: object, field: str, *, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{field} must be a number, got {value!r}")
    if value < low:
        raise ConfigError(f"{field} is {value}; it must be at least {low:g}")
    return float(value)


def _strings(value: object, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ConfigError(f"{field} must be a list of plugin names")
    if not all(isinstance(item, str) and item for item in value):
        raise ConfigError(f"{field} must contain only non-empty plugin names")
    return tuple(value)
