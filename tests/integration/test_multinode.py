"""Two "nodes" on one host: one `gpudiag run` per node (torchrun --nnodes 2) writing into one
shared directory; `gpudiag analyze` merges the nodes."""

import json
import socket
import subprocess
import sys

import pytest
from cli_runner import job_env, run_cli

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_one_gpudiag_run_per_node_into_one_directory(tmp_path):
    out = tmp_path / "shared-run"
    port = _free_port()
    env = job_env()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpudiag",
                "run",
                "--no-analyze",
                "--quiet",
                "--out",
                str(out),
                "--",
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(k),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "-m",
                "gpudiag.demo.train",
                "--steps",
                "8",
                "--batch",
                "1024",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in range(2)
    ]
    for p in procs:
        log, _ = p.communicate(timeout=240)
        assert p.returncode == 0, log[-2000:]
    for k in range(2):
        m = json.loads((out / f"node-{k}" / "manifest.json").read_text())
        assert m["node_rank"] == k
        assert [r["rank"] for r in m["ranks"]] == [k]
        assert (out / f"node-{k}" / "ranks" / f"rank-{k}.pt.trace.json.gz").is_file()
    r = run_cli("analyze", str(out), "-f", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["rank"] for x in doc["ranks"]] == [0, 1]
    assert doc["run"]["world_size"] == 2
    assert sorted(x["rank"] for x in doc["whole_run"]["ranks"]) == [0, 1]
