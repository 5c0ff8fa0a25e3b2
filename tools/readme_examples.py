#!/usr/bin/env python3
"""Runs every `tools/launch.sh ...` example in README.md's code blocks on the CPU
backend, with small sizes substituted, and fails when one exits non-zero (README's
examples must work as written; on a GPU machine they run unchanged).

  tools/readme_examples.py [--readme README.md] [--tmp DIR] [--print]

--print: only print the substituted commands. SYMTP_BUILD_DIR picks the build that
tools/launch.sh runs (the CTest sets it to its own build).

Substitutions (the only ones; anything else runs as written):
  --backend X           -> --backend cpu (added when absent)
  --model M             -> --model tiny, --model-overrides -> layers=2
  --num-requests N      -> at most 16
  --max-batch / --steady-batch: both divided by one factor so that the larger is at
                        most 8 (the default --max-batch counts when absent, so a
                        --steady-batch above it still fails as it would as written)
  --steady-context N    -> at most 32;   --steady-steps N -> at most 4
  --warmup-steps N      -> at most 1;    --arrival-rate R -> at least 200
  --prompt-len / --output-len: fixed lengths at most 32 (distributions as written)
  --kv-cache-fraction F -> --kv-cache-mib 64 (the cpu backend has no GPU memory)
  --out DIR / --trace FILE -> the same relative paths under the temp dir"""
import argparse
import os
import re
import shutil
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH_CAP = 8
CAPS = {"--num-requests": 16, "--steady-context": 32,
        "--steady-steps": 4, "--warmup-steps": 1, "--prompt-len": 32, "--output-len": 32}


def examples(readme):
    """Every tools/launch.sh command in a fenced code block, continuations joined."""
    out, in_block = [], False
    lines = open(readme).read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_block = not in_block
        elif in_block and line.strip().startswith(("tools/launch.sh", "./tools/launch.sh")):
            cmd = line.strip()
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            out.append(cmd.split(" #")[0].strip())
        i += 1
    return out


def default_max_batch():
    """--max-batch's default, from the binary's --help."""
    p = subprocess.run([os.path.join(ROOT, "tools/launch.sh"), "--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    m = re.search(r"--max-batch\s.*\(default: (\d+)\)", p.stdout)
    if not m:
        raise SystemExit("readme_examples.py: no --max-batch default in `tools/launch.sh --help`")
    return int(m.group(1))


def substitute(cmd, tmp, n, max_batch_default):
    toks = shlex.split(cmd)
    args, flags = [], []
    for t in toks[1:]:  # --name=value -> --name value
        args += t.split("=", 1) if t.startswith("--") and "=" in t else [t]
    if "--steady-batch" in args and "--max-batch" not in args:
        args += ["--max-batch", str(max_batch_default)]
    batches = [int(args[k + 1]) for k, a in enumerate(args[:-1])
               if a in ("--max-batch", "--steady-batch") and args[k + 1].isdigit()]
    factor = -(-max(batches) // BATCH_CAP) if batches else 1
    i = 0
    while i < len(args):
        a = args[i]
        v = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        if v is None:
            flags.append(a)
            i += 1
            continue
        if a == "--backend":
            v = "cpu"
        elif a == "--model":
            v = "tiny"
        elif a == "--model-overrides":
            v = "layers=2"
        elif a == "--kv-cache-fraction":
            a, v = "--kv-cache-mib", "64"
        elif a == "--arrival-rate":
            v = str(max(float(v), 200.0))
        elif a in ("--max-batch", "--steady-batch") and v.isdigit():
            v = str(max(1, int(v) // factor))
        elif a in CAPS and re.fullmatch(r"\d+", v):
            v = str(min(int(v), CAPS[a]))
        elif a in ("--out", "--trace"):
            v = os.path.join(tmp, f"ex{n}", v.lstrip("/"))
        flags += [a, v]
        i += 2
    if "--help" not in flags:
        if "--backend" not in flags:
            flags += ["--backend", "cpu"]
        flags += ["--progress", "false"]
    return [os.path.join(ROOT, "tools/launch.sh")] + flags


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--print", action="store_true")
    o = ap.parse_args()
    cmds = examples(o.readme)
    if not cmds:
        print(f"no tools/launch.sh examples found in {o.readme}")
        return 1
    if o.tmp:
        shutil.rmtree(o.tmp, ignore_errors=True)
        os.makedirs(o.tmp)
    tmp = o.tmp or tempfile.mkdtemp(prefix="readme_examples.")
    failed = 0
    mb = default_max_batch()
    for n, c in enumerate(cmds):
        run = substitute(c, tmp, n, mb)
        print(f"[{n}] README:  {c}\n    runs:    {shlex.join(run)}", flush=True)
        if o.print:
            continue
        t0 = time.time()
        p = subprocess.run(run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        print(f"    exit {p.returncode} in {time.time() - t0:.1f} s", flush=True)
        if p.returncode != 0:
            failed += 1
            print(p.stdout[-4000:])
    print(f"{len(cmds) - failed} of {len(cmds)} README examples ran" + ("" if o.print else " and exited 0"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
