"""SlurmBed.start's "port taken" check reads only what the daemon's latest launch logged.

The daemons' logs are appended to across launches (a bed started again keeps its history), so a
check of the log's last lines saw an earlier launch's "Address already in use" and took a daemon
that failed for another reason this time for one whose port was taken. No Slurm runs here: the
"daemons" are shell commands in the bed's process slots.
"""

from __future__ import annotations

import pathlib

from bindery.devcluster.slurm import SlurmBed, SlurmNode


def _launch(bed: SlurmBed, key: str, said: str) -> None:
    bed._spawn(key, ["sh", "-c", f"echo '{said}'; exit 1"])
    bed._procs[key].wait(timeout=30)


def test_a_daemon_failing_otherwise_after_a_taken_port_is_not_taken_for_one(tmp_path: pathlib.Path) -> None:
    bed = SlurmBed(tmp_path / "bed", [SlurmNode("slurm-0", cpus=1, memory_mib=256)], root=tmp_path / "root")
    (bed.workdir / "log").mkdir(parents=True)
    try:
        _launch(bed, "slurmctld", "error: Error binding slurm stream socket: Address already in use")
        assert bed._port_taken() == ["slurmctld"]
        _launch(bed, "slurmctld", "fatal: Unable to determine this slurmd's NodeName")
        assert bed._port_taken() == []
    finally:
        bed.stop()
