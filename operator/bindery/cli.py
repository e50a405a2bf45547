"""The `bindery` command: one entry point for the operator, the demo, the reference RM and tooling.

Sub-commands delegate to the module that owns them (`bindery.reference_rm.cli`, `bindery.conformance`,
`bindery.devcluster`) with the remaining arguments, imported lazily so `bindery run` in a container
does not import the dev control plane or the reference RM.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import pathlib
import sys
from collections.abc import Callable, Sequence

from bindery.collector import tune_collector

USAGE = """bindery <command> [options]
       bindery --version

commands:
  run          run the scheduler against the cluster of your kubeconfig (or in-cluster)
  demo         a small local cluster: Bindery schedules a Deployment and a Job beside kube-scheduler
  rm serve     run the reference resource manager (bindery rm serve --help)
  rm conformance   check a resource manager against the REST contract
  rm slurm     serve the RM contract in front of Slurm's slurmrestd (bindery rm slurm --help)
  audit        report leaked reservations, unreserved bound pods, overcommitted nodes (read-only)
  explain      why a pod is pending, or where and how it was bound (read-only)
  devcluster   build | up: the local etcd + kube-apiserver used by the demo and tests
"""


RM_USAGE = """bindery rm <command> [options]

commands:
  serve        run the reference resource manager (bindery rm serve --help)
  conformance  check a resource manager against the REST contract (bindery rm conformance --help)
  slurm        serve the contract in front of Slurm's slurmrestd (bindery rm slurm --help)
  revoke       take a reference RM's reservation back, with a reason (bindery rm revoke --help)
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] == "--version":
        print(f"bindery {version()}")
        return 0
    command, rest = args[0], args[1:]
    if command == "run":
        return run_command(rest)
    if command == "demo":
        from bindery.demo import main as demo_main

        return demo_main(rest)
    if command == "devcluster":
        return _delegate("bindery.devcluster.__main__", rest)
    if command == "audit":
        return _delegate("bindery.audit", rest)
    if command == "explain":
        return _delegate("bindery.explain", rest)
    if command == "rm" and (not rest or rest[0] in ("-h", "--help", "help")):
        print(RM_USAGE)
        return 0 if rest else 2
    if command == "rm" and rest and rest[0] == "serve":
        return _delegate("bindery.reference_rm.cli", rest[1:])
    if command == "rm" and rest and rest[0] == "revoke":
        return _delegate("bindery.reference_rm.cli", rest)
    if command == "rm" and rest and rest[0] == "conformance":
        return _delegate("bindery.conformance.cli", rest[1:])
    if command == "rm" and rest and rest[0] == "slurm":
        return _delegate("bindery.slurm_rm.cli", rest[1:])
    print(f"bindery: unknown command {' '.join(args[:2])!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def version() -> str:
    """The installed distribution's version (what an image or a wheel really holds)."""
    from importlib import metadata

    try:
        return metadata.version("kube-bindery")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from bindery import __version__

        return __version__


def _delegate(module_name: str, argv: Sequence[str]) -> int:
    module = importlib.import_module(module_name)
    entry: Callable[[Sequence[str]], int | None] = module.main
    return int(entry(list(argv)) or 0)


#: Loggers that write a line per RM request (httpx: "HTTP Request: POST ...") or per pod event Kopf
#: handled (kopf.objects: "Handler ... succeeded"): noise at scale, and CPU the busy operator pays
#: (a backlog of 5,000 pods: over 10,000 lines, 4% of the operator's samples). Their warnings and
#: errors still show; --verbose shows everything.
PER_REQUEST_LOGGERS = ("httpx", "kopf.objects")


def configure_logging(*, verbose: bool, log_format: str) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for chatty in PER_REQUEST_LOGGERS:
        logging.getLogger(chatty).setLevel(logging.NOTSET if verbose else logging.WARNING)
    if log_format == "json":
        from bindery.logcontext import JsonFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())


def run_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="bindery run", description="Run the Bindery scheduler.")
    parser.add_argument(
        "--kubeconfig", type=pathlib.Path, help="default: $KUBECONFIG, ~/.kube/config, in-cluster"
    )
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="schedule pods of this namespace only (repeatable); default: all namespaces",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: one object per line; lines about a pod carry it, its ResourceManager and reservation",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        help="serve Kopf's liveness endpoint at this URL, e.g. http://0.0.0.0:8080/healthz "
        "(as `kopf run --liveness`; the Helm chart's probes use it); default: none",
    )
    parser.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 0.0.0.0:9090; default: none",
    )
    parser.add_argument(
        "--debug-addr",
        metavar="HOST:PORT",
        help="serve the read-only scheduling queues (/debug/queue, read by `bindery explain`) at "
        "http://HOST:PORT, e.g. 127.0.0.1:9091 (reach it with kubectl port-forward); each request needs "
        "a bearer token whose user may get /debug/queue (TokenReview + SubjectAccessReview). Default: "
        "beside /metrics if --metrics-addr is on loopback, else not served",
    )
    parser.add_argument(
        "--metrics-auth",
        action="store_true",
        help="require the same of /metrics: a bearer token whose user may get /metrics (the scraper "
        "needs one); default: /metrics is open",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="run several replicas: only the holder of a coordination.k8s.io Lease schedules",
    )
    parser.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace of the Lease (default: $POD_NAMESPACE, else 'default')",
    )
    parser.add_argument("--lease-name", default="bindery", help="name of the Lease (default: bindery)")
    parser.add_argument(
        "--lease-per-resource-manager",
        action="store_true",
        help="with --leader-elect: one Lease per ResourceManager, named LEASE-NAME-RM, so that "
        "replicas share the work: each leads the profiles whose Lease it holds and stands by for the rest",
    )
    parser.add_argument(
        "--cluster-id",
        default=None,
        help="this cluster's id, sent to resource managers of contract v1.2 so clusters sharing one RM "
        "never touch each other's reservations (default: the UID of the kube-system namespace)",
    )
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="a standby takes the Lease once it has seen it unchanged this long (default: 15)",
    )
    parser.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="the leader stops binding if it could not renew the Lease for this long (default: 10)",
    )
    parser.add_argument(
        "--retry-period",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often the leader renews and standbys look at the Lease (default: 2)",
    )
    args = parser.parse_args(argv)
    if args.lease_per_resource_manager and not args.leader_elect:
        parser.error(
            "--lease-per-resource-manager needs --leader-elect: it splits leader election per ResourceManager"
        )
    from bindery.controller.leadership.rules import LeaseTiming

    try:
        LeaseTiming(
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.metrics_addr is not None or args.debug_addr is not None:
        from bindery.controller.metrics import parse_address

        try:
            if args.metrics_addr is not None:
                parse_address(args.metrics_addr)
            if args.debug_addr is not None:
                parse_address(args.debug_addr, what="debug address")
        except ValueError as exc:
            parser.error(str(exc))
    configure_logging(verbose=args.verbose, log_format=args.log_format)
    from bindery import tracing

    tracing.configure(service_name="bindery-operator")  # only when OTEL_EXPORTER_OTLP_*ENDPOINT is set
    from bindery.controller.startup.entry import run_operator
    from bindery.controller.startup.options import OperatorOptions

    options = OperatorOptions(
        kubeconfig=args.kubeconfig,
        namespaces=tuple(args.namespace),
        liveness_endpoint=args.liveness,
        metrics_address=args.metrics_addr,
        debug_address=args.debug_addr,
        metrics_auth=args.metrics_auth,
        leader_election=args.leader_elect,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        lease_per_resource_manager=args.lease_per_resource_manager,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        cluster_id=args.cluster_id,
    )

    # No stop_flag: in the main thread Kopf handles SIGINT and SIGTERM itself, replacing any handler
    # set here, so a flag would never be set, and Kopf would wait 5 s at every exit for the task
    # left waiting on it (tests/operator/test_run_stop.py).
    tune_collector()
    asyncio.run(run_operator(options=options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
