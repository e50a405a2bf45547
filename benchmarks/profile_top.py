"""Top functions of a py-spy collapsed-stack profile (``py-spy record --format raw``), by self and total time.

Run:  .venv/bin/python benchmarks/profile_top.py PROFILE.txt [--top 25] [--thread-filter TEXT]

Each line of the profile is ``frame;frame;...;frame COUNT`` (outermost first). Self time is the
samples whose innermost frame is the function; total time the samples whose stack holds it at least
once (recursion counted once). Percentages are of the busy samples: idle ones (the event loop
waiting in ``select``, an executor thread waiting for work in ``_worker``) are left out; the
reference RM's store works in its writer thread, which counts. ``--areas`` adds Bindery's operator
broken down by area (Kopf's per-event machinery, the cycle's steps, socket writes, logging...).
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re

AREAS = [
    (
        "Kopf per-event machinery (queueing, processing, invocation)",
        ("queueing.py", "processing.py", "invocation.py"),
    ),
    ("PendingPods.on_pod_event (Bindery's own handling of a pod event)", ("PendingPods.on_pod_event",)),
    ("unbound-pod watch outside Kopf (bindery.controller.watches.unbound)", ("UnboundPodWatcher",)),
    ("schedule_one (the scheduling cycle)", ("schedule_one (bindery/scheduling/cycle.py",)),
    ("  RM client reserve", ("ResourceManagerClient.reserve",)),
    ("  RM client commit", ("ResourceManagerClient.commit",)),
    ("  Binding POST", ("DefaultBinder.bind",)),
    ("  Scheduled event POST", ("ScheduledEvent.post_bind",)),
    ("aiohttp request-body tasks (write_bytes)", ("ClientRequest.write_bytes",)),
    ("socket send (loopback TCP, in the kernel)", ("_SelectorSocketTransport.write",)),
    ("bound-pod releases (fed by the placed-pod watch)", ("BoundPodReleases", "PlacedPodWatcher._dispatch")),
    ("logging", ("Logger._log", "LoggerAdapter.log", "Logger.info", "Logger.log")),
    ("JSON decoding", ("JSONDecoder.decode",)),
]


def frame_name(frame: str) -> str:
    """'function (path/to/module.py:123)' → 'function (module.py)': lines vary, functions do not."""
    match = re.match(r"(.*) \((.*?):?\d*\)$", frame)
    if match is None:
        return frame
    function, path = match.groups()
    parts = path.rstrip(":").split("/")
    short = "/".join(parts[-2:]) if "site-packages" in path or "bindery" in path else parts[-1]
    return f"{function} ({short})"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("profile", type=pathlib.Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--areas", action="store_true", help="Bindery operator: share of each area")
    a = parser.parse_args()
    areas: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    total_time: collections.Counter[str] = collections.Counter()
    samples = idle = 0
    for line in a.profile.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.split(";")]
        samples += count
        if frames[-1].endswith("(selectors.py)") or frames[-1].startswith("_worker ("):
            idle += count  # the event loop waiting, or an executor thread waiting for work
            continue
        for area, keys in AREAS:
            if any(key in stack for key in keys):
                areas[area] += count
        self_time[frames[-1]] += count
        for name in set(frames):
            total_time[name] += count
    busy = samples - idle
    print(f"{samples} samples, {busy} busy ({100 * busy / max(samples, 1):.0f}%); % of busy samples")
    if a.areas:
        print(f"\n{'share':>7}  area of the operator thread")
        for area, _ in AREAS:
            print(f"{100 * areas[area] / max(busy, 1):6.1f}%  {area}")
    print(f"\n{'self %':>7}  function")
    for name, count in self_time.most_common(a.top):
        print(f"{100 * count / max(busy, 1):6.1f}%  {name}")
    print(f"\n{'total %':>7}  function")
    for name, count in total_time.most_common(a.top):
        print(f"{100 * count / max(busy, 1):6.1f}%  {name}")


if __name__ == "__main__":
    main()
