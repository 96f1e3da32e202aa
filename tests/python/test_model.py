"""test_model.py — the scaling cost model (bench/scaling/model.py) on data whose truth is
known: the visible-pair count against brute force, the link fit recovering alpha / beta
from noisy ping-pong points, the rate calibration and validation recovering a synthetic
machine's runs, the compute- and communication-bound limits, split-KV's collectives, a
rate per kernel regime, oversubscribed rank shares.
    python3 tests/python/test_model.py            (exit 0 passed, 1 failed)"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "scaling"))
import model  # noqa: E402

FAILS = []


def check(what, ok, detail=""):
    print(f"  {'ok ' if ok else 'BAD'} {what} {detail}")
    if not ok:
        FAILS.append(what)


def brute_pairs(sq, skv, causal, wl, wr):
    off = skv - sq
    n = 0
    for i in range(sq):
        for j in range(skv):
            ok = (not causal or j <= i + off) and (wl < 0 or j >= i + off - wl) and (wr < 0 or j <= i + off + wr)
            n += ok
    return n


def synthetic_run(rng, cfg, cp, rate, link, noise):
    """An attnrun-like record of a machine that follows the model exactly (times jittered)."""
    F = model.flops(cfg) / cp
    t, _, _ = model.predict(cfg, 1, cp, rate, link, "bf16", F=F)
    per = [{"rank": r, "host": "h", "threads": 1, "cpuset": None, "fwd_flops_computed": F,
            "fwd_compute_s": F / rate * (1 + rng.uniform(-noise, noise))} for r in range(cp)]
    return {"tool": "attnrun", "backend": "cuda", "dtype": "bf16", "mode": "ring" if cp > 1 else "single",
            "ranks": cp, "tp": 1, "cp": cp, "config": dict(cfg, bwd=False),
            "time_s": t * (1 + rng.uniform(-noise, noise)), "per_rank": per}


def main():
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    print("visible pairs vs brute force")
    worst = 0
    for _ in range(40):
        sq, skv = rng.randint(1, 40), rng.randint(1, 40)
        causal, wl, wr = rng.random() < 0.5, rng.choice([-1, 0, 3, 9]), rng.choice([-1, 0, 2])
        worst += model.visible_pairs(sq, skv, causal, wl, wr) != brute_pairs(sq, skv, causal, wl, wr)
    check("visible_pairs", worst == 0, f"{worst} of 40 differ")

    print("link fit")
    alpha, beta = 2e-5, 3e9
    pts = [{"bytes": n, "seconds": (alpha + n / beta) * (1 + rng.uniform(-0.03, 0.03))}
           for n in [8 * 4 ** i for i in range(12)]]
    fit = model.fit_link([{"points": pts, "where": "synthetic"}])
    check("beta within 5%", abs(fit["beta_Bps"] / beta - 1) < 0.05, f"{fit['beta_Bps']:.3g} vs {beta:.3g}")
    check("alpha within 10%", abs(fit["alpha_s"] / alpha - 1) < 0.1, f"{fit['alpha_s']:.3g} vs {alpha:.3g}")

    print("calibration and validation on a synthetic machine")
    rate, link = 3e11, {"alpha_s": alpha, "beta_Bps": beta}
    cfgs = [{"batch": 1, "seq_q": s, "seq_kv": s, "heads_q": 8, "heads_kv": 8, "head_dim_qk": 64,
             "head_dim_v": 64, "causal": c, "window_left": -1, "window_right": -1}
            for s in (2048, 8192, 32768) for c in (False, True)]
    runs = [synthetic_run(rng, cfg, cp, rate, link, 0.03) for cfg in cfgs for cp in (1, 2, 4, 8, 16)]
    cal = model.calibrate(runs, [{"points": pts, "where": "synthetic"}])
    got = cal["rates"]["cuda/bf16/d64/fwd"]
    check("rate within 3%", abs(got / rate - 1) < 0.03, f"{got:.3g} vs {rate:.3g}")
    with open(os.devnull, "w") as null:
        rows, bad = model.validate(runs, cal, 0.15, out=null)
    errs = sorted(abs(r[-1]) for r in rows)
    check("every synthetic run within 15%", bad == 0 and len(rows) == len(runs),
          f"median {errs[len(errs) // 2] * 100:.1f}%, max {errs[-1] * 100:.1f}%")
    skewed = dict(cal, rates={k: v * 2 for k, v in cal["rates"].items()})
    with open(os.devnull, "w") as null:
        _, bad2 = model.validate(runs, skewed, 0.15, out=null)
    check("a wrong rate is caught", bad2 > 0, f"{bad2} runs off")

    print("the layer's GEMM rate")
    gemm_rate = 9e11
    layer_runs = []
    for tp in (2, 4):
        cfg = dict(cfgs[0], d_model=4096)  # GEMMs a large part of the time
        F = model.flops(cfg) / tp
        t, _, _ = model.predict(cfg, tp, 1, rate, link, "bf16", F=F)
        g, ar = model.layer_terms(cfg, tp, 1, link)
        per = [{"rank": i, "host": "h", "threads": 1, "cpuset": None, "fwd_flops_computed": F,
                "fwd_compute_s": 0} for i in range(tp)]
        layer_runs.append({"tool": "attnrun", "backend": "cuda", "dtype": "bf16", "mode": "tp layer",
                           "ranks": tp, "tp": tp, "cp": 1, "config": dict(cfg, bwd=False),
                           "time_s": (t + g / gemm_rate + ar) * (1 + rng.uniform(-0.02, 0.02)), "per_rank": per})
    cal2 = model.calibrate(runs + layer_runs, [{"points": pts, "where": "synthetic"}])
    got = cal2["rates"].get("cuda/gemm/fwd", 0)
    check("GEMM rate within 10%", abs(got / gemm_rate - 1) < 0.1, f"{got:.3g} vs {gemm_rate:.3g}")
    check("attention rate unmoved by layer runs", cal2["rates"]["cuda/bf16/d64/fwd"] == cal["rates"]["cuda/bf16/d64/fwd"])

    print("limits")
    cfg = cfgs[2]
    t, c, comm = model.predict(cfg, 1, 8, rate, {"alpha_s": 0.0, "beta_Bps": 1e15}, "bf16")
    check("compute-bound: T = F / (P rate)", abs(t / (model.flops(cfg) / (8 * rate)) - 1) < 1e-9)
    slow = {"alpha_s": 1e-3, "beta_Bps": 1e6}
    t, c, comm = model.predict(cfg, 1, 8, rate, slow, "bf16")
    check("comm-bound: T = c + 7 (alpha + b / beta)", abs(t - (c + 7 * comm)) < 1e-12 and comm > c)
    tb, _, _ = model.predict(cfg, 1, 8, rate, slow, "bf16", backward=True)
    check("backward: gradients travel too, one hop more", tb > t)

    print("split-kv and kernel regimes")
    dec = dict(cfg, seq_q=1, seq_kv=1 << 16, heads_q=32, heads_kv=8, head_dim_qk=128, head_dim_v=128)
    t, c, comm = model.predict(dec, 1, 8, rate, slow, "bf16", split=True)
    want = 7 * (slow["alpha_s"] + 1 * 1 * 32 * 130 * 4 / slow["beta_Bps"])
    check("split-kv forward: compute, then an allgather of the states", abs(comm - want) < 1e-12
          and abs(t - (c + comm)) < 1e-12 and abs(c - model.flops(dec) / (8 * rate)) < 1e-15)
    _, _, cb = model.predict(dec, 1, 8, rate, slow, "bf16", backward=True, split=True)
    check("split-kv backward: an allreduce of dQ", abs(cb - 14 * (1e-3 + 32 * 128 * 4 / (8 * 1e6))) < 1e-12)
    check("regimes by lanes", model.row_class(1, 4) == "/lanes<=16" and model.row_class(8, 4) == "/lanes<128"
          and model.row_class(64, 4) == "" and model.row_class(None) == "")
    recs = []
    for rows, r_true in ((1, 2e10), (8, 8e10), (512, 3e11)):
        F = 1e9
        recs.append({"tool": "attnrun", "backend": "cpu", "dtype": "f32", "mode": "single", "ranks": 1,
                     "tp": 1, "cp": 1, "config": dict(dec, seq_q=rows, bwd=False), "time_s": F / r_true,
                     "per_rank": [{"host": "h", "cpuset": "0", "threads": 1, "q_rows": rows,
                                   "fwd_flops_computed": F, "fwd_compute_s": F / r_true}]})
    cal = model.calibrate(recs, [])
    got = [cal["rates"].get(f"cpu/f32/d128/fwd{k}") for k in ("/lanes<=16", "/lanes<128", "")]
    check("a rate per regime", got == [2e10, 8e10, 3e11], f"{got}")

    print("rank shares")
    r = {"backend": "cpu", "per_rank": [{"host": "h", "cpuset": "0", "threads": 1}, {"host": "h", "cpuset": "1", "threads": 1},
                                        {"host": "h", "cpuset": "0", "threads": 1}, {"host": "h", "cpuset": "1", "threads": 1}]}
    check("4 ranks on 2 cores: half a core each", model.units(r, r["per_rank"][0]) == 0.5)
    r1 = {"backend": "cpu", "per_rank": [{"host": "h", "cpuset": "0-3", "threads": 4}]}
    check("1 rank on 4 cores, 4 threads: 4", model.units(r1, r1["per_rank"][0]) == 4)
    check("sizes", model.sizes("4K") == 4096 and model.sizes("1M") == 1 << 20 and model.sizes("100") == 100)
    if FAILS:
        print(f"test_model: {len(FAILS)} failed: {FAILS}")
        return 1
    print("test_model: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
