"""Options for one operator process, independent of how it was started (CLI, tests, demo)."""

from __future__ import annotations

import dataclasses
import pathlib
import socket


@dataclasses.dataclass(frozen=True)
class OperatorOptions:
    #: kubeconfig to use; None = $KUBECONFIG or ~/.kube/config, else the in-cluster service account.
    kubeconfig: pathlib.Path | None = None
    #: namespaces whose pods are scheduled; empty = all namespaces (cluster-wide).
    namespaces: tuple[str, ...] = ()
    #: used in events' reportingInstance (`<schedulerName>-<hostname>`), as kube-scheduler does.
    hostname: str = dataclasses.field(default_factory=socket.gethostname)
    #: seconds between readiness probes of each resource manager (Reachable condition).
    probe_interval: float = 30.0
    #: directory for materialized TLS files from Secrets; None = a private temporary directory.
    state_dir: pathlib.Path | None = None
    #: URL of Kopf's liveness endpoint (`kopf run --liveness`), e.g. http://0.0.0.0:8080/healthz.
    liveness_endpoint: str | None = None
    #: `HOST:PORT` to serve Prometheus metrics at `/metrics` (e.g. 0.0.0.0:9090; port 0 = any free
    #: port, see `Runtime.metrics_server.port`); None = no metrics endpoint.
    metrics_address: str | None = None
    #: `HOST:PORT` for the read-only queue views (`/debug/queue`) on a listener of their own. None:
    #: they are served beside /metrics only if that listens on loopback, else not at all. Wherever
    #: served, they answer only a bearer token the apiserver accepts, of a user who may `get` the
    #: URL (TokenReview + SubjectAccessReview, bindery.adapters.access).
    debug_address: str | None = None
    #: ask the same of `/metrics` scrapers (as controller-runtime's `WithAuthenticationAndAuthorization`
    #: filter): a Prometheus then needs a token bound to get on /metrics. False: /metrics is open.
    metrics_auth: bool = False
    #: seconds one watch request stays open before Kopf re-watches (each re-watch authenticates
    #: anew, so a rotated token is used from then on).
    watch_timeout: int = 300
    #: elect one active replica through a Lease (kube-scheduler's 15 s / 10 s / 2 s timing).
    leader_election: bool = False
    #: where the Lease lives (the release namespace in a cluster).
    lease_namespace: str = "default"
    lease_name: str = "bindery"
    #: one Lease per ResourceManager (`<lease_name>-<name>`) instead of one for the process: every
    #: replica leads the profiles whose Lease it holds and stands by for the rest.
    lease_per_resource_manager: bool = False
    #: seconds: a lease not renewed for this long may be taken; the leader gives up after
    #: renew_deadline without a renewal; candidates retry every retry_period.
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: this cluster's id for RMs of contract v1.2 (clusterId); None = the kube-system namespace's UID.
    cluster_id: str | None = None
