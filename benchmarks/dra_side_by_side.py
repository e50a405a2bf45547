"""DRA claims under kube-scheduler and under Bindery, side by side on one plane: what each bound and chose.

    .venv/bin/python benchmarks/dra_side_by_side.py [--out dra-side-by-side.json]

One plane with kube-controller-manager (its resourceclaim controller makes the claims of
templates), five Nodes, and for each scheduler a driver of its own (so neither sees the other's
devices): ResourceSlices published as a driver would, two devices on each of the first two nodes.
Four cases per scheduler, in this order, each in a namespace of its own:

- `named`: six pods, each naming a claim of one device: four devices, so four bound, two waiting;
- `template`: two pods from a ResourceClaimTemplate of one device, once the named pods are deleted;
- `count2`: one pod whose claim asks for two devices (they must be on one node);
- `shared`: one claim of one device named by two pods (both on that device's node, both consumers).

Pods and claims of a case are deleted before the next one; the table says per case and scheduler:
pods bound, the devices each claim got (pool/device), and its consumers. A figure not a test:
kube-scheduler is the reference, Bindery's reference RM allocates with Kubernetes' own allocator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
import tempfile
import time
from typing import Any

import ceiling as bench

GROUP = "/apis/resource.k8s.io/v1"
NODES = 5
CASES = ("named", "template", "count2", "shared")


def pod(name: str, *, scheduler: str, claim: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "resourceClaims": [{"name": "gpu", **claim}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/pause",
                    "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def claim_spec(*, driver: str, count: int = 1) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": driver, "allocationMode": "ExactCount", "count": count},
                }
            ]
        }
    }


async def publish(api: bench.Api, *, driver: str, nodes: list[str]) -> None:
    await api.call(
        "POST",
        f"{GROUP}/deviceclasses",
        {
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )
    for node in nodes[:2]:
        await api.call(
            "POST",
            f"{GROUP}/resourceslices",
            {
                "metadata": {"name": f"{node}-{driver}"},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}],
                },
            },
        )


async def settle(api: bench.Api, *, namespace: str, pods: list[str], expect: int, within: float = 60) -> None:
    """Until `expect` of `pods` are bound and the rest were refused once, or `within` passes."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        items, _ = await api.list_all(f"/api/v1/namespaces/{namespace}/pods")
        bound = [p for p in items if p["spec"].get("nodeName")]
        refused = [
            p
            for p in items
            if any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        ]
        if len(bound) >= expect and len(bound) + len(refused) >= len(pods):
            return
        await asyncio.sleep(0.5)


async def case(api: bench.Api, *, name: str, scheduler: str, driver: str, namespace: str) -> dict[str, Any]:
    await bench.create_namespace(api, namespace)
    base = f"/api/v1/namespaces/{namespace}"
    claims = f"{GROUP}/namespaces/{namespace}/resourceclaims"
    pods: list[dict[str, Any]] = []
    expect = 0
    if name == "named":
        for i in range(6):
            await api.call("POST", claims, {"metadata": {"name": f"c{i}"}, "spec": claim_spec(driver=driver)})
            pods.append(pod(f"p{i}", scheduler=scheduler, claim={"resourceClaimName": f"c{i}"}))
        expect = 4
    elif name == "template":
        await api.call(
            "POST",
            f"{GROUP}/namespaces/{namespace}/resourceclaimtemplates",
            {"metadata": {"name": "one-gpu"}, "spec": {"spec": claim_spec(driver=driver)}},
        )
        pods = [
            pod(f"t{i}", scheduler=scheduler, claim={"resourceClaimTemplateName": "one-gpu"})
            for i in range(2)
        ]
        expect = 2
    elif name == "count2":
        await api.call(
            "POST", claims, {"metadata": {"name": "two"}, "spec": claim_spec(driver=driver, count=2)}
        )
        pods = [pod("q0", scheduler=scheduler, claim={"resourceClaimName": "two"})]
        expect = 1
    else:
        await api.call("POST", claims, {"metadata": {"name": "shared"}, "spec": claim_spec(driver=driver)})
        pods = [pod(f"s{i}", scheduler=scheduler, claim={"resourceClaimName": "shared"}) for i in range(2)]
        expect = 2
    for body in pods:
        await api.call("POST", f"{base}/pods", body)
    await settle(api, namespace=namespace, pods=[p["metadata"]["name"] for p in pods], expect=expect)
    items, _ = await api.list_all(f"{base}/pods")
    listed, _ = await api.list_all(claims)
    allocated = {
        c["metadata"]["name"]: {
            r["pool"]
            for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
            or []
        }
        for c in listed
    }

    def claim_of(p: dict[str, Any]) -> str:
        named = p["spec"]["resourceClaims"][0].get("resourceClaimName")
        statuses = (p.get("status") or {}).get("resourceClaimStatuses") or [{}]
        return str(named or statuses[0].get("resourceClaimName") or "")

    result = {
        # the slices are node-local and each pool is named after its node
        "on_device_node": sum(
            1
            for p in items
            if p["spec"].get("nodeName") and allocated.get(claim_of(p)) == {p["spec"]["nodeName"]}
        ),
        "pods": len(items),
        "bound": sum(1 for p in items if p["spec"].get("nodeName")),
        "nodes": sorted(p["spec"]["nodeName"] for p in items if p["spec"].get("nodeName")),
        "claims": {
            c["metadata"]["name"]: {
                "devices": [
                    f"{r['pool']}/{r['device']}"
                    for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                        "results"
                    )
                    or []
                ],
                "consumers": len((c.get("status") or {}).get("reservedFor") or []),
            }
            for c in listed
        },
    }
    # The next case starts with every device free: pods go, then their claims (finalizers cleared).
    for p in items:
        await api.call(
            "DELETE", f"{base}/pods/{p['metadata']['name']}?gracePeriodSeconds=0", ok=(200, 202, 404)
        )
    for c in listed:
        path = f"{claims}/{c['metadata']['name']}"
        current = await api.call("GET", path, ok=(200, 404))
        if current is not None and current.get("kind") == "ResourceClaim":  # a 404 answers a Status
            current["metadata"]["finalizers"] = []
            current.pop("status", None)
            await api.call("PUT", path, current, ok=(200, 404, 409))
            await api.call("DELETE", path, ok=(200, 202, 404))
    return result


async def run(plane: Any, workdir: pathlib.Path) -> dict[str, Any]:
    await bench.install_bindery(plane)
    async with bench.Api(plane.kubeconfig) as api:
        nodes = await bench.make_nodes(api, count=NODES, kwok=False)
        await bench.create_namespace(api, "bindery-system")  # the ResourceManager's token Secret
        wrapper = bench.Plane(plane, workdir, api)
        allocator = await asyncio.to_thread(_devalloc)
        report: dict[str, Any] = {}
        for contender in ("kube-scheduler", "bindery"):
            driver = f"gpu-{contender}.example.com"
            await publish(api, driver=driver, nodes=nodes)
            if contender == "kube-scheduler":
                serving = wrapper.kube_scheduler("default-scheduler", qps=None)
            else:
                serving = wrapper.bindery("bindery", rm_options=("--device-allocator", str(allocator)))
            async with serving as served:
                results = {}
                for name in CASES:
                    results[name] = await case(
                        api,
                        name=name,
                        scheduler=served.scheduler_name,
                        driver=driver,
                        namespace=f"dra-{contender}-{name}",
                    )
                    bench.say(f"{contender:15} {name:9} {json.dumps(results[name])}")
                report[contender] = results
        return report


def _devalloc() -> pathlib.Path:
    from bindery.devcluster import binaries

    return binaries.ensure_devalloc_built(quiet=True)


def table(report: dict[str, Any]) -> str:
    lines = [
        "| case | scheduler | pods bound | bound on their devices' node | devices per claim (pool/device) "
        "| consumers per claim |",
        "|---|---|---|---|---|---|",
    ]
    for name in CASES:
        for contender, results in report.items():
            r = results[name]
            devices = "; ".join(
                f"{c}: {', '.join(v['devices']) or '-'}" for c, v in sorted(r["claims"].items())
            )
            consumers = ", ".join(f"{c}: {v['consumers']}" for c, v in sorted(r["claims"].items()))
            counts = f"{r['bound']}/{r['pods']} | {r['on_device_node']}"
            lines.append(f"| {name} | {contender} | {counts} | {devices} | {consumers} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("dra-side-by-side.json"))
    args = parser.parse_args(argv)
    from bindery.devcluster.plane import ControlPlane

    with (
        tempfile.TemporaryDirectory(prefix="dra-") as directory,
        ControlPlane.start(controllers=True) as plane,
    ):
        report = asyncio.run(run(plane, pathlib.Path(directory)))
    args.out.write_text(json.dumps(report, indent=2))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
