"""``python -m bindery.devcluster build|up``: build the binaries, or run a plane until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence

from bindery.devcluster import binaries
from bindery.devcluster.plane import ControlPlane


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bindery devcluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build etcd, kube-apiserver, kube-scheduler, kubectl, helm (cached)")
    build.add_argument("--print-dir", action="store_true", help="print the binaries' directory and exit")
    up = sub.add_parser("up", help="start etcd + kube-apiserver and keep them running until Ctrl-C")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for /readyz (default 90)")
    args = parser.parse_args(argv)
    if args.command == "build":
        return binaries.main(["--print-dir"] if args.print_dir else [])
    # A shell starts background jobs with SIGINT ignored, and Python keeps it so: make Ctrl-C
    # (or `kill -INT`) stop the plane whichever way `up` was started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    with ControlPlane.start(timeout=args.timeout) as plane:
        # Block the stop signals before the kubeconfig is printed, then wait for them with
        # sigwait: whoever reads that line may signal at once, and a KeyboardInterrupt raised
        # between the print and a try block would end the process before the plane is stopped.
        stop = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        print(f"control plane ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
        print(f"export KUBECONFIG={plane.kubeconfig} PATH={plane.bin_dir}:$PATH", file=sys.stderr)
        print("press Ctrl-C to stop", file=sys.stderr, flush=True)
        print(plane.kubeconfig, flush=True)
        received = signal.sigwait(stop)
        print(f"stopping on {signal.Signals(received).name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
