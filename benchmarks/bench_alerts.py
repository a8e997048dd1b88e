"""Live alerts (issue 22), repeated: onset-to-alert delay, alerts before the onset, false alarms.

Runs the cases of tests/integration/test_live_alerts.py ``--repeat`` times each (real
2-rank gloo jobs under ``gpudiag run``, ~30 s each on a 2-core host):

* ``straggler``: rank 1 sleeps 300 ms more a step (3× a 100 ms step) from step 20;
* ``data``: every batch takes 200 ms more to read from step 20;
* ``hog``: the unchanged job (busy work) beside a busy-loop process: every alert is false.

For each run: the first alert's kind and ranks, its step − the onset (``delay``), how far the
job itself was past the onset when the alert was written (``job+``), alerts before the
onset, and the monitor's CPU per judged step (all of it, and the rules alone) beside the
run-conditions sampler's CPU per sample (1 Hz) of the same run.

    python benchmarks/bench_alerts.py --repeat 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

import test_live_alerts as cases  # noqa: E402

CASES = {
    "straggler": (["--straggle-rank", "1", "--straggle-s", "0.3"], 40),
    "data": (["--slow-data-s", "0.2"], cases.STEPS),
    "hog": (["--compute"], 40),
}


def conditions_cost_us(run: Path) -> float | None:
    costs = []
    for p in (run / "conditions").glob("*.jsonl"):
        for line in p.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "sample" and rec.get("sample_cost_ns"):
                costs.append(rec["sample_cost_ns"] / 1000)
    return statistics.median(costs) if costs else None


def one(name: str, tmp: Path) -> dict[str, object]:
    args, steps = CASES[name]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if name == "hog" else None
    try:
        res = cases.run_job(tmp / "run", *args, steps=steps)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    fig = cases.first_alert_figures(res)
    raised = [a for a in res["alerts"] if a["state"] == "raised"]
    first = raised[0] if raised else None
    return {
        "case": name,
        "first": f"{first['kind']} {first['ranks']}" if first else "-",
        "alerts": len(raised),
        **fig,
        "conditions_us_per_sample": conditions_cost_us(tmp / "run"),
        "monitor_us_per_poll": res["monitor"]["cpu_ns_per_poll"] / 1000,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cases", default="straggler,data,hog")
    a = p.parse_args()
    rows = []
    for i in range(a.repeat):
        for name in a.cases.split(","):
            with tempfile.TemporaryDirectory() as d:
                row = one(name, Path(d))
            rows.append(row)
            print(json.dumps({"repeat": i, **row}), flush=True)
    print(
        "\ncase       runs  first alert (runs)          delay steps  job+ steps  before onset  "
        "false alarms  monitor µs/step  rules µs/step  monitor µs/poll  conditions µs/sample"
    )
    for name in a.cases.split(","):
        mine = [r for r in rows if r["case"] == name]
        firsts = statistics.multimode([r["first"] for r in mine])
        delays = [r["delay_steps"] for r in mine if r["delay_steps"] is not None]
        jobs = [r["job_steps_past_onset"] for r in mine if r["job_steps_past_onset"] is not None]
        false = sum(r["alerts"] for r in mine) if name == "hog" else 0
        before = sum(r["before_onset"] for r in mine) if name != "hog" else 0

        def med(key: str, rs: list[dict[str, object]] = mine) -> str:
            vals = [float(r[key]) for r in rs if r[key] is not None]  # type: ignore[arg-type]
            return f"{statistics.median(vals):.0f}" if vals else "-"

        print(
            f"{name:10} {len(mine):4}  {', '.join(firsts):26}  {delays!s:11}  "
            f"{jobs!s:10}  {before:12}  {false:12}  {med('cpu_us_per_step'):>15}  "
            f"{med('rules_us_per_step'):>13}  {med('monitor_us_per_poll'):>15}  "
            f"{med('conditions_us_per_sample'):>20}"
        )


if __name__ == "__main__":
    main()
