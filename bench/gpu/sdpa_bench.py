#!/usr/bin/env python3
"""sdpa_bench.py — PyTorch's scaled_dot_product_attention (flash and cuDNN backends) on the
shapes bench_cuda times, and the side-by-side table of both.

  sdpa_bench.py run [--json FILE] [--n 1024,...] [--hd 128,64] [--reps 10] [--warmup 3]
                    [--backends flash,cudnn] [--device cuda]
      times torch.nn.functional.scaled_dot_product_attention forward and backward under
      torch.nn.attention.sdpa_kernel(FLASH_ATTENTION) and (CUDNN_ATTENTION); appends JSON
      lines with the same keys as bench_cuda ("impl": "torch-flash" / "torch-cudnn").
      --device cpu --backends math: the same code on the host (a test of this script).
  sdpa_bench.py compare FILE [--md OUT]
      reads the JSON lines of both and prints, per (pass, hd, N, causal), the TFLOP/s of
      attnrun and of each torch backend and the ratio attnrun / best torch backend.

Same FLOP rule as bench_cuda: forward 4*B*H*N^2*D (causal: half), backward 2.5x forward;
B = tokens / N, H = d_model / D. Median of --reps timed runs (CUDA events) after --warmup.
The backward is torch.autograd.grad of the output (no .grad accumulation)."""
import argparse
import datetime
import json
import sys


def parse_list(s):
    out = []
    for part in s.split(","):
        part = part.strip()
        if part:
            out.append(int(part[:-1]) * 1024 if part[-1] in "kK" else int(part))
    return out


def flops(b, h, n, d, causal, bwd):
    f = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return f * (2.5 if bwd else 1.0)


def time_ms(torch, fn, warmup, reps, cuda=True):
    import time
    start, end = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else (None, None)
    times = []
    for i in range(warmup + reps):
        if cuda:
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(ms)
    times.sort()
    mid = len(times) // 2
    med = times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])
    return med, times[0]


def run(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("sdpa_bench: no CUDA device")
        return 77
    dev = torch.cuda.get_device_name(0) if cuda else "cpu"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    known = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "math": SDPBackend.MATH}
    backends = [("torch-" + b, known[b]) for b in args.backends.split(",")]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = open(args.json, "a") if args.json else None
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) SDPA on {dev}, {args.dtype}, "
          f"{args.tokens} tokens x d_model {args.model_dim}")
    print(f"{'impl':<12} {'pass':<4} {'hd':>4} {'N':>6} {'B':>3} {'H':>3} {'causal':<6} "
          f"{'median ms':>10} {'TFLOP/s':>8}")
    gen = torch.Generator(device=args.device).manual_seed(0)
    for d in parse_list(args.hd):
        for n in parse_list(args.n):
            h, b = args.model_dim // d, max(args.tokens // n, 1)
            shape = (b, h, n, d)
            q, k, v, do = (torch.rand(shape, generator=gen, device=args.device, dtype=torch.float32)
                           .mul_(2).sub_(1).to(dtype) for _ in range(4))
            for causal in (0, 1):
                for name, backend in backends:
                    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
                    for bwd in (0, 1):
                        rec = {"impl": name, "pass": "bwd" if bwd else "fwd", "dtype": args.dtype,
                               "hd": d, "N": n, "B": b, "H": h, "causal": causal,
                               "device": dev, "torch": torch.__version__, "date": date}
                        try:
                            with sdpa_kernel(backend):
                                if not bwd:
                                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                                else:
                                    o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=bool(causal))
                                    fn = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
                                med, mn = time_ms(torch, fn, args.warmup, args.reps, cuda)
                            tf = flops(b, h, n, d, causal, bwd) / (med * 1e-3) / 1e12
                            rec.update(ms_median=med, ms_min=mn, tflops=round(tf, 2))
                            print(f"{name:<12} {rec['pass']:<4} {d:>4} {n:>6} {b:>3} {h:>3} "
                                  f"{'yes' if causal else 'no':<6} {med:>10.3f} {tf:>8.1f}", flush=True)
                        except Exception as e:  # a backend that cannot run this shape
                            rec.update(error=str(e).splitlines()[0][:200])
                            print(f"{name:<12} {rec['pass']:<4} {d:>4} {n:>6} error: {rec['error']}", flush=True)
                        if out:
                            out.write(json.dumps(rec) + "\n")
                            out.flush()
            del q, k, v, do
            if cuda:
                torch.cuda.empty_cache()
    return 0


def dims(r):
    """(Dqk, Dv) of a record: torch's rows and older ones carry hd alone (Dv == Dqk)."""
    return (r["hd"], r.get("hd_v") or r["hd"])


def dims_label(d):
    return str(d[0]) if d[0] == d[1] else f"{d[0]}x{d[1]}"


def compare(args):
    rows, det = {}, []
    with open(args.file) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r.get("deterministic"):
                det.append(r)
                continue
            key = (r["pass"], dims(r), r["N"], r["causal"])
            rows.setdefault(key, {})[r["impl"]] = r
    impls = ["attnrun", "attnrun-sm90", "torch-flash", "torch-cudnn"]
    lines = ["| pass | hd | N | causal | attnrun TFLOP/s | attnrun sm90 | torch flash | torch cuDNN "
             "| attnrun / best torch | sm90 / best torch | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(rows, key=lambda k: (k[0] != "fwd", -k[1][0], -k[1][1], k[2], k[3])):
        r = rows[key]

        def tf(name):
            x = r.get(name)
            return x.get("tflops") if x and "tflops" in x else None

        ours = tf("attnrun")
        best = max([t for t in (tf("torch-flash"), tf("torch-cudnn")) if t is not None], default=None)
        ratio = f"{ours / best:.2f}" if ours is not None and best else "-"
        hop = tf("attnrun-sm90")
        ratio90 = f"{hop / best:.2f}" if hop is not None and best else "-"
        cells = [f"{tf(i):.1f}" if tf(i) is not None else ("error" if i in r else "-") for i in impls]
        check = "/".join(r[i].get("check", "-") for i in ("attnrun", "attnrun-sm90") if i in r) or "-"
        lines.append(f"| {key[0]} | {dims_label(key[1])} | {key[2]} | {'yes' if key[3] else 'no'} | "
                     + " | ".join(cells) + f" | {ratio} | {ratio90} | {check} |")
    # deterministic backward rows, each against the same kernels' atomic-dQ row
    for r in det:
        if r["pass"] != "bwd":
            continue
        impl = r.get("impl", "attnrun")
        base = rows.get(("bwd", dims(r), r["N"], r["causal"]), {}).get(impl, {}).get("tflops")
        label = "bwd deterministic" + (" (sm90)" if impl.startswith("attnrun-sm90") else "")
        lines.append(f"| {label} | {r['hd']} | {r['N']} | {'yes' if r['causal'] else 'no'} | "
                     f"{r['tflops']:.1f} | - | - | - | {r['tflops'] / base:.2f} of atomic dQ | - |" if base else
                     f"| {label} | {r['hd']} | {r['N']} | {'yes' if r['causal'] else 'no'} | "
                     f"{r['tflops']:.1f} | - | - | - | - | - |")
        lines[-1] += f" {r.get('check', '-')} |"
    # the sm90 backward's TMA reduce-add dQ (ATTN_SM90_DQ=1) against its atomics (the default)
    for key in sorted(rows, key=lambda k: (-k[1][0], k[2], k[3])):
        r, name = rows[key], "attnrun-sm90-dqtma"
        if key[0] != "bwd" or name not in r or "tflops" not in r[name]:
            continue
        t, base = r[name]["tflops"], r.get("attnrun-sm90", {}).get("tflops")
        rel = f"{t / base:.2f} of atomic dQ" if base else "-"
        lines.append(f"| bwd sm90 dQ by TMA | {dims_label(key[1])} | {key[2]} | {'yes' if key[3] else 'no'} | "
                     f"- | {t:.1f} | - | - | - | {rel} | {r[name].get('check', '-')} |")
    dev = next((x.get("device") for r in rows.values() for x in r.values() if x.get("device")), "?")
    text = (f"Forward/backward TFLOP/s (peers' FLOP rule), bf16, median of timed runs, on {dev}.\n\n"
            + "\n".join(lines) + "\n")
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--json")
    r.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    r.add_argument("--n", default="1024,2048,4096,8192,16384")
    r.add_argument("--hd", default="128,64")
    r.add_argument("--tokens", type=int, default=16384)
    r.add_argument("--model-dim", type=int, default=2048)
    r.add_argument("--reps", type=int, default=10)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--backends", default="flash,cudnn",
                   type=lambda x: x if set(x.split(",")) <= {"flash", "cudnn", "math"} else
                   p.error(f"--backends {x!r}: a list of flash, cudnn, math"))
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    c = sub.add_parser("compare")
    c.add_argument("file")
    c.add_argument("--md")
    args = p.parse_args()
    return run(args) if args.cmd == "run" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
