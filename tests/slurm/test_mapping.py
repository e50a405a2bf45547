"""The adapter's pure mappings: node map, job size, the comment that carries a reservation."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from bindery.rm.models import ReservationRequest
from bindery.slurm_rm import cli
from bindery.slurm_rm.mapping import (
    CommentTooLong,
    GresMapError,
    JobRecord,
    NodeMapError,
    allowed,
    decode_records,
    encode_component,
    job_size,
    parse_gres,
    parse_gres_map,
    parse_node_map,
)
from bindery.slurm_rm.slurmrest import SlurmRest


def _request(resources: dict[str, str], **placement: object) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "pod": {"uid": "u1", "namespace": "ns", "name": "p", "schedulerName": "s"},
            "resources": resources,
            "placement": placement,
            "idempotencyKey": "u1",
            "ttlSeconds": 30,
        }
    )


def test_a_job_asks_for_whole_cpus_and_mebibytes_never_zero() -> None:
    size, unmapped = job_size(_request({"cpu": "1500m", "memory": "100Mi", "pods": "1"}))
    assert (size.cpus, size.memory_mib, unmapped) == (2, 100, [])
    size, _ = job_size(_request({"cpu": "100m"}))
    assert (size.cpus, size.memory_mib) == (1, 1)  # no memory request would get the whole node


def test_an_extended_resource_without_a_gres_is_refused_never_dropped() -> None:
    size, refusals = job_size(_request({"cpu": "1", "example.com/fpga": "1", "example.com/zero": "0"}))
    assert refusals == [
        "Insufficient example.com/fpga (mapped to no Slurm GRES; see the adapter's --gres-map)"
    ]
    assert size.gres == ()
    # The default map has nvidia.com/gpu; an empty one maps nothing.
    _, refusals = job_size(_request({"cpu": "1", "nvidia.com/gpu": "1"}), {})
    assert [r.split(" (")[0] for r in refusals] == ["Insufficient nvidia.com/gpu"]


def test_mapped_extended_resources_become_a_gres_spec_in_whole_units() -> None:
    gres_map = parse_gres_map("nvidia.com/gpu=gpu, example.com/fpga=fpga")
    size, refusals = job_size(
        _request({"cpu": "1", "nvidia.com/gpu": "2", "example.com/fpga": "1"}), gres_map
    )
    assert (refusals, size.gres_spec(), size.gres_counts()) == ([], "fpga:1,gpu:2", {"fpga": 1, "gpu": 2})
    assert job_size(_request({"cpu": "1", "nvidia.com/gpu": "1"}))[0].gres_spec() == "gpu:1"  # default map
    _, refusals = job_size(_request({"cpu": "1", "nvidia.com/gpu": "500m"}))
    assert refusals == ["nvidia.com/gpu 500m is not a whole number (Slurm counts GRES gpu in units)"]


@pytest.mark.parametrize(
    "text", ["gpu", "nvidia.com/gpu", "gpu=gpu", "nvidia.com/gpu=gpu:1", "a/b=x,a/b=y", "a/b=x,c/d=x"]
)
def test_a_malformed_gres_map_is_refused_naming_the_entry(text: str) -> None:
    with pytest.raises(GresMapError, match="--gres-map"):
        parse_gres_map(text)
    assert parse_gres_map("") == {}


def test_gres_counts_are_read_from_slurmrestds_words() -> None:
    assert parse_gres("gpu:2") == {"gpu": 2}
    assert parse_gres("gpu:a100:1(IDX:0,2),gpu:v100:1(S:0-1),fpga:3") == {"gpu": 2, "fpga": 3}
    assert parse_gres("gres:gpu:1,gres:fpga:2") == {"gpu": 1, "fpga": 2}  # a job's tres_per_node
    assert parse_gres("(null)") == parse_gres("") == parse_gres(None) == {}


def test_node_map_from_pairs_and_from_a_file(tmp_path: pathlib.Path) -> None:
    assert [(n.name, n.slurm) for n in parse_node_map("k0=s0, k1=s1")] == [("k0", "s0"), ("k1", "s1")]
    path = tmp_path / "map.yaml"
    path.write_text(
        "nodes:\n- {name: k0, slurm: s0, labels: {zone: a},\n"
        "   taints: [{key: x, value: y, effect: NoSchedule}]}\n"
        "- {name: s1}\n"
    )
    nodes = parse_node_map(str(path))
    assert [(n.name, n.slurm, dict(n.labels)) for n in nodes] == [
        ("k0", "s0", {"zone": "a"}),
        ("s1", "s1", {}),
    ]
    assert allowed(nodes[0], _request({"cpu": "1"})) == "had untolerated taint {x: y}"
    assert allowed(nodes[0], _request({"cpu": "1"}, tolerations=[{"operator": "Exists"}])) is None
    assert allowed(nodes[1], _request({"cpu": "1"}, nodeSelector={"zone": "a"})) is not None


@pytest.mark.parametrize("text", ["k0", "k0=s0,k1=s0", "=s0", ""])
def test_a_bad_node_map_is_refused(text: str) -> None:
    with pytest.raises(NodeMapError):
        parse_node_map(text)


def test_the_comment_round_trips_and_ignores_other_jobs() -> None:
    record = JobRecord(
        key="k", pod_uid="u", scheduler="s", namespace="ns", name="p", node="k0", fingerprint="f",
        resources={"cpu": "1"}, ttl=30, created=1.0, hold_until=2.0,
    )  # fmt: skip
    assert JobRecord.decode(record.encode()) == record
    assert JobRecord.decode("a user's own comment") is None
    assert JobRecord.decode('{"tag": "something else"}') is None


def test_the_adapter_refuses_a_malformed_gres_map_before_serving(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    argv = ["--slurmrestd", "unix:/nonexistent", "--node-map", "k0=s0", "--token-file", str(token)]
    assert cli.main([*argv, "--gres-map", "nvidia.com/gpu"]) == 2
    assert (
        "--gres-map entry 'nvidia.com/gpu' is not KUBERNETES_RESOURCE=SLURM_GRES" in capsys.readouterr().err
    )


def test_a_hetjob_components_comment_round_trips_and_stays_within_slurms_1024_characters() -> None:
    base = JobRecord(
        key="gang-key", pod_uid="uid-0", scheduler="bindery", namespace="ns", name="gang-0", node="worker-0",
        fingerprint="f" * 32, resources={"cpu": "1", "memory": "64Mi"}, ttl=30, created=1.0, hold_until=2.0,
        group="slurm-group-1", group_key="gang-key", topology={"zone": "a"}, cluster="c1", expires_at=3.5,
    )  # fmt: skip
    members = [
        dataclasses.replace(base, index=0),
        dataclasses.replace(
            base, index=1, pod_uid="uid-1", name="gang-1", resources={"cpu": "2"}, committed=True
        ),
        dataclasses.replace(
            base, index=2, pod_uid="uid-2", name="gang-2", namespace="other", ended="released"
        ),
    ]
    comment = encode_component(members)
    assert decode_records(comment) == members
    assert decode_records(base.encode()) == [base]  # a single pod's job: one record
    assert decode_records("a site's own comment") == []
    many = [dataclasses.replace(base, index=i, pod_uid=f"{i:036d}") for i in range(20)]
    with pytest.raises(CommentTooLong, match="slurmctld keeps at most 1024"):
        encode_component(many)


def _jwt(claims: dict[str, object]) -> str:
    import base64
    import json

    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def test_with_a_jwt_and_no_slurm_user_the_jobs_run_as_and_are_recognised_by_the_tokens_user() -> None:
    """With a JWT but no --slurm-user the adapter sent ``root`` to slurmrestd while it recognised
    its placeholders by this process's user: none was its own, and each retry submitted another."""
    token = _jwt({"exp": 2_000_000_000, "iat": 1_700_000_000, "sun": "alice"})
    assert cli.slurm_user(given=None, token=token) == "alice"
    assert cli.slurm_user(given="bob", token=token) == "bob"
    rest = SlurmRest("http://127.0.0.1:1", user=cli.slurm_user(given=None, token=token), token=token)
    assert rest._http.headers["X-SLURM-USER-NAME"] == "alice"


@pytest.mark.parametrize("token", ["not-a-jwt", _jwt({"exp": 1}), "a.%%%.c"])
def test_a_jwt_whose_user_cannot_be_read_stops_the_adapter_before_it_serves(
    token: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "jwt").write_text(token)
    argv = [
        "--slurmrestd",
        "http://127.0.0.1:1",
        "--node-map",
        "n1=n1",
        "--token-file",
        str(tmp_path / "token"),
    ]
    assert cli.main([*argv, "--slurm-token-file", str(tmp_path / "jwt")]) == 2
    assert "give --slurm-user" in capsys.readouterr().err
