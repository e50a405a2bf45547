"""Where the operator serves /debug/queue (issue 20, scenario 9).

The view says which pods wait and when they are tried next. It used to be served beside /metrics on
every interface the metrics address named (the chart's 0.0.0.0:9090), to anyone who reached the
port. Now it listens on loopback only, unless the operator is given an address for it explicitly
(`bindery run --debug-addr`), which must then sit behind authentication.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import httpx
import pytest

from bindery.controller.entry import EmbeddedOperator
from bindery.controller.metrics import debug_queue_placement, is_loopback
from bindery.controller.options import OperatorOptions


def test_the_queue_views_stay_on_loopback_unless_given_an_address_of_their_own() -> None:
    assert debug_queue_placement(metrics_address="0.0.0.0:9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address=":9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="[::]:9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="10.0.0.7:9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="metrics.example:9090", debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="127.0.0.1:9090", debug_address=None) == "metrics"
    assert debug_queue_placement(metrics_address="[::1]:9090", debug_address=None) == "metrics"
    assert debug_queue_placement(metrics_address="localhost:9090", debug_address=None) == "metrics"
    assert debug_queue_placement(metrics_address=None, debug_address=None) == "none"
    assert debug_queue_placement(metrics_address="0.0.0.0:9090", debug_address="0.0.0.0:9091") == "own"
    assert is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0")


@pytest.fixture
async def exposed(operator_kubeconfig: pathlib.Path) -> AsyncIterator[EmbeddedOperator]:
    """Metrics on every interface, as the chart runs it; the queue views on a loopback port of their own."""
    operator = EmbeddedOperator(
        options=OperatorOptions(
            kubeconfig=operator_kubeconfig,
            probe_interval=2.0,
            metrics_address="0.0.0.0:0",
            debug_address="127.0.0.1:0",
        )
    )
    await operator.start()
    try:
        yield operator
    finally:
        await operator.stop()


async def test_metrics_on_every_interface_do_not_carry_the_queue_views(exposed: EmbeddedOperator) -> None:
    metrics, debug = exposed.runtime.metrics_server, exposed.runtime.debug_server
    assert metrics is not None
    assert debug is not None
    async with httpx.AsyncClient() as http:
        scraped = await http.get(f"http://127.0.0.1:{metrics.port}/metrics")
        on_metrics = await http.get(f"http://127.0.0.1:{metrics.port}/debug/queue")
        on_metrics_pod = await http.get(f"http://127.0.0.1:{metrics.port}/debug/queue/default/p")
        own = await http.get(f"http://127.0.0.1:{debug.port}/debug/queue")
        own_metrics = await http.get(f"http://127.0.0.1:{debug.port}/metrics")
    assert scraped.status_code == 200
    assert (on_metrics.status_code, on_metrics_pod.status_code) == (404, 404)  # no such route there
    assert own.status_code == 200
    assert own.json()["leading"] is True
    assert own_metrics.status_code == 404  # the debug listener serves the views only
