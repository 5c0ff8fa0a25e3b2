#!/usr/bin/env python3
"""tools/load_report.py on hand-made summaries: rows sorted by offered rate with the closed
loop last and the arms in --arms order, each arm against the first on the medians over its
repeats, null distributions read, and --check failing on an unfinished request, a run
without a summary, or a rate that lacks an arm."""
import json
import os
import subprocess
import sys
import tempfile

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "load_report.py")


def dist(p50, p99):
    return {"count": 10, "mean": p50, "std": 0, "min": p50, "p50": p50, "p90": p99, "p95": p99,
            "p99": p99, "max": p99}


def summary(tok_s, tpot, finished=32, idle=None):
    return {"backend": "cuda", "tp": 2, "commit": "abc", "devices": ["G", "G"],
            "flags": {"num-requests": 32, "seed": 1}, "requests": 32, "finished_requests": finished,
            "wall_s": 1.0, "request_throughput": finished, "output_tokens_per_s": tok_s,
            "ttft_ms": dist(5.0, 20.0), "tpot_ms": dist(tpot, 2 * tpot), "e2e_ms": dist(50.0, 90.0),
            "steps": {"total": 100, "gpu_idle_us": None if idle is None else dist(idle, idle)}}


def run(cells, check=True, missing=(), arms=None):
    d = tempfile.mkdtemp()
    for name, s in cells.items():
        os.makedirs(os.path.join(d, "runs", name))
        with open(os.path.join(d, "runs", name, "summary.json"), "w") as f:
            json.dump(s, f)
    for name in missing:
        os.makedirs(os.path.join(d, "runs", name))
    p = subprocess.run([sys.executable, REPORT, "--runs", os.path.join(d, "runs"), "--out", d]
                       + (["--check"] if check else []) + (["--arms", arms] if arms else []),
                       capture_output=True, text=True)
    with open(os.path.join(d, "load.json")) as f:
        out = json.load(f)
    with open(os.path.join(d, "load.md")) as f:
        out["md"] = f.read()
    return p.returncode, out


def main():
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    rc, out = run({"v0_r0_k0": summary(1000, 2.0, idle=900.0), "v1_r0_k0": summary(1500, 1.0, idle=3.0),
                   "v0_r40_k0": summary(800, 1.5), "v1_r40_k0": summary(820, 1.2),
                   "v0_r8_k0": summary(300, 1.2), "v1_r8_k0": summary(300, 1.0)})
    expect(rc == 0, f"complete sweep: rc {rc}, problems {out['problems']}")
    expect([(r["offered_rate"], r["arm"]) for r in out["rows"]] ==
           [(8, "v0"), (8, "v1"), (40, "v0"), (40, "v1"), (0, "v0"), (0, "v1")],
           f"row order {[(r['offered_rate'], r['arm']) for r in out['rows']]}")
    closed = [c for c in out["against_baseline"] if c["offered_rate"] == 0][0]
    expect(closed["arm"] == "v1" and closed["baseline"] == "v0", f"comparison arms {closed}")
    expect(abs(closed["output_tokens_per_s"] - 1.5) < 1e-9, f"throughput ratio {closed}")
    expect(abs(closed["tpot_p50_ms"] - 0.5) < 1e-9, f"tpot ratio {closed}")
    expect("| closed loop | v1 | 0 | 32/32 |" in out["md"], "closed-loop row in load.md")
    expect("# v0 and v1 under load" in out["md"], "title")
    expect("| 900.0 |" in out["md"] and "| 3.0 |" in out["md"], "GPU idle column")

    # Named arms, the baseline first whatever the names' order, and medians
    # over repeats: late's TPOT 1.1 and 0.9 against base's 1.0, 1.0 and 1.6.
    rc, out = run({"late_r8_k0": summary(300, 1.1), "late_r8_k1": summary(300, 0.9),
                   "base_r8_k0": summary(300, 1.0), "base_r8_k1": summary(300, 1.0),
                   "base_r8_k2": summary(300, 1.6)}, arms="base late")
    expect(rc == 0, f"arms: rc {rc}, problems {out['problems']}")
    expect([(r["arm"], r["repeat"]) for r in out["rows"]] ==
           [("base", 0), ("base", 1), ("base", 2), ("late", 0), ("late", 1)],
           f"arm rows {[(r['arm'], r['repeat']) for r in out['rows']]}")
    c = out["against_baseline"]
    expect(len(c) == 1 and c[0]["arm"] == "late" and abs(c[0]["tpot_p50_ms"] - 1.0) < 1e-9,
           f"median ratio {c}")
    expect("# Under load: base, late" in out["md"], "named arms' title")

    rc, out = run({"v0_r8_k0": summary(300, 1.2), "v1_r8_k0": summary(300, 1.0, finished=31)})
    expect(rc == 1 and any("31 of 32" in p for p in out["problems"]), f"unfinished: rc {rc} {out['problems']}")
    rc, _ = run({"v0_r8_k0": summary(300, 1.2), "v1_r8_k0": summary(300, 1.0, finished=31)}, check=False)
    expect(rc == 0, f"unfinished without --check: rc {rc}")

    rc, out = run({"v0_r8_k0": summary(300, 1.2), "v1_r8_k0": summary(300, 1.0),
                   "v0_r16_k0": summary(500, 1.3)})
    expect(rc == 1 and any("no v1 run" in p for p in out["problems"]), f"missing arm: {out['problems']}")

    rc, out = run({"v0_r8_k0": summary(300, 1.2)}, missing=["v1_r8_k0"])
    expect(rc == 1 and any("v1_r8_k0: no summary.json" in p for p in out["problems"]),
           f"failed run: {out['problems']}")

    for f in failures:
        print("FAIL:", f)
    print("load_report_py_test:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
