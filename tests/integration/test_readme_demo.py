"""Issue 24: the README demo's verdict is right and self-consistent on a busy host.

The README's main command (``gpudiag run -- torchrun --standalone --nproc-per-node 2 -m
gpudiag.demo.train``) runs exactly as a user types it, beside a CPU hog this test starts (a
busy loop taking one of the 2 cores for the whole run). The demo is a balanced job, so what
the host does to it is noise; whatever gpudiag concludes from that noise must tell one
story (tests/consistency.py): no "0% slower" straggler, a straggler verdict only in its
finding's own terms and above the straggler threshold, the idle statement true to its own
number, what-ifs and remedies from one step model, shares summing to 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_runner import ROOT, run_cli
from noisy_host import host_busy

sys.path.insert(0, str(ROOT / "tests"))
from consistency import problems

README_DEMO = ["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "gpudiag.demo.train"]
HOG = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end:\n    pass\n"


def test_readme_demo_beside_a_cpu_hog_tells_one_story(tmp_path: Path) -> None:
    assert README_DEMO == [
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "gpudiag.demo.train",
    ]
    assert "gpudiag run -- " + " ".join(README_DEMO) in (ROOT / "README.md").read_text()
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        busy = host_busy(1.0)
        out = tmp_path / "run"
        r = run_cli("run", "--out", str(out), "--", *README_DEMO, cwd=tmp_path, timeout=600)
    finally:
        hog.kill()
        hog.wait()
    print(f"host busy beside the hog: {busy}\n{r.stdout}")
    assert r.returncode == 0, r.stderr[-3000:]
    console = r.stdout
    assert console.startswith("verdict: "), console[:500]
    d = json.loads(run_cli("analyze", str(out), "--format", "json").stdout)
    found = problems(d, console)
    assert not found, "\n".join([*found, console])
    assert "0% slower" not in console
    if d["verdict"]["bottleneck"] == "straggler":  # the host made one rank late: say how
        f = d["findings"][d["verdict"]["finding"]]
        assert f["kind"] == "straggler" and f["ranks"] == d["verdict"]["ranks"]
