"""Issue 21 side by side: the issue's preemption scenario under kube-scheduler and under Bindery on
the cluster plane (tests/placement/preemption_side_by_side.py has the scenario and the command that
prints the table with times).

kube-scheduler calibrates: it evicts one priority-10 pod and binds the priority-100000 pod where the
victim was. Bindery must do the same: one victim, from the node the preemptor is bound to. The
times are printed, never asserted.
"""

from __future__ import annotations

import pathlib

from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.placement.preemption_side_by_side import (
    Outcome,
    fresh_namespace,
    table,
    under_bindery,
    under_kube_scheduler,
)


def one_victim_from_the_preemptors_node(outcome: Outcome) -> bool:
    return (
        outcome.node is not None
        and len(outcome.victims) == 1
        and next(iter(outcome.victims.values())) == outcome.node
    )


async def test_bindery_preempts_as_kube_scheduler_does_in_the_issues_scenario(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    async with fresh_namespace(cluster_api) as namespace:
        kube = await under_kube_scheduler(cluster_api, namespace=namespace)
    async with fresh_namespace(cluster_api) as namespace:
        ours = await under_bindery(
            cluster_api,
            plane=cluster,
            operator_kubeconfig=cluster_operator_kubeconfig,
            namespace=namespace,
            directory=tmp_path,
        )
    summary = table([[kube], [ours]])
    print("\n" + summary)
    assert one_victim_from_the_preemptors_node(kube), f"calibration: kube-scheduler did otherwise\n{summary}"
    assert one_victim_from_the_preemptors_node(ours), summary
