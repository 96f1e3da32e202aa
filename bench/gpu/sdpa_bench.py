#!/usr/bin/env python3
"""sdpa_bench.py — PyTorch's scaled_dot_product_attention (flash and cuDNN backends) on the
shapes bench_cuda times, and the side-by-side table of both.

  sdpa_bench.py run [--json FILE] [--n 1024,...] [--hd 128,64] [--reps 10] [--warmup 3]
                    [--backends flash,cudnn] [--device cuda]
      times torch.nn.functional.scaled_dot_product_attention forward and backward under
      torch.nn.attention.sdpa_kernel(FLASH_ATTENTION) and (CUDNN_ATTENTION); appends JSON
      lines with the same keys as bench_cuda ("impl": "torch-flash" / "torch-cudnn").
      --device cpu --backends math: the same code on the host (a test of this script).
  sdpa_bench.py decode [--json FILE] [--sq 1] [--reps 20] [--warmup 5]
                       [--backends flash,efficient,cudnn] [--device cuda] [--shapes B/Hq/Hkv/Skv,...]
      times SDPA forward on bench_cuda_decode's decode shapes (bf16, head dim 128, GQA by
      enable_gqa=True, or K and V expanded to Hq heads where a backend takes no GQA, not
      causal: one query row sees the whole cache either way; records
      "mode": "decode", "impl": "torch-<backend>", with the cache bytes read per second).
  sdpa_bench.py compare FILE [--md OUT]
      reads the JSON lines of both and prints, per (pass, hd, N, causal), the TFLOP/s of
      attnrun and of each torch backend and the ratio attnrun / best torch backend; then,
      for the decode records, per (B, Hq, Hkv, Sq, Skv), the times of attnrun's planned and
      plain forms and of each torch backend, and best torch time / attnrun time; the
      targets at a glance (worst and mean ours / best torch at d = 128, N >= 8K, against the
      issue's 0.6 / 0.5 / 1.0) and each experiment against the kernel it would replace; then the
      ablation runs' tables (ATTN_SM90_ABLATE: sm90 backward; ATTN_MMA_ABLATE: mma.sync
      forward), each mask's time against mask 0's.

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


DECODE_SHAPES = "1/32/8/8192,1/32/8/32768,1/32/8/131072,8/32/8/32768,32/32/8/8192,1/32/32/32768,1/16/1/65536"
DECODE_BACKENDS = ["flash", "efficient", "cudnn", "math"]


def decode(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("sdpa_bench: no CUDA device")
        return 77
    dev = torch.cuda.get_device_name(0) if cuda else "cpu"
    known = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    backends = [("torch-" + b, known[b]) for b in args.backends.split(",")]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = open(args.json, "a") if args.json else None
    d = args.hd
    print(f"torch {torch.__version__} SDPA decode on {dev}, bf16, head dim {d}, Sq {args.sq}")
    print(f"{'impl':<16} {'B':>3} {'Hq':>3} {'Hkv':>3} {'Skv':>7} {'median ms':>10} {'GB/s':>8}")
    gen = torch.Generator(device=args.device).manual_seed(0)
    for spec in args.shapes.split(","):
        b, hq, hkv, skv = (int(x) for x in spec.split("/"))
        q = torch.rand((b, hq, args.sq, d), generator=gen, device=args.device).mul_(2).sub_(1).bfloat16()
        k, v = (torch.rand((b, hkv, skv, d), generator=gen, device=args.device).mul_(2).sub_(1).bfloat16()
                for _ in range(2))
        kv_bytes = 2.0 * b * hkv * skv * d * 2
        for name, backend in backends:
            rec = {"impl": name, "mode": "decode", "pass": "fwd", "dtype": "bf16", "hd": d, "B": b,
                   "Hq": hq, "Hkv": hkv, "Sq": args.sq, "Skv": skv, "causal": 0, "device": dev,
                   "torch": torch.__version__, "date": date}
            try:
                with sdpa_kernel(backend):
                    try:
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
                        fn()
                    except Exception:  # no GQA in this backend: K and V expanded to Hq heads
                        if hq == hkv:
                            raise
                        ke, ve = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v))
                        fn = lambda: F.scaled_dot_product_attention(q, ke, ve)
                        fn()
                        rec["gqa_expanded"] = True
                    med, mn = time_ms(torch, fn, args.warmup, args.reps, cuda)
                rec.update(ms_median=med, ms_min=mn, kv_gbps=kv_bytes / (med * 1e-3) / 1e9)
                print(f"{name:<16} {b:>3} {hq:>3} {hkv:>3} {skv:>7} {med:>10.4f} {rec['kv_gbps']:>8.0f}",
                      flush=True)
            except Exception as e:  # a backend that cannot run this shape
                rec.update(error=str(e).splitlines()[0][:200])
                print(f"{name:<16} {b:>3} {hq:>3} {hkv:>3} {skv:>7} error: {rec['error']}", flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
        del q, k, v
        if cuda:
            torch.cuda.empty_cache()
    return 0


def decode_by_shape(recs):
    """{(B, Hq, Hkv, Sq, Skv): {impl: record}} of the decode records."""
    rows = {}
    for r in recs:
        rows.setdefault((r["B"], r["Hq"], r["Hkv"], r["Sq"], r["Skv"]), {})[r["impl"]] = r
    return rows


def decode_table(recs):
    """The markdown lines of the decode records: per shape, ms of each impl, best torch / ours."""
    rows = decode_by_shape(recs)
    # attnrun-4s: the planned form on the mma.sync kernel with a 4-buffer K/V ring
    # (ATTN_CUDA_FWD_STAGES=4, bench_cuda_decode's "-4s" records); attnrun-ks: on the
    # key-split decode kernel (ATTN_CUDA_FWD_KSPLIT=1, "-ks")
    ours_n = 5
    impls = (["attnrun", "attnrun-plain", "attnrun-paged16", "attnrun-4s", "attnrun-ks"]
             + ["torch-" + b for b in DECODE_BACKENDS])
    lines = ["| B | Hq | Hkv | Sq | Skv | attnrun ms | pack x splits | attnrun plain ms | "
             + "attnrun paged16 ms | attnrun 4-stage ms | attnrun key-split ms | "
             + " | ".join(i.replace("torch-", "torch ") + " ms" for i in impls[ours_n:])
             + " | best torch / attnrun | attnrun GB/s | vs copy | check |",
             "|" + "---|" * (len(impls) + 10)]
    for key in sorted(rows):
        r = rows[key]

        def ms(name):
            x = r.get(name)
            return x.get("ms_median") if x and "ms_median" in x else None

        # (a form that ran the sm90 kernel says so: the plain form does on sm_90)
        cells = [f"{ms(i):.4f}" + ("*" if r[i].get("gqa_expanded") else "")
                 + (" sm90" if r[i].get("path") == "sm90" else "") if ms(i) is not None
                 else ("error" if i in r else "-") for i in impls]
        ours, a = ms("attnrun"), r.get("attnrun", {})
        best = min([t for t in (ms(i) for i in impls[ours_n:]) if t is not None], default=None)
        ratio = f"{best / ours:.2f}" if ours and best else "-"
        plan = f"{a['pack']} x {a['nsplit']}" if "pack" in a else "-"
        gbps = f"{a['kv_gbps']:.0f}" if "kv_gbps" in a else "-"
        vs = f"{a['kv_gbps'] / a['copy_read_gbps']:.2f}" if a.get("copy_read_gbps") else "-"
        lines.append("| " + " | ".join(str(x) for x in key) + f" | {cells[0]} | {plan} | "
                     + " | ".join(cells[1:]) + f" | {ratio} | {gbps} | {vs} | {a.get('check', '-')} |")
    return lines


def dims(r):
    """(Dqk, Dv) of a record: torch's rows and older ones carry hd alone (Dv == Dqk)."""
    return (r["hd"], r.get("hd_v") or r["hd"])


def dims_label(d):
    return str(d[0]) if d[0] == d[1] else f"{d[0]}x{d[1]}"


ABLATE_BITS = [(1, "dQ adds"), (2, "dQ GEMM"), (4, "dS barrier"), (8, "dV+dK GEMMs"),
               (16, "P/dS arithmetic"), (32, "per-step loads")]
# the mma.sync forward's ablation kernel (ATTN_MMA_ABLATE, kernels/cuda/instance.h FA_AB_*)
MMA_ABLATE_BITS = [(1, "K/V loads"), (2, "tile wait + barrier"), (4, "QK^T MMAs"), (8, "online softmax"),
                   (16, "PV MMAs")]


def ablation_table(recs, field="ablate", pass_="bwd", bits=ABLATE_BITS, prefix=""):
    """Rows of the ablation runs' records (records[field] = mask) of one pass, impl starting
    with prefix, each against mask 0 of the same shape."""
    by = {}
    for r in recs:
        if r["pass"] == pass_ and "ms_median" in r and field in r and r["impl"].startswith(prefix):
            by.setdefault((dims(r), r["N"], r["causal"]), {})[r[field]] = r["ms_median"]
    lines = ["| hd | N | causal | left out (mask) | ms | saved ms | saved / full |", "|---|---|---|---|---|---|---|"]
    for key in sorted(by, key=lambda k: (-k[0][0], k[1], k[2])):
        full = by[key].get(0)
        for m in sorted(by[key]):
            ms = by[key][m]
            what = " + ".join(n for b, n in bits if m & b) or "nothing (full kernel)"
            saved = f"{full - ms:.3f} | {(full - ms) / full:.2f}" if full else "- | -"
            lines.append(f"| {dims_label(key[0])} | {key[1]} | {'yes' if key[2] else 'no'} | {what} ({m}) | "
                         f"{ms:.3f} | {saved} |")
    return lines


# The targets (bf16, d = 128, N >= 8K): ours / the best torch backend, per pass and
# kernel family: the mma.sync kernels 0.6 (forward) and 0.5 (backward), the Hopper ones 1.0.
TARGETS = [("fwd", "attnrun", "mma.sync 8-warp (default)", 0.6), ("fwd", "attnrun-mma4", "mma.sync 4-warp", 0.6),
           ("fwd", "attnrun-mma2c", "mma.sync 2-CTA", 0.6), ("fwd", "attnrun-mma4x32", "mma.sync 4x32", 0.6),
           ("fwd", "attnrun-mma4s", "mma.sync 4-stage", 0.6), ("fwd", "attnrun-sm90", "sm90", 1.0),
           ("bwd", "attnrun", "mma.sync (default)", 0.5), ("bwd", "attnrun-mma4s", "mma.sync 4-stage dK/dV", 0.5),
           ("bwd", "attnrun-sm90", "sm90", 1.0), ("bwd", "attnrun-sm90-dqatomic", "sm90, dQ by atomics", 1.0)]
# each experiment against the kernel it would replace: (pass, impl, its default)
VARIANTS = [("fwd", "attnrun-mma4", "attnrun"), ("fwd", "attnrun-mma2c", "attnrun"),
            ("fwd", "attnrun-mma4x32", "attnrun"), ("fwd", "attnrun-mma4s", "attnrun"),
            ("bwd", "attnrun-mma4s", "attnrun"), ("fwd", "attnrun-sm90", "attnrun"),
            ("bwd", "attnrun-sm90", "attnrun"), ("bwd", "attnrun-sm90-dqatomic", "attnrun-sm90")]


# bench_roofline's derived fields, in the order the table's last column lists them
ROOF_EXTRA = [("tflops", "{:.1f} TFLOP/s"), ("flop_per_clk_sm", "{:.0f} FLOP/clk/SM"),
              ("cycles_per_mma_warp", "{:.2f} clk/mma a warp"), ("gbps_per_cta", "{:.2f} GB/s a CTA"),
              ("vs_copy", "{:.2f} of copy")]


def roofline_table(recs):
    """bench_roofline's records in the order it ran them: each measurement and what follows
    from it (its record's derived fields)."""
    lines = ["| test | what | measured | unit | also | ms | SM MHz |", "|---|---|---|---|---|---|---|"]
    for r in recs:
        also = ", ".join(f.format(r[k]) for k, f in ROOF_EXTRA if k in r) or "-"
        lines.append(f"| {r['test']} | {r['label']} | {r['value']:.4g} | {r['unit']} | {also} | "
                     f"{r['ms_median']:.3f} | {r.get('sm_mhz', 0):.0f} |")
    return lines


def geomean(xs):
    import math
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary_lines(rows, dec):
    """Two tables at a glance: the issue's targets (worst and geometric mean of ours / best
    torch over d = 128, N >= 8K, causal and not) and each experiment's speed-up over the
    kernel it would replace (that kernel's median time over the experiment's: geometric mean,
    min, max over every shape both ran; decode: the 4-stage ring's and the key-split
    kernel's steps against the planned form's, and the plain form's on the key-split kernel
    against the plain form's)."""
    lines = ["| pass | kernel | shapes | worst / best torch | geomean / best torch | target | met |",
             "|---|---|---|---|---|---|---|"]
    for pas, impl, label, target in TARGETS:
        ratios = []
        for (p_, d, n, _c), r in rows.items():
            best = max([r[i]["tflops"] for i in ("torch-flash", "torch-cudnn") if "tflops" in r.get(i, {})],
                       default=None)
            if p_ == pas and d == (128, 128) and n >= 8192 and best and "tflops" in r.get(impl, {}):
                ratios.append(r[impl]["tflops"] / best)
        if ratios:
            lines.append(f"| {pas} | {label} | {len(ratios)} | {min(ratios):.2f} | {geomean(ratios):.2f} | "
                         f"{target:.1f} | {'yes' if min(ratios) >= target else 'no'} |")
    vlines = ["| pass | experiment | against | shapes | geomean speed-up | min | max |",
              "|---|---|---|---|---|---|---|"]
    for pas, impl, base in VARIANTS:
        xs = [r[base]["ms_median"] / r[impl]["ms_median"] for (p_, *_k), r in rows.items()
              if p_ == pas and r.get(impl, {}).get("ms_median") and r.get(base, {}).get("ms_median")]
        if xs:
            vlines.append(f"| {pas} | {impl} | {base} | {len(xs)} | {geomean(xs):.2f} | {min(xs):.2f} | {max(xs):.2f} |")
    ms = [{i: x.get("ms_median") for i, x in d.items()} for d in decode_by_shape(dec).values()]
    # (the plain form's key-split steps against the plain form's, the sm90 kernel on sm_90)
    for impl, base in (("attnrun-4s", "attnrun"), ("attnrun-ks", "attnrun"),
                       ("attnrun-plain-ks", "attnrun-plain")):
        xs = [d[base] / d[impl] for d in ms if d.get(base) and d.get(impl)]
        if xs:
            vlines.append(f"| decode | {impl} | {base} | {len(xs)} | {geomean(xs):.2f} | {min(xs):.2f} | {max(xs):.2f} |")
    out = []
    if len(lines) > 2:
        out += ["", "Targets (bf16, d = 128, N >= 8K, causal and not): ours / the best torch backend.", ""] + lines
    if len(vlines) > 2:
        out += ["", "Experiments against the kernel each would replace: its time over theirs (a speed-up "
                "above 1), over every shape both ran.", ""] + vlines
    return out


def compare(args):
    rows, det, dec, abl, roof = {}, [], [], [], []
    with open(args.file) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r.get("mode") == "decode":
                dec.append(r)
                continue
            if r.get("mode") == "roofline":  # bench_roofline
                roof.append(r)
                continue
            if "ablate" in r or "mma_ablate" in r:  # ATTN_SM90_ABLATE / ATTN_MMA_ABLATE runs
                abl.append(r)
                continue
            if r.get("deterministic"):
                det.append(r)
                continue
            key = (r["pass"], dims(r), r["N"], r["causal"])
            rows.setdefault(key, {})[r["impl"]] = r
    impls = ["attnrun", "attnrun-mma4", "attnrun-sm90", "torch-flash", "torch-cudnn"]
    lines = ["| pass | hd | N | causal | attnrun TFLOP/s | attnrun mma 4-warp | attnrun sm90 | torch flash "
             "| torch cuDNN | attnrun / best torch | sm90 / best torch | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
        check = "/".join(r[i].get("check", "-") for i in ("attnrun", "attnrun-mma4", "attnrun-sm90") if i in r) or "-"
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
                     f"{r['tflops']:.1f} | - | - | - | - | {r['tflops'] / base:.2f} of atomic dQ | - |" if base else
                     f"| {label} | {r['hd']} | {r['N']} | {'yes' if r['causal'] else 'no'} | "
                     f"{r['tflops']:.1f} | - | - | - | - | - | - |")
        lines[-1] += f" {r.get('check', '-')} |"
    # the mma.sync forward's two-CTA 8-warp kernel (ATTN_CUDA_FWD_CTAS=2), its 4-warp kernel
    # of 32-row warps (ATTN_CUDA_FWD_WARP_ROWS=32) and its 8-warp kernel with a 4-buffer K/V
    # ring (ATTN_CUDA_FWD_STAGES=4) against best torch and the default 8-warp kernel
    # (and the backward's dK/dV kernel with 4 step buffers, ATTN_CUDA_BWD_STAGES=4: "bwd mma
    # 4-stage" rows against the default mma.sync backward)
    for name, label in (("attnrun-mma2c", "fwd mma 2-CTA"), ("attnrun-mma4x32", "fwd mma 4x32"),
                        ("attnrun-mma4s", "fwd mma 4-stage"), ("attnrun-mma4s", "bwd mma 4-stage")):
        for key in sorted(rows, key=lambda k: (-k[1][0], -k[1][1], k[2], k[3])):
            r = rows[key]
            if key[0] != label[:3] or name not in r or "tflops" not in r[name]:
                continue
            t, base = r[name]["tflops"], r.get("attnrun", {}).get("tflops")
            best = max([r[i]["tflops"] for i in ("torch-flash", "torch-cudnn") if "tflops" in r.get(i, {})],
                       default=None)
            lines.append(f"| {label} | {dims_label(key[1])} | {key[2]} | {'yes' if key[3] else 'no'} | "
                         f"{t:.1f} | - | - | - | - | {f'{t / best:.2f}' if best else '-'} | "
                         f"{f'{t / base:.2f} of 8-warp' if base else '-'} | {r[name].get('check', '-')} |")
    # the sm90 backward's dQ by atomics (ATTN_SM90_DQ=0) against its TMA reduce-adds (the default)
    for key in sorted(rows, key=lambda k: (-k[1][0], k[2], k[3])):
        r, name = rows[key], "attnrun-sm90-dqatomic"
        if key[0] != "bwd" or name not in r or "tflops" not in r[name]:
            continue
        t, base = r[name]["tflops"], r.get("attnrun-sm90", {}).get("tflops")
        rel = f"{t / base:.2f} of TMA dQ" if base else "-"
        lines.append(f"| bwd sm90 dQ by atomics | {dims_label(key[1])} | {key[2]} | {'yes' if key[3] else 'no'} | "
                     f"- | - | {t:.1f} | - | - | - | {rel} | {r[name].get('check', '-')} |")
    dev = next((x.get("device") for r in rows.values() for x in r.values() if x.get("device")), "?")
    text = (f"Forward/backward TFLOP/s (peers' FLOP rule), bf16, median of timed runs, on {dev}.\n\n"
            + "\n".join(lines) + "\n")
    glance = summary_lines(rows, dec)
    if glance:
        text += "\n".join(glance) + "\n"
    if dec:
        dev = next((r.get("device") for r in dec if r.get("device")), dev)
        text += (f"\nDecode steps, bf16, head dim 128, median ms of timed runs, on {dev} (GB/s: K+V "
                 "bytes read / time; vs copy: over a device copy's read rate of the same bytes; "
                 "*: the backend took no GQA, K and V expanded to Hq heads; sm90: that form ran the Hopper "
                 "kernel, not mma.sync).\n\n"
                 + "\n".join(decode_table(dec)) + "\n")
    if any("ablate" in r for r in abl):
        text += ("\nThe sm90 backward with stages left out (ATTN_SM90_ABLATE, kernels/cuda/bwd_sm90_body.cuh "
                 "G_AB_*; gradients wrong, timing only), median ms of timed runs, one bench run a mask; "
                 "saved: the full kernel's time less this one's.\n\n" + "\n".join(ablation_table(abl)) + "\n")
    mab = ablation_table(abl, "mma_ablate", "fwd", MMA_ABLATE_BITS, "attnrun-mma-ab")
    if len(mab) > 2:
        base = rows.get(("fwd", (128, 128), 8192, 0), {}).get("attnrun", {}).get("ms_median")
        text += ("\nThe mma.sync forward with stages left out (ATTN_MMA_ABLATE, kernels/cuda/instance.h "
                 "FA_AB_*: its ablation kernel, flash_fwd_ab; output wrong except at mask 0, timing only), "
                 "median ms of timed runs, one bench run a mask; saved: mask 0's time less this one's"
                 + (f"; the default kernel (flash_fwd) at d=128 N=8192 not causal in the main run: {base:.3f} ms"
                    if base else "") + ".\n\n" + "\n".join(mab) + "\n")
    if roof:
        dev = next((r.get("device") for r in roof if r.get("device")), dev)
        text += ("\nWhat the SMs sustain on the forward's instructions alone (bench_roofline; per clock at the "
                 f"SM clock its CTA 0 ran at), on {dev}.\n\n" + "\n".join(roofline_table(roof)) + "\n")
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
    dcd = sub.add_parser("decode")
    dcd.add_argument("--json")
    dcd.add_argument("--sq", type=int, default=1)
    dcd.add_argument("--hd", type=int, default=128)
    dcd.add_argument("--shapes", default=DECODE_SHAPES)
    dcd.add_argument("--reps", type=int, default=20)
    dcd.add_argument("--warmup", type=int, default=5)
    dcd.add_argument("--backends", default="flash,efficient,cudnn",
                     type=lambda x: x if set(x.split(",")) <= set(DECODE_BACKENDS) else
                     p.error(f"--backends {x!r}: a list of {', '.join(DECODE_BACKENDS)}"))
    dcd.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    c = sub.add_parser("compare")
    c.add_argument("file")
    c.add_argument("--md")
    args = p.parse_args()
    return {"run": run, "decode": decode, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
