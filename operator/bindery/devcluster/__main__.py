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
    build = sub.add_parser("build", help="build the control plane, kubectl, helm and kwok (cached)")
    build.add_argument("--print-dir", action="store_true", help="print the binaries' directory and exit")
    build.add_argument(
        "--e2e",
        action="store_true",
        help="build Kubernetes' own e2e.test (for scripts/e2e-upstream; not part of the plane)",
    )
    build.add_argument(
        "--devalloc",
        action="store_true",
        help="build the reference RM's device allocator (for `bindery rm serve --device-allocator`)",
    )
    up = sub.add_parser("up", help="start etcd + kube-apiserver and keep them running until Ctrl-C")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for /readyz (default 90)")
    up.add_argument(
        "--controllers",
        action="store_true",
        help="also run kube-controller-manager (Deployments, Jobs, DaemonSets, namespace deletion, GC)",
    )
    up.add_argument(
        "--kwok",
        action="store_true",
        help="also run kwok: Nodes labelled bindery.dev/kwok=true turn Ready and their pods Running",
    )
    up.add_argument(
        "--kube-scheduler", action="store_true", help="also run kube-scheduler (the default scheduler name)"
    )
    up.add_argument(
        "--cluster",
        action="store_true",
        help="all three: controllers, kwok and kube-scheduler (a small cluster whose pods run)",
    )
    args = parser.parse_args(argv)
    if args.command == "build":
        return binaries.main(
            [
                *(["--print-dir"] if args.print_dir else []),
                *(["--e2e"] if args.e2e else []),
                *(["--devalloc"] if args.devalloc else []),
            ]
        )
    # A shell starts background jobs with SIGINT ignored, and Python keeps it so: make Ctrl-C
    # (or `kill -INT`) stop the plane whichever way `up` was started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    with ControlPlane.start(
        timeout=args.timeout,
        controllers=args.controllers or args.cluster,
        kwok=args.kwok or args.cluster,
        kube_scheduler=args.kube_scheduler or args.cluster,
    ) as plane:
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
