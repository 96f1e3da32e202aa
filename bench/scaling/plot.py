#!/usr/bin/env python3
"""plot.py — charts of a scaling study's JSON lines (sweep.py / attnrun --json) with the
cost model beside the measurements (model.py): for each pass and mode, time against ranks
(one line a sequence length, measured as points, the model as dashed lines) and parallel
efficiency (T_1 / (P * T_P)); optional projection curves over a link (--project).

    python3 bench/scaling/plot.py RECORDS.jsonl... -o bench/results/scaling.svg
        [--project nvlink --rate-tflops 400 --seq 1M --ranks-to 1024 ...]
Writes PNG or SVG by the file's extension. Needs matplotlib (Debian: python3-matplotlib);
exit 77 without it, 2 on bad arguments or records with no runs."""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model  # noqa: E402

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("plot.py: matplotlib is not installed (apt-get install python3-matplotlib), skipped")
    sys.exit(77)


def series(runs, cal):
    """{(pass, mode): {seq: [(ranks, measured_s, model_s)]}}; 1-rank runs join every mode."""
    out = {}
    for r in runs:
        for ps in model.passes(r):
            t = r["time_s"] if ps == "fwd" else r.get("bwd_time_s")
            m = model.predict_run(r, cal, ps)
            modes = ["ring", "tp"] if r["ranks"] == 1 else [r["mode"]]
            for mode in modes:
                out.setdefault((ps, mode), {}).setdefault(r["config"]["seq_q"], []).append((r["ranks"], t, m))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--project", choices=sorted(model.LINKS), help="also draw the model over this link")
    ap.add_argument("--rate-tflops", type=float, help="kernel rate a rank for --project")
    ap.add_argument("--seq", default="1M", help="sequence of the projection")
    ap.add_argument("--ranks-to", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    a = ap.parse_args(argv)
    runs, probes = model.load(a.records)
    if not runs:
        print("plot.py: no attnrun records in the files", file=sys.stderr)
        return 2
    cal = model.calibrate(runs, probes)
    data = series(runs, cal)
    keys = sorted(data)
    ncol = len(keys) + (1 if a.project else 0)
    fig, axes = plt.subplots(2, ncol, figsize=(4.2 * ncol, 7), squeeze=False)
    for col, (ps, mode) in enumerate(keys):
        top, bot = axes[0][col], axes[1][col]
        for seq, pts in sorted(data[(ps, mode)].items()):
            pts.sort()
            n = [p[0] for p in pts]
            line = top.plot(n, [p[1] * 1e3 for p in pts], "o-", label=f"S={seq}")[0]
            if all(p[2] for p in pts):
                top.plot(n, [p[2] * 1e3 for p in pts], "--", color=line.get_color())
            t1 = next((p[1] for p in pts if p[0] == 1), None)
            if t1:
                bot.plot(n, [t1 / (p[0] * p[1]) for p in pts], "o-", color=line.get_color())
        top.set(title=f"{ps} {mode} (dashed: model)", xlabel="ranks", ylabel="time a call (ms)", xscale="log",
                yscale="log")
        bot.set(xlabel="ranks", ylabel="efficiency T1/(P*TP)", xscale="log", ylim=(0, 1.2))
        top.legend(fontsize=7)
    if a.project:
        link = model.LINKS[a.project]
        rate = (a.rate_tflops * 1e12) if a.rate_tflops else max(cal["rates"].values())
        cfg = {"batch": 1, "seq_q": model.sizes(a.seq), "seq_kv": model.sizes(a.seq), "heads_q": a.heads,
               "heads_kv": a.heads, "head_dim_qk": a.head_dim, "head_dim_v": a.head_dim, "causal": True}
        P = [2 ** i for i in range(0, a.ranks_to.bit_length()) if 2 ** i <= a.ranks_to]
        F = model.flops(cfg)
        times = [model.predict(cfg, 1, p, rate, link, "bf16")[0] for p in P]
        ax, ax2 = axes[0][-1], axes[1][-1]
        ax.plot(P, times, "s--")
        ax.set(title=f"model: ring fwd S={cfg['seq_q']} over {a.project}", xlabel="ranks", ylabel="time (s)",
               xscale="log", yscale="log")
        ax2.plot(P, [F / (p * rate) / t for p, t in zip(P, times)], "s--")
        ax2.set(xlabel="ranks", ylabel="efficiency (model)", xscale="log", ylim=(0, 1.2))
    fig.suptitle(f"attnrun scaling: {len(runs)} runs; link {cal['link']['source'] if cal['link'] else 'none'}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"plot.py: wrote {a.out} ({len(keys)} panels{', + projection' if a.project else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
