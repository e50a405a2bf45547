"""``bindery rm slurm``: serve the RM contract in front of slurmrestd (see ``server.py``).

Configuration errors (no token, a bad node map) exit with status 2 before the port is bound.
The first line on stdout, once listening, is ``Slurm RM serving contract v1 at <url>``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import logging
import os
import pathlib
import pwd
import signal
import ssl
import sys
from collections.abc import Sequence

from aiohttp import web

from bindery.slurm_rm.mapping import (
    DEFAULT_GRES_MAP,
    GresMapError,
    NodeMapError,
    parse_gres_map,
    parse_node_map,
)
from bindery.slurm_rm.server import SlurmRM
from bindery.slurm_rm.slurmrest import SlurmRest

TOKEN_ENV = "BINDERY_RM_TOKEN"
BANNER = "Slurm RM serving contract v1 at "


class SlurmUserError(ValueError):
    """The Slurm user cannot be told from the options."""


def slurm_user(*, given: str | None, token: str | None) -> str:
    """The Slurm user placeholder jobs run as, which is also how the adapter tells its own jobs
    from the site's: ``--slurm-user``; else, with a JWT, the user the token was issued to (its
    ``sun`` claim, as ``scontrol token`` writes it); else this process's user (rest_auth/local).

    Why one answer for both: sending one user to slurmrestd and recognising jobs by another made
    every placeholder a stranger, and each retry of a reserve submitted one more.
    """
    if given:
        return given
    if not token:
        return pwd.getpwuid(os.getuid()).pw_name
    parts = token.split(".")
    try:
        payload = parts[1] if len(parts) == 3 else ""
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError) as error:
        raise SlurmUserError(
            f"the Slurm token is not a JWT whose user can be read ({error}); give --slurm-user"
        ) from None
    user = claims.get("sun") if isinstance(claims, dict) else None
    if not isinstance(user, str) or not user:
        raise SlurmUserError("the Slurm token names no user (no 'sun' claim); give --slurm-user")
    return user


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bindery rm slurm",
        description="Serve Bindery's RM contract (v1.2: reserve, commit, release, renew, list, "
        "reservation groups, batches, cluster-id, revocation) in front "
        "of Slurm's slurmrestd: each reservation is a placeholder job on the pod's node.",
    )
    parser.add_argument(
        "--slurmrestd",
        required=True,
        help="slurmrestd's address: unix:/path/to/socket (rest_auth/local) or http(s)://host:port",
    )
    parser.add_argument(
        "--node-map",
        required=True,
        help="KUBERNETES_NODE=SLURM_NODE,… or a YAML file (nodes: [{name, slurm, labels, taints}])",
    )
    parser.add_argument(
        "--gres-map",
        default=",".join(f"{k}={v}" for k, v in DEFAULT_GRES_MAP.items()),
        help="KUBERNETES_RESOURCE=SLURM_GRES,… : extended resources asked of Slurm as GRES "
        '(default %(default)s; "" maps none). A pod asking for an unmapped one fits no node',
    )
    parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (port 0: a free one)")
    parser.add_argument("--token-file", type=pathlib.Path, help=f"bearer token file (or set {TOKEN_ENV})")
    parser.add_argument("--tls-cert", type=pathlib.Path, help="server certificate (PEM); enables HTTPS")
    parser.add_argument("--tls-key", type=pathlib.Path, help="server private key (PEM)")
    parser.add_argument("--partition", help="the Slurm partition placeholder jobs go to (default: Slurm's)")
    parser.add_argument(
        "--slurm-user",
        help="the Slurm user placeholder jobs run as (X-SLURM-USER-NAME with a JWT); default the JWT's "
        "user (its 'sun' claim), or this process's user without a JWT",
    )
    parser.add_argument(
        "--slurm-token-file", type=pathlib.Path, help="JWT for slurmrestd (X-SLURM-USER-TOKEN)"
    )
    parser.add_argument(
        "--start-wait", type=float, default=3.0, help="seconds a reserve waits for Slurm to start its job"
    )
    parser.add_argument(
        "--teardown-wait",
        type=float,
        default=15.0,
        help="seconds more a reserve waits while Slurm tears down placeholders the adapter ended",
    )
    parser.add_argument(
        "--retry-after",
        type=int,
        default=5,
        help="retryAfterSeconds of a refusal while the job is pending in Slurm's queue",
    )
    parser.add_argument(
        "--queue-hold-seconds",
        type=float,
        default=30.0,
        help="how long a pending job waits for its pod to ask again; 0 cancels it at once (no queueing)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = args.token_file.read_text().strip() if args.token_file else os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"bindery rm slurm: give --token-file or set {TOKEN_ENV}", file=sys.stderr)
        return 2
    try:
        nodes = parse_node_map(args.node_map)
        gres_map = parse_gres_map(args.gres_map)
    except (NodeMapError, GresMapError, OSError) as error:
        print(f"bindery rm slurm: {error}", file=sys.stderr)
        return 2
    if (args.tls_cert is None) != (args.tls_key is None):
        print("bindery rm slurm: --tls-cert and --tls-key must be given together", file=sys.stderr)
        return 2
    context = None
    if args.tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(certfile=args.tls_cert, keyfile=args.tls_key)
        except (OSError, ssl.SSLError) as error:
            print(f"bindery rm slurm: cannot load --tls-cert/--tls-key: {error}", file=sys.stderr)
            return 2
    host, _, port = args.listen.rpartition(":")
    slurm_token = args.slurm_token_file.read_text().strip() if args.slurm_token_file else None
    try:
        user = slurm_user(given=args.slurm_user, token=slurm_token)
    except SlurmUserError as error:
        print(f"bindery rm slurm: {error}", file=sys.stderr)
        return 2
    rm = SlurmRM(
        SlurmRest(args.slurmrestd, user=user, token=slurm_token),
        nodes,
        token=token,
        # The user slurmrestd runs the jobs as is the one the adapter recognises them by.
        slurm_user=user,
        partition=args.partition,
        start_wait=args.start_wait,
        teardown_wait=args.teardown_wait,
        retry_after=args.retry_after,
        hold_seconds=args.queue_hold_seconds,
        gres_map=gres_map,
    )
    return asyncio.run(_serve(rm, host or "127.0.0.1", int(port), context))


async def _serve(rm: SlurmRM, host: str, port: int, context: ssl.SSLContext | None = None) -> int:
    runner = web.AppRunner(rm.application(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context)
    await site.start()
    bound = runner.addresses[0]
    print(f"{BANNER}{'https' if context else 'http'}://{bound[0]}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
