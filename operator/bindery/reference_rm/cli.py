"""Command line of the reference RM: ``bindery rm serve ...`` calls :func:`main`.

Configuration errors (unreadable inventory, missing token, bad TLS files, a database another RM
process holds) exit with status 2 and a one-line message saying what to fix, before the server binds
its port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pathlib
import signal
import ssl
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bindery import tracing
from bindery.collector import tune_collector
from bindery.reference_rm.inventory import InventoryError, load_inventory_file
from bindery.reference_rm.placement import Policy
from bindery.reference_rm.server import (
    DEFAULT_MAX_BATCH_BODY_BYTES,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_GROUP_BODY_BYTES,
    DEFAULT_TOKEN_OVERLAP,
    serve_reference_rm,
)
from bindery.reference_rm.store import DEFAULT_MAX_RELEASED_ROWS, FOREIGN_RETRY_SECONDS
from bindery.reference_rm.storeerrors import SchemaTooNew
from bindery.reference_rm.stores import UNREACHABLE
from bindery.reference_rm.writerlock import DatabaseLocked

if TYPE_CHECKING:
    from bindery.reference_rm.devicemirror import ClaimMirror, SliceMirror

__all__ = ["build_parser", "main", "serve_command", "served_url"]

log = logging.getLogger(__name__)
TOKEN_ENV = "BINDERY_RM_TOKEN"
#: The first line on stdout once the server listens; ``served_url`` reads the URL back from it.
BANNER = "reference RM serving contract v1 at "


def serve_command(
    *, db: pathlib.Path | str, token_file: pathlib.Path, options: Sequence[str] = ()
) -> list[str]:
    """The argv that runs ``bindery rm serve`` as its own process on a free loopback port.

    For tests and benchmarks: read the URL with :func:`served_url` from the first line it prints.
    """
    return [
        sys.executable,
        "-m",
        "bindery.reference_rm.cli",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--db",
        str(db),
        "--token-file",
        str(token_file),
        *options,
    ]


def served_url(banner: bytes) -> str:
    """The URL in the server's first line on stdout (:data:`BANNER` followed by the URL)."""
    return banner.decode().rsplit(" ", 1)[-1].strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bindery rm", description="The Bindery reference resource manager.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve contract v1 over HTTP(S)")
    serve.add_argument(
        "--listen", default="127.0.0.1:8080", help="HOST:PORT to listen on (default %(default)s)"
    )
    serve.add_argument(
        "--db",
        required=True,
        help="where the reservations are: a SQLite file (one replica), or postgresql://USER@HOST:PORT/DB "
        "(several replicas on one database; TLS with libpq's names, e.g. ?sslmode=verify-full&sslrootcert=F)",
    )
    serve.add_argument(
        "--db-password-file",
        type=pathlib.Path,
        help="file holding the PostgreSQL password (a mounted Secret); without it libpq's own sources "
        "(PGPASSWORD, PGPASSFILE, ~/.pgpass)",
    )
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--inventory",
        type=pathlib.Path,
        help="YAML inventory file (nodes and allocatable); the RM owns these nodes exclusively: it counts "
        "only its own reservations, so nothing else may run pods there",
    )
    source.add_argument(
        "--mirror-nodes",
        action="store_true",
        help="mirror the cluster's Node objects, and count every pod bound to them (needs get/list/watch "
        "on nodes and pods; list/watch on policy poddisruptionbudgets lets preemption spare protected pods)",
    )
    serve.add_argument(
        "--node-selector", default="", help="label selector of the nodes to mirror, e.g. pool=gpu"
    )
    serve.add_argument(
        "--kubeconfig", type=pathlib.Path, help="kubeconfig for --mirror-nodes (default: in-cluster)"
    )
    serve.add_argument(
        "--device-allocator",
        type=pathlib.Path,
        metavar="PATH",
        help="with --mirror-nodes and a SQLite --db: allocate DRA devices (contract v1.3 feature "
        "`devices`) with this device allocator helper, mirroring ResourceSlices and allocated "
        "ResourceClaims (needs list/watch on both); `python -m bindery.devcluster build --devalloc` "
        "builds it and prints its path",
    )
    serve.add_argument(
        "--mirror-stale-seconds",
        type=float,
        default=60.0,
        help="with --mirror-nodes, /readyz answers 503 once listing or watching the nodes or pods has failed "
        "this long with no success in between (default %(default)s)",
    )
    serve.add_argument(
        "--mirror-pod-page-size",
        type=int,
        default=None,
        help="with --mirror-nodes, pods a page of the pod mirror's list: the RM is unready until it is "
        "complete, and larger pages take fewer round trips; lower it if the bound pods are large "
        "(many tolerations), since one page is held at once (default 500)",
    )
    serve.add_argument("--token-file", type=pathlib.Path, help=f"bearer token file (or set ${TOKEN_ENV})")
    serve.add_argument(
        "--token-overlap",
        type=float,
        default=DEFAULT_TOKEN_OVERLAP,
        metavar="SECONDS",
        help="after the token file changes, accept the previous token this long too, so callers that "
        "have not re-read theirs yet are not refused (default %(default)g; 0: none)",
    )
    serve.add_argument("--insecure-no-auth", action="store_true", help="accept requests without a token")
    serve.add_argument(
        "--policy",
        choices=[p.value for p in Policy],
        default=Policy.BINPACK.value,
        help="among the nodes that fit: binpack favours the fullest, spread the emptiest (kube-scheduler's "
        "default); pods' preferred node affinity (with Bindery's soft inter-pod rules: ScheduleAnyway "
        "and default spreading, preferred pod affinity) and PreferNoSchedule taints weigh more than either "
        "(default %(default)s; the chart's default is spread)",
    )
    serve.add_argument("--tls-cert", type=pathlib.Path, help="server certificate (PEM); enables HTTPS")
    serve.add_argument("--tls-key", type=pathlib.Path, help="server private key (PEM)")
    serve.add_argument("--client-ca", type=pathlib.Path, help="require client certificates signed by this CA")
    serve.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    serve.add_argument(
        "--max-group-body-bytes",
        type=int,
        default=DEFAULT_MAX_GROUP_BODY_BYTES,
        help="largest body of POST /v1/reservation-groups (default %(default)s)",
    )
    serve.add_argument(
        "--no-groups",
        action="store_true",
        help="serve without reservation groups (contract v1.1): their paths answer 404 as a v1.0 RM's "
        "do, to test how a caller handles an RM that lacks them",
    )
    serve.add_argument(
        "--max-batch-body-bytes",
        type=int,
        default=DEFAULT_MAX_BATCH_BODY_BYTES,
        help="largest body of POST /v1/batch (default %(default)s)",
    )
    serve.add_argument(
        "--no-batch",
        action="store_true",
        help="serve without POST /v1/batch (contract v1.1): it answers 404 as a v1.0 RM's does, to test "
        "how a caller falls back to single calls; with --no-groups the RM looks like a v1.0 one",
    )
    serve.add_argument(
        "--retain-released-seconds",
        type=float,
        default=3600.0,
        help="keep released and expired reservations this long, so late calls get a precise answer "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--max-released-rows",
        type=int,
        default=DEFAULT_MAX_RELEASED_ROWS,
        help="keep at most this many released and expired reservations, the most recent, whatever "
        "--retain-released-seconds says: bounds the disk tenants can fill (default %(default)s)",
    )
    serve.add_argument(
        "--foreign-retry-seconds",
        type=float,
        default=FOREIGN_RETRY_SECONDS,
        help="with --mirror-nodes, a pod refused while pods of other schedulers hold room is told to "
        "try again within this many seconds: their pods can end without a release the caller hears "
        "of; lower it where such pods come and go often, at the cost of more refused calls "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        default=0,
        metavar="PERCENT",
        help="as kube-scheduler's percentageOfNodesToScore: a reserve searches the nodes round from where "
        "the last one stopped and picks among the first this share of them that fit (at least 100); "
        "0 is kube-scheduler's adaptive default (50%% less 1%% per 125 nodes, at least 5%%), 100 examines "
        "every node, so --policy is exact (default %(default)s; groups and preemption examine every node)",
    )
    serve.add_argument(
        "--no-cluster-id",
        action="store_true",
        help="serve as a contract v1.1 RM: no GET /v1/info (404); clusterId, preferredNodeAffinity and Gt/Lt "
        "tolerations refused (400), to test how a caller handles an RM without the v1.2 features",
    )
    serve.add_argument(
        "--no-preemption",
        action="store_true",
        help="serve contract v1.2 without the preemption feature: no plans, preemptionPolicy refused (400)",
    )
    serve.add_argument(
        "--admin-token-file",
        type=pathlib.Path,
        help="enable the operator's path POST /admin/v1/reservations/{id}/revoke (bindery rm revoke), "
        "guarded by the token in this file (not the callers' token)",
    )
    serve.add_argument("--log-level", default="INFO")
    revoke = commands.add_parser(
        "revoke",
        help="take a reservation back, as a batch system cancelling a job would (contract v1.2 revocation)",
    )
    revoke.add_argument("--url", required=True, help="the RM's base URL, e.g. https://rm:8443")
    revoke.add_argument(
        "--admin-token-file",
        type=pathlib.Path,
        required=True,
        help="the file given to serve --admin-token-file",
    )
    revoke.add_argument("--ca-file", help="CA bundle to verify the RM's certificate")
    revoke.add_argument("--reason", required=True, help="why: shown to the caller and in the pod's event")
    revoke.add_argument("id", help="the reservation id")
    return parser


def _ssl_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.client_ca is not None:
            raise ValueError("--client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ValueError("--tls-cert and --tls-key must be given together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile=args.tls_cert, keyfile=args.tls_key)
    if args.client_ca is not None:
        context.load_verify_locations(cafile=args.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen {listen!r} must be HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]"), int(port)


async def _serve(args: argparse.Namespace) -> None:
    host, port = _split_listen(args.listen)
    inventory = load_inventory_file(args.inventory) if args.inventory is not None else None
    token = os.environ.get(TOKEN_ENV) if args.token_file is None else None
    if args.token_file is None and not token and not args.insecure_no_auth:
        raise ValueError(
            f"give --token-file or set ${TOKEN_ENV} (or --insecure-no-auth for local experiments)"
        )
    if args.retain_released_seconds < 0 or args.max_released_rows < 0 or args.mirror_stale_seconds <= 0:
        raise ValueError(
            "--retain-released-seconds and --max-released-rows must not be negative, "
            "--mirror-stale-seconds must be positive"
        )
    if args.mirror_pod_page_size is not None and not 1 <= args.mirror_pod_page_size <= 10_000:
        raise ValueError(
            f"--mirror-pod-page-size must be from 1 to 10000 (got {args.mirror_pod_page_size}): it is how "
            "many pods one page of the pod mirror's list asks for"
        )
    if not args.foreign_retry_seconds >= 1:  # also refuses NaN
        raise ValueError(
            f"--foreign-retry-seconds must be at least 1 (got {args.foreign_retry_seconds}): a refused "
            "pod is told to retry after that long, and less would turn its retries into a busy loop"
        )
    if not 0 <= (percentage := args.percentage_of_nodes_to_score) <= 100:
        raise ValueError(
            f"--percentage-of-nodes-to-score must be from 0 to 100 (got {percentage}): "
            "0 samples as kube-scheduler does by default, 100 examines every node"
        )
    if args.device_allocator is not None:
        if not args.mirror_nodes:
            raise ValueError(
                "--device-allocator needs --mirror-nodes: the devices come from the cluster's "
                "ResourceSlices, which the RM mirrors beside the Nodes"
            )
        if not args.device_allocator.is_file():
            raise ValueError(
                f"--device-allocator {args.device_allocator} is not a file: build the helper with "
                "`python -m bindery.devcluster build --devalloc` and pass the path it prints"
            )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        allocator = None
        if args.device_allocator is not None:
            from bindery.reference_rm.devices import DeviceAllocator

            allocator = DeviceAllocator(binary=args.device_allocator)
            stack.callback(allocator.close)
        server = await stack.enter_async_context(
            serve_reference_rm(
                device_allocator=allocator,
                db_path=args.db,
                db_password_file=args.db_password_file,
                host=host,
                port=port,
                inventory=inventory,
                token=None if args.insecure_no_auth else token,
                token_file=None if args.insecure_no_auth else args.token_file,
                token_overlap=args.token_overlap,
                auth_disabled=args.insecure_no_auth,
                policy=Policy(args.policy),
                ssl_context=_ssl_context(args),
                max_body_bytes=args.max_body_bytes,
                groups=not args.no_groups,
                max_group_body_bytes=args.max_group_body_bytes,
                batch=not args.no_batch,
                max_batch_body_bytes=args.max_batch_body_bytes,
                retention=args.retain_released_seconds,
                max_released_rows=args.max_released_rows,
                cluster_ids=not args.no_cluster_id,
                preemption=not args.no_preemption,
                foreign_retry_seconds=args.foreign_retry_seconds,
                percentage_of_nodes_to_score=args.percentage_of_nodes_to_score,
                admin_token=(
                    args.admin_token_file.read_text(encoding="utf-8").strip()
                    if args.admin_token_file is not None
                    else None
                ),
            )
        )
        if args.mirror_nodes:
            from bindery.apiserver.api import client_from
            from bindery.reference_rm.mirror import (
                DEFAULT_POD_PAGE_SIZE,
                BudgetMirror,
                MirrorGate,
                NodeMirror,
                PodMirror,
            )

            kubeconfig = str(args.kubeconfig) if args.kubeconfig is not None else None
            api = await stack.enter_async_context(await client_from(kubeconfig=kubeconfig))
            # The nodes are shared with every other pod on them: count those too (reference_rm/accounting.py),
            # and stay unready until both the nodes and the pods are known.
            gate = MirrorGate(set_inventory=server.rm.set_inventory, set_bound_pods=server.rm.set_bound_pods)
            stale = args.mirror_stale_seconds
            mirrors = (
                NodeMirror(
                    api=api, label_selector=args.node_selector, on_change=gate.nodes, stale_after=stale
                ),
                PodMirror(
                    api=api,
                    on_change=gate.pods,
                    stale_after=stale,
                    page_size=args.mirror_pod_page_size or DEFAULT_POD_PAGE_SIZE,
                ),
            )
            for mirror, task_name in zip(mirrors, ("node-mirror", "pod-mirror"), strict=True):
                task = asyncio.create_task(mirror.run(), name=task_name)
                stack.callback(task.cancel)
                # A mirror failing for too long leaves the RM placing on a stale snapshot: unready.
                server.rm.add_readiness_check(mirror.health.stale_reason)
            # PodDisruptionBudgets only steer preemption's choice of victims: no readiness check.
            budgets = asyncio.create_task(
                BudgetMirror(api=api, on_change=server.rm.set_budgets, stale_after=stale).run(),
                name="budget-mirror",
            )
            stack.callback(budgets.cancel)
            if allocator is not None:  # the devices a reserve may get, and those claims hold already
                from bindery.reference_rm.devicemirror import ClaimMirror, SliceMirror

                device_mirrors: tuple[SliceMirror | ClaimMirror, ...] = (
                    SliceMirror(api=api, allocator=allocator, stale_after=stale),
                    ClaimMirror(api=api, on_change=server.rm.set_cluster_devices, stale_after=stale),
                )
                for device_mirror, name in zip(device_mirrors, ("slice-mirror", "claim-mirror"), strict=True):
                    task = asyncio.create_task(device_mirror.run(), name=name)
                    stack.callback(task.cancel)
                    server.rm.add_readiness_check(device_mirror.health.stale_reason)
                    server.rm.add_readiness_check(_unlisted_reason(device_mirror))
        print(f"{BANNER}{server.url}", flush=True)
        await stop.wait()


def _unlisted_reason(mirror: SliceMirror | ClaimMirror) -> Callable[[], str | None]:
    """A readiness check: unready until the mirror's first list is in (no device decision before)."""
    return lambda: None if mirror.listed else f"the {mirror.what}s are not listed yet"


#: Start-up failures reported as their reason and exit status 2 (a database that does not answer
#: included), not as a traceback.
_REPORTED: tuple[type[Exception], ...] = (
    InventoryError,
    DatabaseLocked,
    SchemaTooNew,
    ValueError,
    OSError,
    ssl.SSLError,
    *UNREACHABLE,
)


def revoke_reservation(args: argparse.Namespace) -> int:
    """``bindery rm revoke``: 0 revoked (the reservation printed), 1 refused (the RM's problem
    printed), 2 the RM could not be reached."""
    import httpx

    token = args.admin_token_file.read_text(encoding="utf-8").strip()
    try:
        response = httpx.post(
            f"{args.url.rstrip('/')}/admin/v1/reservations/{args.id}/revoke",
            json={"reason": args.reason},
            headers={"Authorization": f"Bearer {token}"},
            verify=args.ca_file or True,
            timeout=10.0,
        )
    except httpx.HTTPError as error:
        print(f"bindery rm revoke: could not reach the RM at {args.url}: {error}", file=sys.stderr)
        return 2
    if response.status_code != 200:
        print(f"bindery rm revoke: HTTP {response.status_code}: {response.text}", file=sys.stderr)
        return 1
    print(response.text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status.

    ``argv`` may start with ``serve`` or omit it (``bindery rm serve ...`` passes what follows it), so
    ``serve`` is implied unless it is already there: ``bindery rm serve --help`` arrives here as
    ``["--help"]`` and must print the serve options, not the one-line list of sub-commands.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["revoke"]:
        return revoke_reservation(build_parser().parse_args(arguments))
    if arguments[:1] != ["serve"]:
        arguments.insert(0, "serve")
    args = build_parser().parse_args(arguments)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    tracing.configure(service_name="bindery-rm")  # only when OTEL_EXPORTER_OTLP_*ENDPOINT is set
    tune_collector()  # as the operator: start-up frozen out of the collector's passes
    try:
        asyncio.run(_serve(args))
    except _REPORTED as error:
        print(f"bindery rm: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
