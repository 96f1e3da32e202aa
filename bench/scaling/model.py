#!/usr/bin/env python3
"""model.py — the scaling studies' cost model (DESIGN.md §7): predicts a run's time from
the problem, the grid (tp x cp), a kernel rate and a link (alpha, beta); calibrates those
from measured records (attnrun --json lines and linkprobe.py lines); checks itself against
every measured run; projects to rank counts and links no test machine has.

The model, per rank (its share of the heads, tp, and of the rows, cp):
  F        FLOPs the rank computes (measured: the record's per-rank flops_computed; in a
           projection: the tiles the mask leaves, by the peers' rule, / (tp * cp): the
           zigzag layout balances a causal triangle)
  c        = F / (cp * rate)                   compute of one ring step
  b        = bytes of the K/V block a step passes on (forward: K and V in the storage
           dtype; backward: also their float32 gradient accumulators)
  forward  T = c + (cp - 1) * max(c, alpha + b / beta)   (step s's exchange hides under
           step s-1's compute; cp = 1: T = c)
  backward the same with backward's c and b, plus one more hop: the gradient accumulators
           go home
  tp mode  heads split: c = F / rate, no exchange (attention alone has no W_o AllReduce)
  split-kv every CP rank holds all query rows and 1/cp of the keys: c = F / rate, then
           (forward) a ring allgather of the float32 states, (cp - 1) (alpha + s / beta)
           with s = B Hq/tp Sq (Dv + 2) 4 bytes, or (backward) a ring allreduce of dQ,
           2 (cp - 1) (alpha + q / (cp beta)) with q = B Sq Hq/tp Dqk 4; nothing overlaps
  layer    (--d-model) adds the rank's projection GEMMs at a GEMM rate (calibrated as what
           the layer runs' times leave after attention and AllReduce) and a ring AllReduce
           of y (backward: dx) over tp: 2 (tp - 1) (alpha + bytes / (tp beta))
rate = rate_unit * units: units = threads per rank on the cpu backend (at most its share of
the cores it is bound to), 1 on cuda; rate_unit per (backend, dtype, head dim, pass) and
kernel regime by the lanes of the rank's query tiles (row_class: full tiles, short tiles,
decode's row kernels).

Commands:
  model.py calibrate RECORDS.jsonl... [-o calib.json]
  model.py validate RECORDS.jsonl... [--calib calib.json]   measured vs predicted, per run
  model.py project --calib calib.json --ranks 1024 --seq 1M [--mode ring|tp|split-kv] [--link ib]
                   [--rate-tflops 400] [problem flags as attnrun's]
Exit status: 0; 1 when validate finds a run off by more than --max-err; 2 bad arguments."""
import argparse
import json
import math
import statistics
import sys

# Links no test machine here has: datasheet figures per GPU, one direction (assumptions,
# not measurements: a projection says which it used).
LINKS = {
    "nvlink": {"alpha_s": 3e-6, "beta_Bps": 450e9, "source": "NVLink 4 (H100/H200), 450 GB/s a GPU, assumed"},
    "ib": {"alpha_s": 5e-6, "beta_Bps": 50e9, "source": "InfiniBand NDR 400 Gb/s a GPU, assumed"},
}
ESIZE = {"f32": 4, "bf16": 2, "f16": 2}


def sizes(k):
    """'4K' -> 4096, '1M' -> 1048576 (attnrun's suffixes)."""
    k = str(k).strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(k[-1:], 1)
    return int(float(k[:-1] if mult > 1 else k) * mult)


# ---- the problem's FLOPs and bytes --------------------------------------------------------
def visible_pairs(sq, skv, causal, wl, wr):
    """Query-key pairs the mask leaves (bottom-right causal, window), exact, O(sq)."""
    off, total = skv - sq, 0
    for i in range(sq):
        lo, hi = 0, skv - 1
        c = i + off
        if causal:
            hi = min(hi, c)
        if wl is not None and wl >= 0:
            lo = max(lo, c - wl)
        if wr is not None and wr >= 0:
            hi = min(hi, c + wr)
        total += max(0, hi - lo + 1)
    return total


def flops(cfg, backward=False):
    """FLOPs of the visible pairs, by the peers' per-pair rule 2*(Dqk + Dv) (backward 2.5x)."""
    pairs = cfg["batch"] * cfg["heads_q"] * visible_pairs(
        cfg["seq_q"], cfg["seq_kv"], cfg["causal"], cfg.get("window_left", -1), cfg.get("window_right", -1))
    f = 2.0 * pairs * (cfg["head_dim_qk"] + cfg["head_dim_v"])
    return 2.5 * f if backward else f


def block_bytes(cfg, tp, cp, dtype, backward=False):
    """Bytes one ring step passes on: this rank's K and V rows (and float32 dK, dV)."""
    hkv = max(1, cfg["heads_kv"] // tp)
    rows = cfg["batch"] * math.ceil(cfg["seq_kv"] / cp) * hkv
    per = cfg["head_dim_qk"] + cfg["head_dim_v"]
    return rows * per * (ESIZE[dtype] + (4 if backward else 0))


# ---- the model -----------------------------------------------------------------------------
def predict_split(cfg, tp, cp, rate, link, backward=False, F=None):
    """(time, compute, comm) of a split-KV call: the rank's compute, then its collective."""
    F = flops(cfg, backward) / (tp * cp) if F is None else F
    rows = cfg["batch"] * cfg["seq_q"] * max(1, cfg["heads_q"] // tp)
    if backward:
        comm = 2 * (cp - 1) * (link["alpha_s"] + rows * cfg["head_dim_qk"] * 4 / (cp * link["beta_Bps"]))
    else:
        comm = (cp - 1) * (link["alpha_s"] + rows * (cfg["head_dim_v"] + 2) * 4 / link["beta_Bps"])
    c = F / rate
    return c + comm, c, comm


def predict(cfg, tp, cp, rate, link, dtype, backward=False, F=None, split=False):
    """(time, compute of one step, comm of one step) of one call on the slowest rank:
    c + (cp - 1) * max(c, alpha + b/beta), plus the backward's unhidden hop home (split:
    predict_split)."""
    if split:
        return predict_split(cfg, tp, cp, rate, link, backward, F)
    F = flops(cfg, backward) / (tp * cp) if F is None else F
    c = F / (cp * rate)
    comm = link["alpha_s"] + block_bytes(cfg, tp, cp, dtype, backward) / link["beta_Bps"]
    t = c + (cp - 1) * max(c, comm) + (comm if backward and cp > 1 else 0.0)
    return t, c, comm


def layer_terms(cfg, tp, cp, link, backward=False):
    """(GEMM FLOPs of one rank, AllReduce seconds) of the --d-model layer around the
    attention: x W_qkv and O W_o on the rank's rows and heads (backward: dX and dW, twice
    that), and a ring AllReduce of y (backward: dx) over tp, 2 (tp-1) (alpha + bytes/(tp beta))."""
    d, rows = cfg["d_model"], cfg["batch"] * math.ceil(cfg["seq_q"] / cp)
    hq, hk = cfg["heads_q"] // tp, max(1, cfg["heads_kv"] // tp)
    cols = hq * cfg["head_dim_qk"] + hk * (cfg["head_dim_qk"] + cfg["head_dim_v"])
    gemm = 2.0 * rows * d * (cols + hq * cfg["head_dim_v"]) * (2 if backward else 1)
    nbytes = rows * d * 4
    ar = 2 * (tp - 1) * (link["alpha_s"] + nbytes / (tp * link["beta_Bps"])) if tp > 1 else 0.0
    return gemm, ar


# ---- records -------------------------------------------------------------------------------
def load(paths):
    runs, probes = [], []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                (probes if r.get("tool") == "linkprobe" else runs).append(r)
    return [r for r in runs if r.get("tool") == "attnrun"], probes


def cpus(cpuset):
    """'0-3,8' -> {0, 1, 2, 3, 8}."""
    out = set()
    for part in (cpuset or "").split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def units(r, pr):
    """What a rank's rate scales with: on cpu its threads, but no more than its share of
    the cores it is bound to (ranks bound to the same cores split them: oversubscribed);
    on cuda 1 (a device)."""
    if r["backend"] != "cpu":
        return 1
    mine = cpus(pr.get("cpuset"))
    sharing = sum(1 for q in r["per_rank"] if q.get("host") == pr.get("host") and cpus(q.get("cpuset")) & mine)
    share = len(mine) / max(sharing, 1) if mine else float(pr.get("threads") or 1)
    return min(float(pr.get("threads") or 1), share)


def row_class(rows, group=1):
    """Kernel regimes by the lanes of a rank's query tile (its query rows times the GQA
    group, whose heads share a short tile): full tiles (128 lanes: no suffix), short tiles,
    and decode's row kernels (16 lanes or fewer), each with a rate of its own."""
    if rows is None or rows * group >= 128:
        return ""
    return "/lanes<=16" if rows * group <= 16 else "/lanes<128"


def rate_key(r, pass_, pr=None):
    c = r["config"]
    group = max(1, c["heads_q"] // max(1, c["heads_kv"]))
    return (f'{r["backend"]}/{r["dtype"]}/d{c["head_dim_qk"]}/{pass_}'
            + row_class((pr or {}).get("q_rows"), group))


def gemm_key(r, pass_):
    return f'{r["backend"]}/gemm/{pass_}'


def passes(r):
    return ["fwd"] + (["bwd"] if r["config"].get("bwd") else [])


def fit_link(probes):
    """alpha + bytes/beta from ping-pong points (bytes, one-way seconds): alpha from the
    smallest messages, beta by least squares (intercept alpha) over the messages of 1 MiB
    and up, the sizes a ring step passes (cached small copies would flatter beta)."""
    pts = sorted((p_["bytes"], p_["seconds"]) for p in probes for p_ in p["points"] if p_["seconds"] > 0)
    big = [(x, t) for x, t in pts if x >= 1 << 20] or pts[-2:]
    if len(pts) < 2 or not big:
        return None
    alpha = statistics.median(t for _, t in pts[:2])
    slope = sum(x * (t - alpha) for x, t in big) / sum(x * x for x, _ in big)
    return {"alpha_s": alpha, "beta_Bps": 1.0 / slope if slope > 0 else float("inf"),
            "source": f"measured by linkprobe.py ({probes[0].get('where', '?')}), {len(pts)} points"}


def calibrate(runs, probes):
    """{rates: key -> FLOP/s per unit (median over ranks and runs), link}."""
    per = {}
    for r in runs:
        for ps in passes(r):
            for pr in r["per_rank"]:
                F, t = pr.get(f"{ps}_flops_computed"), pr.get(f"{ps}_compute_s")
                if F and t:
                    per.setdefault(rate_key(r, ps, pr), []).append(F / t / units(r, pr))
    rates = {k: statistics.median(v) for k, v in per.items()}
    link = fit_link(probes)
    # The layer's GEMM rate: what its runs' time leaves after the modelled attention and
    # AllReduce, per GEMM FLOP (layer runs record no compute split of their own).
    gemm = {}
    for r in runs if link else []:
        if not r["config"].get("d_model"):
            continue
        for ps in passes(r):
            pr = max(r["per_rank"], key=lambda q: q.get(f"{ps}_flops_computed") or 0)
            rk, want = rate_key(r, ps, pr), r["time_s"] if ps == "fwd" else r.get("bwd_time_s")
            if rk not in rates or not want:
                continue
            u = units(r, pr)
            t_attn, _, _ = predict(r["config"], r["tp"], r["cp"], rates[rk] * u, link, r["dtype"],
                                   ps == "bwd", F=pr.get(f"{ps}_flops_computed") or 0)
            flops_g, ar = layer_terms(r["config"], r["tp"], r["cp"], link, ps == "bwd")
            if want - t_attn - ar > 0:
                gemm.setdefault(gemm_key(r, ps), []).append(flops_g / (want - t_attn - ar) / u)
    rates.update({k: statistics.median(v) for k, v in gemm.items()})
    return {"rates": dict(sorted(rates.items())), "link": link}


def predict_run(r, calib, ps):
    """The model's time for pass ps of a measured run (the slowest rank's); None when the
    calibration lacks its rate or link, or for a --d-model layer run (not modelled)."""
    link = calib["link"]
    layer = bool(r["config"].get("d_model"))
    gemm_unit = calib["rates"].get(gemm_key(r, ps))
    if link is None or (layer and gemm_unit is None):
        return None
    worst = 0.0
    for pr in r["per_rank"]:
        F, rate_unit = pr.get(f"{ps}_flops_computed"), calib["rates"].get(rate_key(r, ps, pr))
        if rate_unit is None:
            return None
        if not F:
            continue
        t, _, _ = predict(r["config"], r["tp"], r["cp"], rate_unit * units(r, pr), link,
                          r["dtype"], ps == "bwd", F=F, split="split-kv" in r["mode"])
        if layer:
            gemm, ar = layer_terms(r["config"], r["tp"], r["cp"], link, ps == "bwd")
            t += gemm / (gemm_unit * units(r, pr)) + ar
        worst = max(worst, t)
    return worst


def validate(runs, calib, max_err, out=sys.stdout):
    rows, bad = [], 0
    for r in runs:
        c = r["config"]
        for ps in passes(r):
            want = r["time_s"] if ps == "fwd" else r.get("bwd_time_s")
            got = predict_run(r, calib, ps)
            if got is None or not want:
                continue
            err = got / want - 1
            bad += abs(err) > max_err
            rows.append((r["ranks"], r["mode"], r["tp"], r["cp"], c["seq_q"], ps, want, got, err))
    print(f"{'ranks':>5} {'mode':>6} {'tp':>3} {'cp':>3} {'seq':>7} {'pass':>4} "
          f"{'measured_ms':>11} {'model_ms':>9} {'err':>7}", file=out)
    for n, m, tp, cp, s, ps, w, g, e in rows:
        print(f"{n:5d} {m:>6} {tp:3d} {cp:3d} {s:7d} {ps:>4} {w * 1e3:11.2f} {g * 1e3:9.2f} "
              f"{e * 100:+6.1f}%", file=out)
    errs = [abs(e) for *_, e in rows]
    if errs:
        print(f"model vs {len(errs)} measured passes: median |err| {statistics.median(errs) * 100:.1f}%, "
              f"max {max(errs) * 100:.1f}%, {bad} over {max_err * 100:.0f}%", file=out)
    return rows, bad


def project(args, calib):
    cfg = {"batch": args.batch, "seq_q": sizes(args.seq), "seq_kv": sizes(args.seq_kv or args.seq),
           "heads_q": args.heads, "heads_kv": args.kv_heads or args.heads,
           "head_dim_qk": args.head_dim, "head_dim_v": args.head_dim_v or args.head_dim,
           "causal": args.causal, "window_left": args.window[0], "window_right": args.window[1]}
    P = args.ranks
    tp, cp = (P, 1) if args.mode == "tp" else (args.tp or 1, P // (args.tp or 1))
    if tp * cp != P or cfg["heads_q"] % tp:
        raise SystemExit(f"model.py: --ranks {P} does not split into tp {tp} x cp {cp} with {cfg['heads_q']} heads")
    link = dict(LINKS[args.link]) if args.link in LINKS else calib.get("link")
    if link is None:
        raise SystemExit("model.py: no link: give --link nvlink|ib or a calibration with linkprobe points")
    if args.rate_tflops:
        rate, rate_src = args.rate_tflops * 1e12, "--rate-tflops (given)"
    else:
        rows = cfg["seq_q"] if args.mode == "split-kv" else math.ceil(cfg["seq_q"] / cp)
        key = (f"{args.backend}/{args.dtype}/d{args.head_dim}/{'bwd' if args.bwd else 'fwd'}"
               + row_class(rows, max(1, cfg["heads_q"] // cfg["heads_kv"])))
        if key not in calib.get("rates", {}):
            raise SystemExit(f"model.py: no calibrated rate for {key}; give --rate-tflops")
        rate, rate_src = calib["rates"][key] * args.units, f"calibrated {key} x {args.units} units"
    t, c, comm = predict(cfg, tp, cp, rate, link, args.dtype, args.bwd, split=args.mode == "split-kv")
    ideal = flops(cfg, args.bwd) / (P * rate)
    res = {"ranks": P, "tp": tp, "cp": cp, "seq": cfg["seq_q"], "pass": "bwd" if args.bwd else "fwd",
           "time_s": t, "step_compute_s": c, "step_comm_s": comm, "efficiency": ideal / t,
           "bound": "compute" if c >= comm or cp == 1 else "communication",
           "rate_flops": rate, "rate_source": rate_src, "link": link}
    print(json.dumps(res, indent=1))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate")
    c.add_argument("records", nargs="+")
    c.add_argument("-o", "--out")
    v = sub.add_parser("validate")
    v.add_argument("records", nargs="+")
    v.add_argument("--calib")
    v.add_argument("--max-err", type=float, default=1.0, help="relative error that fails (default 1.0)")
    p = sub.add_parser("project")
    p.add_argument("--calib")
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--mode", choices=["ring", "tp", "split-kv"], default="ring")
    p.add_argument("--tp", type=int)
    p.add_argument("--link", default="measured", help="nvlink | ib | measured (the calibration's)")
    p.add_argument("--rate-tflops", type=float, help="kernel rate per rank (default: calibrated)")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--dtype", default="f32")
    p.add_argument("--units", type=int, default=1, help="threads per rank for a calibrated cpu rate")
    p.add_argument("--seq", required=True)
    p.add_argument("--seq-kv")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--head-dim-v", type=int)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--window", type=lambda s: tuple(int(x) for x in s.split(",")), default=(-1, -1))
    p.add_argument("--bwd", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "calibrate":
        cal = calibrate(*load(a.records))
        text = json.dumps(cal, indent=1)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text + "\n")
        print(text)
        return 0
    if a.cmd == "validate":
        runs, probes = load(a.records)
        cal = json.load(open(a.calib)) if a.calib else calibrate(runs, probes)
        return 1 if validate(runs, cal, a.max_err)[1] else 0
    project(a, json.load(open(a.calib)) if a.calib else {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
