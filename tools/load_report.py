#!/usr/bin/env python3
"""Arms under load (by default v0 and v1): load.md and load.json from the runs of
tools/load_sweep.sh.

Each run directory is <arm>_r<rate>_k<repeat> and holds the job's summary.json
(docs/OUTPUTS.md). Rows: per offered rate, arm and repeat, what the job measured
(throughput, TTFT / TPOT / ITL / E2E percentiles, GPU idle before each step). Then each arm
against the first (--arms, the baseline) at each rate, on the medians over the repeats.
--check exits 1 when a run is missing its summary, leaves a request unfinished, or a rate
lacks an arm's run.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys

from report import machine_label

RUN_DIR = re.compile(r"^(.+)_r([0-9.]+)_k([0-9]+)$")
# Each arm against the baseline: (key in the rows, label).
COMPARED = [("output_tokens_per_s", "output tok/s"), ("ttft_p50_ms", "TTFT p50"),
            ("ttft_p99_ms", "TTFT p99"), ("tpot_p50_ms", "TPOT p50"), ("e2e_p50_ms", "E2E p50")]


def pct(s, key, p):
    d = s.get(key)
    return None if d is None else d.get(p)


def row(arm, rate, repeat, s):
    st = s.get("steps") or {}
    idle = st.get("gpu_idle_us")
    return {
        "arm": arm, "offered_rate": rate, "repeat": repeat,
        "requests": s["requests"], "finished": s["finished_requests"],
        "wall_s": s["wall_s"],
        "request_throughput": s["request_throughput"],
        "output_tokens_per_s": s["output_tokens_per_s"],
        "ttft_p50_ms": pct(s, "ttft_ms", "p50"), "ttft_p90_ms": pct(s, "ttft_ms", "p90"),
        "ttft_p99_ms": pct(s, "ttft_ms", "p99"),
        "tpot_p50_ms": pct(s, "tpot_ms", "p50"), "tpot_p99_ms": pct(s, "tpot_ms", "p99"),
        "itl_p99_ms": pct(s, "itl_ms", "p99"),
        "e2e_p50_ms": pct(s, "e2e_ms", "p50"), "e2e_p99_ms": pct(s, "e2e_ms", "p99"),
        "gpu_idle_p50_us": None if idle is None else idle["p50"],
        "steps": st.get("total"),
    }


def load(runs_dir, arms):
    rows, problems, first = [], [], None
    for name in sorted(os.listdir(runs_dir)):
        m = RUN_DIR.match(name)
        if not m or not os.path.isdir(os.path.join(runs_dir, name)):
            continue
        arm, rate, repeat = m.group(1), float(m.group(2)), int(m.group(3))
        path = os.path.join(runs_dir, name, "summary.json")
        if not os.path.exists(path):
            problems.append(f"{name}: no summary.json (the run failed)")
            continue
        with open(path) as f:
            s = json.load(f)
        first = first or s
        r = row(arm, rate, repeat, s)
        if r["finished"] != r["requests"]:
            problems.append(f"{name}: {r['finished']} of {r['requests']} requests finished")
        rows.append(r)
    # Offered rate ascending, the closed loop (0) last; arms in --arms order.
    order = {a: i for i, a in enumerate(arms)}
    rows.sort(key=lambda r: (r["offered_rate"] == 0, r["offered_rate"],
                             order.get(r["arm"], len(order)), r["arm"], r["repeat"]))
    return rows, problems, first


def rate_label(rate):
    return "closed loop" if rate == 0 else f"{rate:g}"


def f(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def median(rows, key):
    v = [r[key] for r in rows if r[key] is not None]
    return statistics.median(v) if v else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="?")
    ap.add_argument("--overrides", default="")
    ap.add_argument("--arms", default="v0 v1",
                    help="the arms' names in order; the first is the baseline")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if a run failed, left a request unfinished or a rate lacks an arm")
    a = ap.parse_args()
    arms = a.arms.split()
    rows, problems, first = load(a.runs, arms)
    if not rows:
        print("load_report.py: no runs found", file=sys.stderr)
        return 1
    by_rate = {}
    for r in rows:
        by_rate.setdefault(r["offered_rate"], {}).setdefault(r["arm"], []).append(r)
    for name in sorted({r["arm"] for r in rows} - set(arms)):
        arms.append(name)
    for rate, m in by_rate.items():
        for arm in arms:
            if arm not in m:
                problems.append(f"rate {rate_label(rate)}: no {arm} run")
    base = arms[0]
    comparisons = []
    for rate, m in sorted(by_rate.items(), key=lambda kv: (kv[0] == 0, kv[0])):
        if base not in m:
            continue
        for arm in arms[1:]:
            if arm not in m:
                continue
            c = {"offered_rate": rate, "arm": arm, "baseline": base}
            for key, _ in COMPARED:
                c[key] = ratio(median(m[arm], key), median(m[base], key))
            comparisons.append(c)
    machine = machine_label(first, "")
    model = a.model + (f" ({a.overrides})" if a.overrides else "")
    flags = first.get("flags") or {}
    workload = {k: flags.get(k) for k in ("num-requests", "prompt-len", "output-len", "max-batch",
                                          "max-batched-tokens", "prefill-chunk", "seed")}
    title = "v0 and v1 under load" if arms[:2] == ["v0", "v1"] else "Under load: " + ", ".join(arms)
    md = [f"# {title}\n",
          f"Generated {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M')} UTC on "
          f"`{platform.node()}` ({machine}); backend **{first['backend']}**, TP {first['tp']}; model "
          f"**{model}**; commit `{first.get('commit', 'unknown')}`.\n",
          "The same seeded workload in every run (" +
          ", ".join(f"`--{k}={v}`" for k, v in workload.items() if v is not None) +
          "): requests arrive as a Poisson process at the offered rate (closed loop: `--max-batch` "
          "requests in flight, a new one as one finishes). Times in ms, percentiles over the "
          "requests; TPOT excludes the first token. *GPU idle* is the median device idle before "
          "a step, by CUDA events (v0: rank 0, so it includes the batch broadcast).\n",
          "| offered (req/s) | arm | repeat | finished | req/s | output tok/s | TTFT p50 | TTFT p99 | "
          "TPOT p50 | TPOT p99 | ITL p99 | E2E p50 | E2E p99 | GPU idle p50 (us) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {rate_label(r['offered_rate'])} | {r['arm']} | {r['repeat']} | "
                  f"{r['finished']}/{r['requests']} | "
                  f"{f(r['request_throughput'])} | {f(r['output_tokens_per_s'], 0)} | "
                  f"{f(r['ttft_p50_ms'])} | {f(r['ttft_p99_ms'])} | {f(r['tpot_p50_ms'], 3)} | "
                  f"{f(r['tpot_p99_ms'], 3)} | {f(r['itl_p99_ms'])} | {f(r['e2e_p50_ms'], 1)} | "
                  f"{f(r['e2e_p99_ms'], 1)} | {f(r['gpu_idle_p50_us'], 1)} |")
    if comparisons:
        md += [f"\n## Each arm against {base} at each rate, medians over the repeats (below 1 is "
               "better for time, above 1 for throughput)\n",
               "| offered (req/s) | arm | " + " | ".join(f"{label} / {base}" for _, label in COMPARED) + " |",
               "|---|---|" + "---|" * len(COMPARED)]
        for c in comparisons:
            md.append(f"| {rate_label(c['offered_rate'])} | {c['arm']} | " +
                      " | ".join(f(c[key], 3) for key, _ in COMPARED) + " |")
    if problems:
        md += ["\n## Problems\n"] + [f"- {p}" for p in problems]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "load.md"), "w") as fh:
        fh.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "load.json"), "w") as fh:
        json.dump({"model": model, "machine": machine, "backend": first["backend"], "tp": first["tp"],
                   "commit": first.get("commit"), "workload": workload, "arms": arms, "rows": rows,
                   "against_baseline": comparisons, "problems": problems}, fh, indent=1)
    print(f"load: {os.path.join(a.out, 'load.md')}", file=sys.stderr)
    for p in problems:
        print(f"load: {p}", file=sys.stderr)
    return 1 if a.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
