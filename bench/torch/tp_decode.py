#!/usr/bin/env python3
"""A plain PyTorch tensor-parallel decode step: the baseline symtp is compared with.

The same Llama-style decoder as symtp's presets (docs/MODEL.md: fused QKV and
gate/up projections, RoPE, grouped-query attention, SwiGLU, RMSNorm, no
biases), sharded the same way (Megatron: QKV and gate/up by columns, O and down
by rows, each followed by an NCCL all-reduce; the LM head by vocabulary, greedy
token from every rank's best candidate), written the way a user would write it
in PyTorch: cuBLAS through torch.matmul, scaled_dot_product_attention over a
contiguous KV cache, torch's RMSNorm, torch.distributed for the collectives,
and one decode step captured in a CUDA graph and replayed. Weights are random
(uniform, symtp's scale), bf16.

Every replay is a steady decode step at a fixed context: it writes the new
key and value at position `context` and attends over context + 1 keys, and the
sampled tokens feed the next replay. Reported: the median of per-replay times
(CUDA events around each replay) after warm-up, per batch.

  torchrun --nproc_per_node=2 bench/torch/tp_decode.py --model llama-8b-shape \
      --layers 32 --batches 1,8,32 --context 1024 --json out.json
  torchrun --nproc_per_node=2 bench/torch/tp_decode.py --check   # correctness
  python3 bench/torch/tp_decode.py --prefill-attention-only 2 --tokens 512,4096  # causal SDPA

--check builds a small model (hidden 512, 2 layers) in fp32 from full weights
that every rank slices, and compares the TP step's logits and tokens with rank
0's unsharded computation, and the graph replay's logits with the eager step's.
"""
import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

PRESETS = {  # hidden, layers, heads, kv heads, ffn, vocab (docs/MODEL.md)
    "llama-8b-shape": (4096, 32, 32, 8, 14336, 128256),
    "llama-70b-shape": (8192, 80, 64, 8, 28672, 128256),
    "check": (512, 2, 8, 4, 1024, 2048),
}
ROPE_THETA, RMS_EPS = 10000.0, 1e-5


class Weights:
    """One rank's shards. With `full` every tensor is drawn whole from a
    generator seeded by its name (the same on every rank) and sliced, so rank 0
    can also run the unsharded model; otherwise each shard is drawn on the GPU."""

    def __init__(self, cfg, tp, rank, dtype, full, layers):
        H, _, NH, NKV, FF, V = cfg
        D = H // NH
        self.H, self.NH, self.NKV, self.D, self.F, self.V = H, NH, NKV, D, FF, V
        self.tp, self.rank, self.dtype, self.full = tp, rank, dtype, full
        self.nh, self.nkv, self.f, self.v = NH // tp, max(1, NKV // tp), FF // tp, V // tp
        self.layers = []
        for l in range(layers):
            w = {}
            q = self.make(f"{l}.wq", (NH * D, H), 0, NH * D // tp, H)
            k = self.make(f"{l}.wk", (NKV * D, H), 0, self.nkv * D, H)
            v = self.make(f"{l}.wv", (NKV * D, H), 0, self.nkv * D, H)
            w["wqkv"] = torch.cat([q, k, v]).contiguous()
            w["wo"] = self.make(f"{l}.wo", (H, NH * D), 1, NH * D // tp, NH * D)
            g = self.make(f"{l}.w_gate", (FF, H), 0, self.f, H)
            u = self.make(f"{l}.w_up", (FF, H), 0, self.f, H)
            w["wgu"] = torch.cat([g, u]).contiguous()
            w["wdown"] = self.make(f"{l}.w_down", (H, FF), 1, self.f, FF)
            w["attn_norm"] = self.norm(f"{l}.attn_norm")
            w["mlp_norm"] = self.norm(f"{l}.mlp_norm")
            self.layers.append(w)
        self.embed = self.make("embed", (V, H), None, None, None, scale=1.0)
        self.final_norm = self.norm("final_norm")
        self.lm_head = self.make("lm_head", (V, H), 0, self.v, H)

    def draw(self, name, shape, scale):
        if self.full:
            g = torch.Generator().manual_seed(_seed(name))
            t = torch.rand(shape, generator=g, dtype=torch.float32)
            return ((2 * t - 1) * scale).to(self.dtype).cuda()
        return torch.empty(shape, device="cuda", dtype=self.dtype).uniform_(-scale, scale)

    def make(self, name, shape, dim, size, fan_in, scale=None):
        """Tensor `name` of global `shape`, this rank's `size` slice along `dim`
        (None: replicated); uniform in +-sqrt(3 / fan_in) unless `scale`."""
        scale = math.sqrt(3.0 / fan_in) if scale is None else scale
        if dim is None or self.tp == 1:
            return self.draw(name, shape, scale)
        if not self.full:
            s = list(shape)
            s[dim] = size
            return self.draw(name, tuple(s), scale)
        # kv heads: NKV >= tp in the presets, so rank r holds heads [r n, (r + 1) n).
        return self.draw(name, shape, scale).narrow(dim, self.rank * size, size).contiguous()

    def norm(self, name):
        if self.full:
            g = torch.Generator().manual_seed(_seed(name))
            t = torch.rand((self.H,), generator=g) * 2 - 1
            return (t * 0.125 + 1).to(self.dtype).cuda()
        return (torch.rand((self.H,), device="cuda") * 0.25 + 0.875).to(self.dtype)


def _seed(name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & ((1 << 64) - 1)
    return h & ((1 << 62) - 1)


def add_norm(x, o, weight):
    """The residual add and the next RMSNorm: (x + o, rms_norm(x + o))."""
    x = x + o
    return x, F.rms_norm(x, (x.shape[-1],), weight, RMS_EPS)


def rope_split(qkv, cos, sin, nh, nkv, d):
    """q, k rotated (rotate-half pairs (i, i + d/2), in fp32) and v, as [B, heads, d]."""
    b = qkv.shape[0]
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)

    def rot(x, heads):
        x = x.view(b, heads, d)
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(qkv.dtype)
    return rot(q, nh), rot(k, nkv), v.view(b, nkv, d)


def silu_mul(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


class Decoder:
    """The decode step of one rank: weights, KV cache, static inputs/outputs.
    With `compile` the element-wise pieces between the GEMMs (residual add +
    RMSNorm, RoPE, SiLU-and-multiply) are torch.compile'd, which fuses each
    into one kernel; the GEMMs, attention and collectives stay torch's own."""

    def __init__(self, w, batch, context, group, compile=False):
        self.w, self.b, self.ctx, self.group = w, batch, context, group
        dt = w.dtype
        self.k = [torch.empty(batch, w.nkv, context + 1, w.D, device="cuda", dtype=dt).normal_()
                  for _ in w.layers]
        self.v = [torch.empty_like(k).normal_() for k in self.k]
        self.tokens = torch.randint(0, w.V, (batch,), device="cuda")
        self.pos = torch.full((1,), context, device="cuda", dtype=torch.long)
        inv = 1.0 / (ROPE_THETA ** (torch.arange(0, w.D, 2, device="cuda").float() / w.D))
        ang = torch.outer(torch.arange(context + 1, device="cuda").float(), inv)
        self.cos, self.sin = ang.cos(), ang.sin()
        self.logits = None
        def c(f):
            return torch.compile(f, fullgraph=True, dynamic=False) if compile else f
        self.add_norm, self.rope_split, self.silu_mul = c(add_norm), c(rope_split), c(silu_mul)

    def all_reduce(self, t):
        if self.w.tp > 1:
            dist.all_reduce(t, group=self.group)
        return t

    def step(self):
        w, B = self.w, self.b
        x = w.embed[self.tokens]
        cos, sin = self.cos[self.pos], self.sin[self.pos]  # [1, D/2]
        o = torch.zeros_like(x)
        for l, p in enumerate(w.layers):
            x, h = self.add_norm(x, o, p["attn_norm"])
            q, k, v = self.rope_split(h @ p["wqkv"].t(), cos, sin, w.nh, w.nkv, w.D)
            self.k[l].index_copy_(2, self.pos, k.unsqueeze(2))
            self.v[l].index_copy_(2, self.pos, v.unsqueeze(2))
            a = F.scaled_dot_product_attention(q.unsqueeze(2), self.k[l], self.v[l],
                                               enable_gqa=True)
            o = self.all_reduce(a.reshape(B, w.nh * w.D) @ p["wo"].t())
            x, h = self.add_norm(x, o, p["mlp_norm"])
            o = self.all_reduce(self.silu_mul(h @ p["wgu"].t()) @ p["wdown"].t())
        _, x = self.add_norm(x, o, w.final_norm)
        logits = x @ w.lm_head.t()  # [B, V / tp]
        best, idx = logits.float().max(dim=-1)
        idx = idx + w.rank * w.v
        if w.tp > 1:  # every rank's best candidate, then the same pick on every rank
            cand = torch.stack([best, idx.float()], dim=0)
            allc = torch.empty((w.tp,) + cand.shape, device="cuda", dtype=cand.dtype)
            dist.all_gather_into_tensor(allc, cand, group=self.group)
            r = allc[:, 0].argmax(dim=0)
            idx = allc[:, 1].gather(0, r.unsqueeze(0)).squeeze(0).long()
        self.tokens.copy_(idx)
        self.logits = logits
        return logits


def event_times_ms(run, calls, warmup, sync_each=False):
    """run() `warmup` times, then `calls` times between CUDA events; each
    call's milliseconds (sync_each: the host waits for every call before
    issuing the next)."""
    for _ in range(warmup):
        run()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(calls)]
    for a, b in ev:
        a.record()
        run()
        b.record()
        if sync_each:
            b.synchronize()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in ev]


def timed(dec, steps, warmup, graph):
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                dec.step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dec.step()
        run = g.replay
    else:
        run = dec.step
    return statistics.median(event_times_ms(run, steps, warmup))


def attention_only(model, tp, batches, context):
    """torch's decode attention alone (one rank's heads, contiguous cache): the
    median of 30 event-timed calls after 5, and K + V bytes read per second."""
    H, _, NH, NKV, _, _ = PRESETS[model]
    d, nq, nkv = H // NH, NH // tp, max(1, NKV // tp)
    rows = []
    for b in batches:
        q = torch.randn(b, nq, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, nkv, context, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        run = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        us = 1e3 * statistics.median(event_times_ms(run, 30, 5))
        gbps = 2.0 * b * nkv * context * d * 2 / (us * 1e-6) / 1e9
        rows.append({"batch": b, "us": round(us, 2), "kv_gbps": round(gbps, 1)})
        print(f"torch sdpa {model} tp{tp} heads {nq}/{nkv} batch={b} context={context}: "
              f"{us:.1f} us, {gbps:.0f} GB/s", flush=True)
        del q, k, v
    return rows


def prefill_attention_only(model, tp, token_counts):
    """torch's causal attention over one prompt from position 0 (one rank's
    heads, contiguous q / k / v, GQA): the upper median of 20 event-timed calls
    after 5, and TFLOP/s counting the causal half (symtp's kernels_bench
    --sections prefill counts the same)."""
    H, _, NH, NKV, _, _ = PRESETS[model]
    d, nq, nkv = H // NH, NH // tp, max(1, NKV // tp)
    rows = []
    for n in token_counts:
        q = torch.randn(1, nq, n, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, nkv, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
        ms = sorted(event_times_ms(run, 20, 5, sync_each=True))
        us = 1e3 * ms[len(ms) // 2]
        tflops = 4.0 * d * nq * n * (n + 1) / 2 / (us * 1e-6) / 1e12
        rows.append({"tokens": n, "us": round(us, 2), "tflops": round(tflops, 1)})
        print(f"torch sdpa causal {model} tp{tp} heads {nq}/{nkv} tokens={n}: "
              f"{us:.1f} us, {tflops:.1f} TFLOP/s", flush=True)
        del q, k, v
    return rows


def write_rows(path, head, rows):
    """The one-GPU modes' JSON (when --json names a file): `head`, then the
    torch version, the device and the rows."""
    if path:
        with open(path, "w") as f:
            json.dump({**head, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "rows": rows}, f, indent=1)


def gemm_only(model, tp, batches):
    """torch.matmul on one rank's decode GEMMs (x @ W^T, bf16): time per call of
    20 captured in a CUDA graph, weights rotated through more than L2 holds."""
    H, _, NH, NKV, FF, V = PRESETS[model]
    d = H // NH
    shapes = {"qkv": ((NH // tp + 2 * max(1, NKV // tp)) * d, H), "wo": (H, NH // tp * d),
              "gate_up": (2 * FF // tp, H), "down": (H, FF // tp), "lm_head": (V // tp, H)}
    rows = []
    for name, (n, k) in shapes.items():
        copies = max(2, (1 << 30) // (n * k * 2))
        ws = [torch.empty(n, k, device="cuda", dtype=torch.bfloat16).uniform_(-0.02, 0.02)
              for _ in range(copies)]
        for b in batches:
            x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16)
            outs = [None] * 20
            for i in range(3):
                outs[0] = x @ ws[i % copies].t()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(20):
                    outs[i] = x @ ws[i % copies].t()
            g.replay()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(5):
                e0.record()
                g.replay()
                e1.record()
                torch.cuda.synchronize()
                times.append(e0.elapsed_time(e1) * 1e3 / 20)
            us = statistics.median(times)
            rows.append({"layer": name, "n": n, "k": k, "m": b, "graph_us": round(us, 2)})
            print(f"torch matmul {model} tp{tp} {name} N={n} K={k} M={b}: {us:.1f} us", flush=True)
            del g, outs, x
        del ws
    return rows


def check(tp, rank, group, compile):
    """TP step vs rank 0's unsharded step (fp32), graph replay vs eager."""
    cfg = PRESETS["check"]
    torch.backends.cuda.matmul.allow_tf32 = False
    B, C = 4, 64
    w = Weights(cfg, tp, rank, torch.float32, full=True, layers=cfg[1])
    dec = Decoder(w, B, C, group, compile)
    torch.manual_seed(5)  # the same cache contents and tokens on every rank
    full_k = [torch.randn(B, w.NKV, C + 1, w.D, device="cuda") for _ in range(cfg[1])]
    full_v = [torch.randn(B, w.NKV, C + 1, w.D, device="cuda") for _ in range(cfg[1])]
    tokens = torch.randint(0, w.V, (B,), device="cuda")
    def load(d, n):
        for l in range(cfg[1]):
            d.k[l].copy_(full_k[l].narrow(1, rank * n, n) if n < w.NKV else full_k[l])
            d.v[l].copy_(full_v[l].narrow(1, rank * n, n) if n < w.NKV else full_v[l])
        d.tokens.copy_(tokens)
    load(dec, w.nkv)
    shard = dec.step().clone()
    tok = dec.tokens.clone()
    gathered = [torch.empty_like(shard) for _ in range(tp)]
    if tp > 1:
        dist.all_gather(gathered, shard, group=group)
    else:
        gathered = [shard]
    logits = torch.cat(gathered, dim=-1)
    ok = True
    if rank == 0:
        ref = Decoder(Weights(cfg, 1, 0, torch.float32, full=True, layers=cfg[1]), B, C, None)
        load(ref, w.NKV)
        want = ref.step()
        err = (logits - want).abs().max().item()
        mag = want.abs().max().item()
        same_tok = torch.equal(tok, ref.tokens)
        print(f"check: TP={tp} logits vs unsharded: max |diff| {err:.3g} (max |logit| {mag:.3g}); "
              f"tokens equal: {same_tok}")
        ok = err <= 1e-4 * max(1.0, mag) and same_tok
    # Graph replay of the same step gives the eager step's logits.
    load(dec, w.nkv)
    eager = dec.step().clone()
    load(dec, w.nkv)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dec.step()
    torch.cuda.current_stream().wait_stream(s)
    load(dec, w.nkv)
    with torch.cuda.graph(g):
        out = dec.step()
    load(dec, w.nkv)
    g.replay()
    torch.cuda.synchronize()
    same = torch.equal(out, eager)
    if rank == 0:
        print(f"check: graph replay logits equal the eager step's: {same}")
    flag = torch.tensor([1 if (ok and same) else 0], device="cuda")
    if tp > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-8b-shape",
                    choices=["llama-8b-shape", "llama-70b-shape"])
    ap.add_argument("--layers", type=int, default=0, help="0: the preset's")
    ap.add_argument("--batches", default="1,8,32,128,256,512")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--contexts", default="",
                    help="one context per batch of --batches (default: --context for each)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--graphs", default="on", choices=["on", "off"])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the element-wise pieces between the GEMMs")
    ap.add_argument("--attention-only", type=int, default=0, metavar="TP",
                    help="time torch's decode attention alone for TP's per-rank heads (one GPU)")
    ap.add_argument("--prefill-attention-only", type=int, default=0, metavar="TP",
                    help="time torch's causal attention over one prompt of each of --tokens "
                         "for TP's per-rank heads (one GPU)")
    ap.add_argument("--tokens", default="512,4096", help="prompt lengths (--prefill-attention-only)")
    ap.add_argument("--gemm-only", type=int, default=0, metavar="TP",
                    help="time torch.matmul on TP's per-rank decode GEMMs (one GPU)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    tp = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    group = None
    if tp > 1:
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        group = dist.group.WORLD
    try:
        if a.check:
            ok = check(tp, rank, group, a.compile)
            if rank == 0:
                print("check:", "passed" if ok else "FAILED")
            return 0 if ok else 1
        if a.gemm_only:
            rows = gemm_only(a.model, a.gemm_only, [int(x) for x in a.batches.split(",")])
            write_rows(a.json, {"model": a.model, "tp_shards": a.gemm_only}, rows)
            return 0
        if a.prefill_attention_only:
            rows = prefill_attention_only(a.model, a.prefill_attention_only,
                                          [int(x) for x in a.tokens.split(",")])
            write_rows(a.json, {"model": a.model, "tp_heads": a.prefill_attention_only}, rows)
            return 0
        if a.attention_only:
            rows = attention_only(a.model, a.attention_only,
                                  [int(x) for x in a.batches.split(",")], a.context)
            write_rows(a.json, {"model": a.model, "tp_heads": a.attention_only,
                                "context": a.context}, rows)
            return 0
        cfg = PRESETS[a.model]
        layers = a.layers or cfg[1]
        torch.manual_seed(1234 + rank)
        w = Weights(cfg, tp, rank, torch.bfloat16, full=False, layers=layers)
        rows = []
        batches = [int(x) for x in a.batches.split(",")]
        contexts = [int(x) for x in a.contexts.split(",")] if a.contexts else [a.context] * len(batches)
        if len(contexts) != len(batches):
            ap.error(f"--contexts has {len(contexts)} values for {len(batches)} batches")
        for b, ctx in zip(batches, contexts):
            dec = Decoder(w, b, ctx, group, a.compile)
            ms = timed(dec, a.steps, a.warmup, a.graphs == "on")
            t = torch.tensor([ms], device="cuda")
            if tp > 1:  # the slowest rank's median
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            rows.append({"batch": b, "context": ctx, "step_ms": round(t.item(), 4)})
            if rank == 0:
                print(f"torch{' compiled' if a.compile else ''} TP={tp} {a.model} layers={layers} "
                      f"batch={b} context={ctx}: "
                      f"{t.item():.3f} ms", flush=True)
            del dec
            torch.cuda.empty_cache()
        if rank == 0 and a.json:
            with open(a.json, "w") as f:
                json.dump({"tp": tp, "model": a.model, "layers": layers,
                           "context": contexts[0] if len(set(contexts)) == 1 else None,
                           "graphs": a.graphs, "compile": a.compile, "steps": a.steps,
                           "torch": torch.__version__,
                           "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
                           "rows": rows}, f, indent=1)
        return 0
    finally:
        if tp > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
