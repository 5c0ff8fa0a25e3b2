#!/usr/bin/env python3
"""tools/report.py on hand-made summaries: the iteration is steps.period_ms (not a
median of completion gaps), null metrics (cpu: no device times) are read, and
--check fails when a v1 cell's iteration is over 1% below its forward time or above
twice it, or a cell measured fewer steps than it asked for, and the header names the
devices of the largest TP's runs."""
import json
import os
import subprocess
import sys
import tempfile

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "report.py")


def dist(mean):
    return {"count": 10, "mean": mean, "std": 0, "min": mean, "p50": mean, "p90": mean,
            "p95": mean, "p99": mean, "max": mean}


def summary(period_ms, forward_us, gaps_p50_ms, devices=("cpu: x",)):
    steps = {k: dist(1.0) for k in ("schedule_us", "encode_us", "publish_us", "recv_wait_us",
                                     "apply_us", "build_us", "sample_us", "result_return_us",
                                     "worker_total_us", "wire_bytes")}
    steps.update(total=20, measured=10, period_ms=period_ms, iteration_ms=dist(gaps_p50_ms),
                 forward_us=dist(forward_us), device_forward_us=None, gpu_idle_us=None,
                 busiest_rank_forward_us=None)
    return {"backend": "cpu", "model": {"name": "tiny"}, "commit": "abc", "devices": list(devices),
            "steps": steps}


def run(cells, check):
    d = tempfile.mkdtemp()
    for name, s in cells.items():
        os.makedirs(os.path.join(d, "runs", name))
        with open(os.path.join(d, "runs", name, "summary.json"), "w") as f:
            json.dump(s, f)
    args = [sys.executable, REPORT, "--runs", os.path.join(d, "runs"), "--out", d, "--model", "tiny"]
    p = subprocess.run(args + (["--check"] if check else []), capture_output=True, text=True)
    with open(os.path.join(d, "report.md")) as f:
        run.md = f.read()
    with open(os.path.join(d, "report.json")) as f:
        return p.returncode, json.load(f), p.stderr


def main():
    failures = []
    # v1's completion gaps come in pairs: their "median" (0.02 ms) is not the period (10 ms).
    rc, rep, err = run({"v0_tp2_b8": summary(12.0, 9000, 12.0),
                        "v1_tp2_b8": summary(10.0, 9000, 0.02)}, check=True)
    if rc != 0:
        failures.append(f"sane cells: --check failed: {err}")
    if abs(rep["v1_tp2_b8"]["iteration"] - 10.0) > 1e-9:
        failures.append(f"v1 iteration {rep['v1_tp2_b8']['iteration']} is not the period 10.0")
    if abs(rep["v1_tp2_b8"]["idle"] - 1.0) > 1e-9:
        failures.append(f"v1 idle {rep['v1_tp2_b8']['idle']} is not iteration - forward = 1.0")
    # Within the period's measurement noise of its forward time: --check passes.
    rc, _, err = run({"v0_tp1_b8": summary(12.0, 9000, 12.0),
                      "v1_tp1_b8": summary(8.97, 9000, 8.97)}, check=True)
    if rc != 0:
        failures.append(f"v1 period 8.97 ms with forward 9 ms failed --check: {err}")
    # Well below its forward time, and above twice it: --check fails.
    for period in (8.8, 19.0):
        rc, _, _ = run({"v0_tp1_b8": summary(12.0, 9000, 12.0),
                        "v1_tp1_b8": summary(period, 9000, period)}, check=True)
        if rc == 0:
            failures.append(f"v1 period {period} ms with forward 9 ms passed --check")
    # A cell that measured fewer steps than it asked for: --check fails.
    short = summary(10.0, 9000, 10.0)
    short["flags"] = {"steady-steps": 11}  # measured 10
    rc, _, err = run({"v0_tp1_b8": summary(12.0, 9000, 12.0), "v1_tp1_b8": short}, check=True)
    if rc == 0 or "10 of 11 steps" not in run.md:
        failures.append(f"a cell with 10 of 11 steps measured passed --check: rc {rc}")
    # TP 1 runs use one device of the machine, TP 2 runs two: the header names two.
    one, two = ("gpu: H",), ("gpu: H", "gpu: H")
    run({"v0_tp1_b8": summary(12.0, 9000, 12.0, one), "v1_tp1_b8": summary(10.0, 9000, 10.0, one),
         "v0_tp2_b8": summary(12.0, 9000, 12.0, two), "v1_tp2_b8": summary(10.0, 9000, 10.0, two)},
        check=False)
    if "(2 x gpu: H)" not in run.md:
        failures.append("the header does not name the TP 2 runs' two devices: " +
                        run.md.splitlines()[2][:200])
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
