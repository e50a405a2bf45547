"""Bindery's gangs (through the reference RM) beside kube-scheduler's GangScheduling, side by side.

    python -m tests.gangs.compare              # scenarios (a)-(c) under both; prints a Markdown table
    python -m tests.gangs.compare --only kube-scheduler
    python -m tests.gangs.compare --repeat 5       # the median time of 5 runs each

Starts its own cluster plane (kube-controller-manager, kwok, kube-scheduler, all with the Workload
API gates) and, for Bindery, the reference RM and `bindery run` as processes, exactly as the tests
do. Each scenario runs in a fresh namespace on a kwok pool of its own. Times are from the last
member's creation (or the room being freed, for (a)) to every member bound, polled every 0.3 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import sys
import tempfile
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from kubernetes_asyncio import client

from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.devcluster.plane import ControlPlane
from tests.conftest import OPERATOR_USER, api_client_for
from tests.gangs.scenarios import LAYOUTS, SCENARIOS, Result, Stage, resource_manager_ready
from tests.workloads import bindery_on

Scenario = Callable[[Stage], Awaitable[Result]]
KUBE_SCHEDULER = "default-scheduler"


@contextlib.asynccontextmanager
async def namespace(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"gang-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace(body={"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(name)


async def under_kube_scheduler(api: client.ApiClient, scenario: Scenario) -> Result:
    async with namespace(api) as ns:
        stage = Stage(api=api, namespace=ns, scheduler=KUBE_SCHEDULER)
        try:
            return await scenario(stage)
        finally:
            await stage.cleanup()


async def under_bindery(
    api: client.ApiClient,
    plane: ControlPlane,
    operator_kubeconfig: pathlib.Path,
    scenario: Scenario,
    directory: pathlib.Path,
) -> Result:
    async with namespace(api) as ns:
        pool = uuid.uuid4().hex[:6]
        stage = Stage(api=api, namespace=ns, scheduler="", pool=pool)
        await stage.pool(*LAYOUTS[scenario.__name__])  # before the RM: it starts knowing every node
        async with bindery_on(
            api=api,
            cluster=plane,
            operator_kubeconfig=operator_kubeconfig,
            namespace=ns,
            pool=pool,
            directory=directory / ns,
        ) as bindery:
            stage.scheduler = bindery.scheduler
            await resource_manager_ready(api, bindery.rm_name)
            try:
                return await scenario(stage)
            finally:
                await stage.cleanup()


async def failed(scenario: Scenario, run: Awaitable[Result]) -> Result:
    try:
        return await run
    except Exception as error:
        traceback.print_exc(file=sys.stderr)
        return Result(scenario=scenario.__name__, outcome=f"FAILED: {str(error).splitlines()[0][:120]}")


def combine(results: list[Result]) -> Result | None:
    """Several runs of one scenario under one scheduler: the first's outcome (and how many runs
    ended otherwise), the median time, and every run's time in the notes."""
    if not results:
        return None
    first = results[0]
    times = sorted(r.seconds for r in results if r.seconds is not None)
    outcome = first.outcome
    others = [r.outcome for r in results[1:] if r.outcome != first.outcome]
    if others:
        outcome += f" ({len(others)} of {len(results)} runs otherwise: {others[0]})"
    if len(results) > 1:
        outcome += f" [{len(results)} runs]"
    median = times[len(times) // 2] if times else None
    follows = sorted(r.follow_seconds for r in results if r.follow_seconds is not None)
    if follows:
        outcome += f"; followed {follows[len(follows) // 2]:.2f} s after the first finished"
    notes = [*first.notes, f"times: {', '.join(f'{t:.2f}' for t in times)} s"]
    return Result(scenario=first.scenario, outcome=outcome, seconds=median, notes=notes)


def table(rows: list[tuple[Result | None, Result | None]]) -> str:
    lines = [
        "| scenario | Bindery (reference RM) | time | kube-scheduler GangScheduling | time |",
        "|---|---|---|---|---|",
    ]

    def cell(result: Result | None) -> tuple[str, str]:
        if result is None:
            return "not run", ""
        return result.outcome, f"{result.seconds:.2f} s" if result.seconds is not None else ""

    for ours, theirs in rows:
        either = ours or theirs
        name = either.scenario if either is not None else "?"
        lines.append(f"| {name} | {' | '.join(cell(ours))} | {' | '.join(cell(theirs))} |")
    return "\n".join(lines)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=("bindery", "kube-scheduler"))
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each scenario per scheduler (median time)"
    )
    args = parser.parse_args(argv)
    with (
        ControlPlane.start(controllers=True, kwok=True, kube_scheduler=True) as plane,
        tempfile.TemporaryDirectory() as tmp,
    ):
        api = await api_client_for(str(plane.kubeconfig))
        try:
            await apply_crd(api=api)
            await grant_operator(api=api, user=OPERATOR_USER)
            operator_kubeconfig = plane.mint_kubeconfig(user=OPERATOR_USER)
            rows: list[tuple[Result | None, Result | None]] = []
            for scenario in SCENARIOS:
                bindery_runs: list[Result] = []
                kube_runs: list[Result] = []
                for _ in range(args.repeat):
                    if args.only != "kube-scheduler":
                        bindery_runs.append(
                            await failed(
                                scenario,
                                under_bindery(api, plane, operator_kubeconfig, scenario, pathlib.Path(tmp)),
                            )
                        )
                    if args.only != "bindery":
                        kube_runs.append(await failed(scenario, under_kube_scheduler(api, scenario)))
                ours, theirs = combine(bindery_runs), combine(kube_runs)
                rows.append((ours, theirs))
                for result in (ours, theirs):
                    for note in result.notes if result else ():
                        print(f"  {result.scenario if result else ''}: {note}", file=sys.stderr)
        finally:
            await api.close()
    print(table(rows))
    return 0 if all("FAILED" not in (r.outcome if r else "") for row in rows for r in row) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
