"""`bindery audit`: check Bindery's promises against the cluster and the resource managers.

Read-only, with the kubeconfig alone. Exit status 0 when clean, 1 on any finding, 2 when part of
the cluster could not be checked (and nothing was found in the rest), so scripts and CI can gate on it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import pathlib
import sys
from collections.abc import Sequence

from bindery.audit.collect import Audit, run_audit, table
from bindery.audit.findings import Finding

__all__ = ["Audit", "Finding", "main", "run_audit"]

#: Seconds to wait before looking again when part of the cluster could not be read (then it is
#: reported as not checked, exit status 2).
RETRY_WAITS = (1.0, 2.0, 4.0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bindery audit",
        description="Report leaked reservations, bound pods without one, overcommitted nodes and pending "
        "pods nobody explained. Exit status: 0 clean, 1 findings, 2 could not check everything.",
    )
    parser.add_argument(
        "--kubeconfig", type=pathlib.Path, help="default: $KUBECONFIG, ~/.kube/config, in-cluster"
    )
    parser.add_argument(
        "--namespace", "-n", action="append", default=[], help="only pods and reservations of this namespace"
    )
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument(
        "--grace",
        type=float,
        default=60.0,
        help="seconds a pending pod may wait without a PodScheduled=False condition (default %(default)s)",
    )
    parser.add_argument(
        "--cluster-id",
        help="the cluster id the operator runs with (its --cluster-id, the chart's clusterId); default: the "
        "UID of the kube-system namespace, as the operator derives it",
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="give up after this many seconds (default %(default)s)"
    )
    return parser


async def _audit(args: argparse.Namespace) -> Audit:
    from bindery.apiserver import Unavailable, client_for
    from bindery.controller.startup.connection import load_configuration

    configuration = await load_configuration(kubeconfig=args.kubeconfig)
    async with client_for(configuration) as api, asyncio.timeout(args.timeout):
        for wait in (*RETRY_WAITS, None):
            try:
                audit = await run_audit(
                    api=api,
                    namespaces=tuple(args.namespace),
                    grace=datetime.timedelta(seconds=args.grace),
                    cluster_id=args.cluster_id,
                )
            except Unavailable as exc:
                if wait is None or exc.status not in (429, 500, 503, 504):
                    raise
                problem = f"the apiserver answered {exc.status} {exc.reason or exc.message}"
            else:
                if wait is None or not audit.gaps:
                    return audit
                problem = f"{len(audit.gaps)} part(s) could not be checked"
            # A restarting apiserver answers 429 "storage is (re)initializing", an RM may be
            # restarting: what could not be read now may be readable in a moment.
            print(f"bindery audit: {problem}; looking again in {wait:g} s", file=sys.stderr)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable: the last try returns or raises")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        audit = asyncio.run(_audit(args))
    except TimeoutError:
        print(
            f"bindery audit: the apiserver or a resource manager did not answer within {args.timeout:g} s; "
            "nothing was checked (raise --timeout on a large cluster)",
            file=sys.stderr,
        )
        return 2
    except Exception as exc:  # no cluster, no permission: say so, as an incomplete audit
        print(f"bindery audit: could not read the cluster: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(audit.as_json(), indent=2) if args.output == "json" else table(audit))
    if audit.findings:
        return 1
    return 2 if audit.gaps else 0
