"""The Slurm adapter serves HTTPS with --tls-cert/--tls-key, as the reference RM does.

Why: it served plain HTTP only, so its bearer token and every reservation crossed the network in
the clear. The adapter runs as its own process; /healthz needs no slurmrestd, so none is started.
"""

from __future__ import annotations

import pathlib
import ssl
import subprocess
import sys
import urllib.request

from bindery.devcluster.pki import CertificateAuthority
from bindery.slurm_rm.cli import BANNER


def test_the_adapter_serves_https_with_a_certificate(tmp_path: pathlib.Path) -> None:
    authority = CertificateAuthority.create()
    pair = authority.issue_server(hosts=["localhost"], ips=["127.0.0.1"])
    (tmp_path / "ca.crt").write_bytes(authority.cert_pem)
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    (tmp_path / "token").write_text("t\n")
    command = [sys.executable, "-m", "bindery.slurm_rm.cli", "--slurmrestd", "unix:/nonexistent"]
    command += ["--node-map", "k0=s0", "--token-file", str(tmp_path / "token"), "--listen", "127.0.0.1:0"]
    command += ["--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")]
    adapter = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert adapter.stdout is not None
        line = adapter.stdout.readline()  # the banner, once listening (or EOF if it exited)
        assert line.startswith(BANNER), line
        url = line[len(BANNER) :].strip()
        assert url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        with urllib.request.urlopen(f"{url}/healthz", context=context, timeout=10) as answer:
            assert answer.status == 200
    finally:
        adapter.terminate()
        adapter.wait(timeout=10)
