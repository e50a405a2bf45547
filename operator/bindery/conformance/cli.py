"""CLI of the conformance kit: ``bindery rm conformance`` (also ``python -m bindery.conformance``).

Exits 0 when every selected check passes, 1 otherwise, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import shlex
import sys
from collections.abc import Sequence

from bindery.conformance.kit import CHECKS, CONTRACT_VERSIONS, DEFAULT_RESOURCE, ConformanceConfig, run_checks
from bindery.conformance.revocation import command_hook


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bindery rm conformance",
        description="Check a resource manager against the Bindery RM contract v1.",
        epilog="The server must offer exactly --capacity units of --resource, unused during the run.",
    )
    # Not required by argparse: --list needs no server.  main() insists on it for a run.
    parser.add_argument("--url", help="base URL of the RM, e.g. https://rm.example:8443 (required to run)")
    parser.add_argument("--token-file", type=pathlib.Path, help="bearer token file (or set BINDERY_RM_TOKEN)")
    parser.add_argument("--resource", default=DEFAULT_RESOURCE, help="resource reserved by the checks")
    parser.add_argument("--capacity", type=int, default=4, help="total of --resource in the pool (default 4)")
    parser.add_argument("--ttl-seconds", type=int, default=2, help="lease used by the expiry check")
    parser.add_argument(
        "--topology-key",
        help="a node label whose value differs on every node of the pool (e.g. kubernetes.io/hostname), "
        "for the reservation-group topology check",
    )
    parser.add_argument(
        "--revoke-command",
        help="for an RM listing the revocation feature: a command that takes a reservation back, with "
        "{id} and {reason} substituted (e.g. 'bindery rm revoke --url URL --admin-token-file F "
        "--reason {reason} {id}')",
    )
    parser.add_argument("--ca-file", help="CA bundle to verify the server's certificate")
    parser.add_argument("--client-cert", nargs=2, metavar=("CERT", "KEY"), help="client certificate and key")
    parser.add_argument("--check", action="append", choices=[c.name for c in CHECKS], help="run only these")
    parser.add_argument(
        "--contract-version",
        choices=CONTRACT_VERSIONS,
        default=CONTRACT_VERSIONS[-1],
        help="the contract version the RM implements; checks of later versions are skipped (default: newest)",
    )
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        for check in CHECKS:
            print(f"{check.name:30} v{check.since}  {check.description}")
        return 0
    if not args.url:
        parser.error("--url is required to run the checks (only --list works without a server)")
    if args.token_file is not None:
        token = args.token_file.read_text(encoding="utf-8").strip()
    else:
        token = os.environ.get("BINDERY_RM_TOKEN", "")
    if not token:
        print("conformance: give --token-file or set BINDERY_RM_TOKEN", file=sys.stderr)
        return 2
    if args.capacity < 2:
        print("conformance: --capacity must be at least 2", file=sys.stderr)
        return 2
    config = ConformanceConfig(
        url=args.url.rstrip("/"),
        token=token,
        resource=args.resource,
        capacity=args.capacity,
        ttl_seconds=args.ttl_seconds,
        ca_file=args.ca_file,
        client_cert=tuple(args.client_cert) if args.client_cert else None,
        topology_key=args.topology_key,
        revoke=command_hook(shlex.split(args.revoke_command)) if args.revoke_command else None,
    )
    results = asyncio.run(run_checks(config, names=args.check, contract_version=args.contract_version))
    for result in results:
        status = "PASS" if result.passed else "FAIL"
        print(f"{status} {result.check.name}: {result.check.description}")
        if result.error:
            print(f"     {result.error}")
    failed = sum(not result.passed for result in results)
    print(f"{len(results) - failed}/{len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
