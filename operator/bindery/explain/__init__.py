"""`bindery explain POD`: why a pod is pending, or where and how it was bound.

Read-only, with the kubeconfig alone: the pod's PodScheduled condition and scheduling events, the
ResourceManager serving its scheduler name and what that resource manager holds for it (reservation,
state, node, lease), its volume claims, and, from the operator's read-only `/debug/queue` (reached
through the apiserver's service proxy, or `--operator-url`), where it waits and when it is tried
next. What it cannot see it says.
Exit status 0 when answered, 1 when the pod does not exist, 2 when the cluster could not be read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
from collections.abc import Sequence

from bindery.explain.facts import Explanation, explain, render

__all__ = ["Explanation", "explain", "main", "render"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bindery explain", description="Why a pod is pending, or where and how it was bound."
    )
    parser.add_argument("pod", help="the pod's name")
    parser.add_argument("--namespace", "-n", default="default", help="the pod's namespace (default: default)")
    parser.add_argument(
        "--kubeconfig", type=pathlib.Path, help="default: $KUBECONFIG, ~/.kube/config, in-cluster"
    )
    parser.add_argument("--output", "-o", choices=("text", "json"), default="text")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--operator-url",
        help="where the operator serves its metrics, e.g. http://127.0.0.1:9090 (a local `bindery run "
        "--metrics-addr`); default: its Service, through the apiserver's service proxy",
    )
    where.add_argument(
        "--operator-service",
        metavar="NAMESPACE/NAME[:PORT]",
        help="the operator's metrics Service (default: the one labelled app.kubernetes.io/part-of=bindery, "
        "app.kubernetes.io/component=operator, port 'metrics')",
    )
    where.add_argument(
        "--no-operator", action="store_true", help="do not ask the operator for the pod's queue position"
    )
    parser.add_argument(
        "--operator-token-file",
        type=pathlib.Path,
        metavar="PATH",
        help="a bearer token for --operator-url (the operator answers /debug/queue only to a user who "
        "may get it), e.g. from `kubectl create token SA -n NS > token`",
    )
    parser.add_argument(
        "--cluster-id",
        help="the cluster id the operator runs with (its --cluster-id); default: the UID of the kube-system "
        "namespace",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="give up after this many seconds (default %(default)s)"
    )
    return parser


async def _explain(args: argparse.Namespace) -> Explanation:
    from bindery.apiserver import client_for
    from bindery.controller.startup.connection import load_configuration
    from bindery.explain.collect import OperatorAddress, explain_pod

    operator: OperatorAddress | None = OperatorAddress(url=args.operator_url, token=args.operator_token)
    if args.no_operator:
        operator = None
    elif args.operator_service:
        operator = OperatorAddress.parse_service(args.operator_service)
    configuration = await load_configuration(kubeconfig=args.kubeconfig)
    async with client_for(configuration) as api, asyncio.timeout(args.timeout):
        return await explain_pod(
            api=api, namespace=args.namespace, name=args.pod, operator=operator, cluster_id=args.cluster_id
        )


def main(argv: Sequence[str] | None = None) -> int:
    from bindery.explain.collect import PodNotFound

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.operator_service:
        from bindery.explain.collect import OperatorAddress

        try:
            OperatorAddress.parse_service(args.operator_service)
        except ValueError as exc:
            parser.error(str(exc))
    args.operator_token = None
    if args.operator_token_file is not None:
        try:
            args.operator_token = args.operator_token_file.read_text().strip() or None
        except OSError as exc:
            parser.error(f"--operator-token-file: {exc}")
    try:
        answer = asyncio.run(_explain(args))
    except PodNotFound as exc:
        print(f"bindery explain: {exc}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"bindery explain: the cluster did not answer within {args.timeout:g} s", file=sys.stderr)
        return 2
    except Exception as exc:  # no cluster, no permission: say so
        print(f"bindery explain: could not read the cluster: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(answer.as_json(), indent=2) if args.output == "json" else render(answer))
    return 0
