"""test_sdpa_bench.py — bench/gpu/sdpa_bench.py, the GPU benchmark's torch side, before a
GPU session depends on it: `compare` on synthetic records (ratios to the best torch
backend, deterministic and TMA-dQ rows against their own atomic-dQ rows, error rows, the
decode table, the targets and experiments at a glance, bench_roofline's table), and, where torch is importable, `run` and `decode` on the host (--device cpu, the math and CPU flash
backends: the same code path as on a GPU but for the timer) feeding `compare`.

    python3 tests/python/test_sdpa_bench.py
Exit 0: passed; 1: failed."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gpu",
                      "sdpa_bench.py")
FAILS = []


def check(what, ok):
    print(f"  {'ok ' if ok else 'BAD'} {what}")
    if not ok:
        FAILS.append(what)


def sdpa(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
    return p


def rec(impl, pas, hd, n, causal, tflops=None, **extra):
    r = {"impl": impl, "pass": pas, "hd": hd, "N": n, "causal": causal, "device": "Test GPU"}
    if tflops is not None:
        r["tflops"] = tflops
    r.update(extra)
    return r


def compare_records(tmp, name, recs, what):
    """compare --md on recs written to tmp/name.jsonl: the markdown text, or None (after a
    failed check) when compare did not exit 0."""
    path, md = os.path.join(tmp, f"{name}.jsonl"), os.path.join(tmp, f"{name}.md")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    p = sdpa("compare", path, "--md", md)
    check(f"compare {what}exits 0", p.returncode == 0)
    return open(md).read() if p.returncode == 0 else None


def table(md):
    """{(label, hd, N, causal): [cells]} of compare's markdown table."""
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 11 and cells[0] not in ("pass", "---"):
            rows[(cells[0], cells[1], cells[2], cells[3])] = cells[4:]
    return rows


def compare_synthetic(tmp):
    print("compare on synthetic records")
    recs = [rec("attnrun", "fwd", 128, 8192, 0, 400.0, check="ok", ms_median=10.0),
            rec("attnrun-mma4", "fwd", 128, 8192, 0, 480.0, check="ok"),
            rec("attnrun-mma2c", "fwd", 128, 8192, 0, 540.0, check="ok", ms_median=8.0),
            rec("attnrun-mma4x32", "fwd", 128, 8192, 0, 450.0, check="ok"),
            rec("attnrun-mma4s", "fwd", 128, 8192, 0, 420.0, check="ok"),
            rec("attnrun-sm90", "fwd", 128, 8192, 0, 660.0, check="ok"),
            rec("torch-flash", "fwd", 128, 8192, 0, 500.0),
            rec("torch-cudnn", "fwd", 128, 8192, 0, 600.0),
            rec("attnrun", "bwd", 64, 4096, 1, 150.0, check="ok"),
            rec("attnrun-mma4s", "bwd", 64, 4096, 1, 180.0, check="ok"),
            rec("attnrun-sm90", "bwd", 64, 4096, 1, 240.0, check="ok"),
            rec("torch-flash", "bwd", 64, 4096, 1, 300.0),
            rec("torch-cudnn", "bwd", 64, 4096, 1, error="no kernel for this shape"),
            rec("attnrun", "bwd", 64, 4096, 1, 120.0, deterministic=True, check="ok"),
            rec("attnrun-sm90", "bwd", 64, 4096, 1, 180.0, deterministic=True, check="ok"),
            rec("attnrun-sm90-dqatomic", "bwd", 64, 4096, 1, 216.0, check="ok"),
            dict(rec("attnrun-sm90", "bwd", 128, 8192, 0, 200.0, check="ok"), ablate=0, ms_median=14.0),
            dict(rec("attnrun-sm90-ab3", "bwd", 128, 8192, 0, 250.0, check="ablated"), ablate=3, ms_median=10.5),
            dict(rec("attnrun-sm90", "fwd", 128, 8192, 0, 999.0, check="ok"), ablate=3),
            dict(rec("attnrun-mma-ab0", "fwd", 128, 8192, 0, 410.0, check="ok"), mma_ablate=0, ms_median=8.0),
            dict(rec("attnrun-mma-ab20", "fwd", 128, 8192, 0, 800.0, check="ablated"), mma_ablate=20, ms_median=2.0),
            dict(rec("attnrun", "fwd", 128, 8192, 1, 777.0, check="ok"), mma_ablate=20, ms_median=3.0),
            rec("attnrun", "fwd", 192, 2048, 1, 100.0, hd_v=128, check="ok"),
            # d = 128, N >= 8K backward rows: the targets table's
            rec("attnrun", "bwd", 128, 16384, 1, 110.0, check="ok", ms_median=20.0),
            rec("attnrun-sm90", "bwd", 128, 16384, 1, 220.0, check="ok", ms_median=10.0),
            rec("torch-cudnn", "bwd", 128, 16384, 1, 550.0)]
    text = compare_records(tmp, "syn", recs, "")
    if text is None:
        return
    t = table(text)
    fwd = t.get(("fwd", "128", "8192", "no"))
    check("fwd row: attnrun / best torch = 400/600, sm90 660/600, 4-warp mma 480",
          fwd is not None and fwd[5] == "0.67" and fwd[6] == "1.10" and fwd[0] == "400.0"
          and fwd[1] == "480.0" and fwd[7] == "ok/ok/ok")
    # the experiments' rows: (label, hd, N, causal), TFLOP/s, of best torch, of the default
    for key, tf, best, base in ((("fwd mma 2-CTA", "128", "8192", "no"), "540.0", "0.90", "1.35"),
                                (("fwd mma 4x32", "128", "8192", "no"), "450.0", "0.75", "1.12"),
                                (("fwd mma 4-stage", "128", "8192", "no"), "420.0", "0.70", "1.05"),
                                (("bwd mma 4-stage", "64", "4096", "yes"), "180.0", "0.60", "1.20")):
        r = t.get(key)
        check(f"{key[0]} row at d={key[1]} N={key[2]}: {tf}, {best} of best torch, {base} of the default kernel",
              r is not None and r[0] == tf and r[5] == best and r[6] == f"{base} of 8-warp" and r[7] == "ok")
    bwd = t.get(("bwd", "64", "4096", "yes"))
    check("bwd row: cuDNN error shown, ratio to flash 150/300",
          bwd is not None and bwd[4] == "error" and bwd[5] == "0.50" and bwd[6] == "0.80")
    det = t.get(("bwd deterministic", "64", "4096", "yes"))
    det90 = t.get(("bwd deterministic (sm90)", "64", "4096", "yes"))
    check("deterministic rows against their own atomic rows (120/150, 180/240)",
          det is not None and "0.80 of atomic dQ" in det[5] and
          det90 is not None and "0.75 of atomic dQ" in det90[5])
    atom = t.get(("bwd sm90 dQ by atomics", "64", "4096", "yes"))
    check("atomic dQ row against the sm90 default (216/240)", atom is not None and "0.90 of TMA dQ" in atom[6])
    check("an ablation run's records stay out of the main table (sm90 fwd 660, not 999)",
          fwd is not None and fwd[2] == "660.0")
    abl = [l for l in text.splitlines() if l.startswith("| 128 | 8192 | no | dQ adds + dQ GEMM (3)")]
    check("ablation row: 10.5 ms, 3.5 saved, 0.25 of the full kernel's 14",
          len(abl) == 1 and "| 10.500 | 3.500 | 0.25 |" in abl[0])
    check("an mma ablation run's records stay out of the main table (attnrun fwd 400, not 410)",
          fwd is not None and fwd[0] == "400.0")
    mab = [l for l in text.splitlines() if l.startswith("| 128 | 8192 | no | QK^T MMAs + PV MMAs (20)")]
    check("mma ablation row: 2 ms, 6 saved, 0.75 of mask 0's 8",
          len(mab) == 1 and "| 2.000 | 6.000 | 0.75 |" in mab[0])
    check("mma ablation table: only the ablation kernel's rows (the causal default-kernel row left out)",
          not any(l.startswith("| 128 | 8192 | yes | QK^T") for l in text.splitlines()))
    check("mma ablation table names the default kernel's time of the main run (10 ms)",
          "flash_fwd) at d=128 N=8192 not causal in the main run: 10.000 ms" in text)
    check("Dqk != Dv row labelled 192x128", ("fwd", "192x128", "2048", "yes") in t)
    lines = text.splitlines()
    # the targets at a glance: d = 128, N >= 8K only (the d = 64 N = 4096 rows left out)
    for want in ("| fwd | mma.sync 8-warp (default) | 1 | 0.67 | 0.67 | 0.6 | yes |",
                 "| fwd | mma.sync 2-CTA | 1 | 0.90 | 0.90 | 0.6 | yes |",
                 "| fwd | sm90 | 1 | 1.10 | 1.10 | 1.0 | yes |",
                 "| bwd | mma.sync (default) | 1 | 0.20 | 0.20 | 0.5 | no |",
                 "| bwd | sm90 | 1 | 0.40 | 0.40 | 1.0 | no |"):
        check(f"targets row {want}", want in lines)
    check("no targets row for a kernel without d = 128 N >= 8K records (the mma 4-stage backward)",
          not any(l.startswith("| bwd | mma.sync 4-stage") for l in lines))
    # the experiments against their defaults, by median times
    check("experiment row: 2-CTA forward 10 ms -> 8 ms, 1.25x",
          "| fwd | attnrun-mma2c | attnrun | 1 | 1.25 | 1.25 | 1.25 |" in lines)
    check("experiment row: sm90 backward 20 ms -> 10 ms, 2.00x",
          "| bwd | attnrun-sm90 | attnrun | 1 | 2.00 | 2.00 | 2.00 |" in lines)
    check("the device is named", "Test GPU" in text)


def decode_rows(md):
    """{(B, Hq, Hkv, Sq, Skv): [cells]} of compare's decode table."""
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 19 and cells[0].isdigit():
            rows[tuple(cells[:5])] = cells[5:]
    return rows


def compare_decode(tmp):
    print("compare on synthetic decode records")
    base = {"mode": "decode", "pass": "fwd", "hd": 128, "B": 1, "Hq": 32, "Hkv": 8, "Sq": 1,
            "Skv": 32768, "device": "Test GPU"}
    recs = [dict(base, impl="attnrun", ms_median=0.05, kv_gbps=2700.0, copy_read_gbps=3000.0,
                 pack=4, nsplit=29, check="ok"),
            dict(base, impl="attnrun-plain", ms_median=0.4, pack=1, nsplit=1, path="sm90", check="ok"),
            dict(base, impl="attnrun-paged16", ms_median=0.055, pack=4, nsplit=29, check="ok"),
            dict(base, impl="attnrun-4s", ms_median=0.045, pack=4, nsplit=29, check="ok"),
            dict(base, impl="attnrun-ks", ms_median=0.025, pack=4, nsplit=29, check="ok"),
            dict(base, impl="attnrun-plain-ks", ms_median=0.1, pack=1, nsplit=1, path="mma", check="ok"),
            dict(base, impl="torch-flash", ms_median=0.06),
            dict(base, impl="torch-efficient", ms_median=0.08),
            dict(base, impl="torch-cudnn", error="no kernel"),
            dict(base, impl="torch-flash", B=8, ms_median=0.3),
            rec("attnrun", "fwd", 128, 8192, 0, 400.0, check="ok")]
    text = compare_records(tmp, "dec", recs, "with decode records ")
    if text is None:
        return
    d = decode_rows(text)
    row = d.get(("1", "32", "8", "1", "32768"))
    check("decode row: ours 0.0500 ms, plan 4 x 29, plain 0.4000 on sm90, paged 0.0550, 4-stage 0.0450, "
          "key-split 0.0250, cuDNN error, best torch 0.06/0.05",
          row is not None and row[0] == "0.0500" and row[1] == "4 x 29" and row[2] == "0.4000 sm90"
          and row[3] == "0.0550" and row[4] == "0.0450" and row[5] == "0.0250" and row[8] == "error"
          and row[10] == "1.20" and row[11] == "2700" and row[12] == "0.90" and row[13] == "ok")
    other = d.get(("8", "32", "8", "1", "32768"))
    check("a shape with torch alone has no ratio", other is not None and other[0] == "-" and other[10] == "-")
    check("the prefill table is still there", ("fwd", "128", "8192", "no") in table(text))
    check("decode experiment row: 4-stage 0.05 -> 0.045 ms, 1.11x",
          "| decode | attnrun-4s | attnrun | 1 | 1.11 | 1.11 | 1.11 |" in text.splitlines())
    check("decode experiment row: key-split 0.05 -> 0.025 ms, 2.00x",
          "| decode | attnrun-ks | attnrun | 1 | 2.00 | 2.00 | 2.00 |" in text.splitlines())
    check("decode experiment row: the plain form on the key-split kernel 0.4 -> 0.1 ms, 4.00x",
          "| decode | attnrun-plain-ks | attnrun-plain | 1 | 4.00 | 4.00 | 4.00 |" in text.splitlines())


def compare_roofline(tmp):
    print("compare on synthetic roofline records")
    base = {"mode": "roofline", "device": "Roof GPU", "sm_mhz": 1755, "git": "x", "date": "d"}
    recs = [dict(base, test="mma", label="mma.sync bf16, 8 warps/SM, 8 chains/warp", value=2048.0,
                 unit="FLOP/clk/SM", ms_median=1.5, tflops=474.4, cycles_per_mma_warp=16.0),
            dict(base, test="ldsm", label="ldmatrix.x4 + 2 mma/load, 8 warps/SM", value=96.0,
                 unit="B/clk/SM", ms_median=2.25, flop_per_clk_sm=1536.0, tflops=355.8),
            dict(base, test="stream", label="cp.async, 2 buffers, 132 CTAs", value=2500.0, unit="GB/s",
                 ms_median=0.5, gbps_per_cta=18.94, vs_copy=0.81),
            rec("attnrun", "fwd", 128, 8192, 0, 400.0, check="ok")]
    text = compare_records(tmp, "roof", recs, "with roofline records ")
    if text is None:
        return
    lines = text.splitlines()
    check("roofline section names the device", any("bench_roofline" in l and "Roof GPU" in l for l in lines))
    check("mma row: value, unit, TFLOP/s and clk a warp, ms, MHz",
          "| mma | mma.sync bf16, 8 warps/SM, 8 chains/warp | 2048 | FLOP/clk/SM | 474.4 TFLOP/s, "
          "16.00 clk/mma a warp | 1.500 | 1755 |" in lines)
    check("ldsm row: the MMAs' FLOP/clk/SM beside the bytes",
          "| ldsm | ldmatrix.x4 + 2 mma/load, 8 warps/SM | 96 | B/clk/SM | 355.8 TFLOP/s, 1536 FLOP/clk/SM | "
          "2.250 | 1755 |" in lines)
    check("stream row: a CTA's rate and the copy ratio",
          "| stream | cp.async, 2 buffers, 132 CTAs | 2500 | GB/s | 18.94 GB/s a CTA, 0.81 of copy | 0.500 | 1755 |"
          in lines)
    check("the prefill table is still there", ("fwd", "128", "8192", "no") in table("\n".join(lines)))


def decode_on_host(tmp):
    try:
        import torch  # noqa: F401
    except Exception as e:
        print(f"decode on the host: import torch failed ({e}), skipped")
        return
    print("decode on the host (torch math backend)")
    path = os.path.join(tmp, "decode.jsonl")
    p = sdpa("decode", "--device", "cpu", "--backends", "math", "--shapes", "1/4/2/256,2/4/4/128",
             "--hd", "32", "--reps", "1", "--warmup", "0", "--json", path)
    check("decode exits 0", p.returncode == 0)
    if p.returncode:
        return
    recs = [json.loads(x) for x in open(path)]
    check(f"2 decode records (got {len(recs)})", len(recs) == 2 and all(r["mode"] == "decode" for r in recs))
    check("every decode record timed", all(r.get("ms_median", 0) > 0 and r["kv_gbps"] > 0 for r in recs))


def run_on_host(tmp):
    try:
        import torch  # noqa: F401
    except Exception as e:
        print(f"run on the host: import torch failed ({e}), skipped")
        return
    print("run on the host (torch math and CPU flash backends)")
    path = os.path.join(tmp, "run.jsonl")
    p = sdpa("run", "--device", "cpu", "--backends", "math,flash", "--n", "128,256", "--hd", "32",
             "--tokens", "256", "--model-dim", "64", "--reps", "1", "--warmup", "0", "--json", path)
    check("run exits 0", p.returncode == 0)
    if p.returncode:
        return
    recs = [json.loads(x) for x in open(path)]
    # 2 N x 2 causal x 2 backends x fwd/bwd
    check(f"16 records (got {len(recs)})", len(recs) == 16)
    check("every record timed", all("tflops" in r and r["ms_median"] > 0 for r in recs))
    check("B = tokens / N, H = d_model / hd",
          all(r["B"] == 256 // r["N"] and r["H"] == 2 for r in recs))
    with open(path, "a") as f:  # an attnrun row next to them
        f.write(json.dumps(rec("attnrun", "fwd", 32, 256, 1, 1.0)) + "\n")
    p = sdpa("compare", path)
    check("compare of the run exits 0", p.returncode == 0)
    ratio = [l for l in p.stdout.splitlines() if l.startswith("| fwd | 32 | 256 | yes |")]
    check("the attnrun row has a ratio", len(ratio) == 1 and ratio[0].split("|")[9].strip() != "-")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        compare_synthetic(tmp)
        compare_decode(tmp)
        compare_roofline(tmp)
        run_on_host(tmp)
        decode_on_host(tmp)
    if FAILS:
        print(f"test_sdpa_bench: {len(FAILS)} failed: {FAILS}")
        return 1
    print("test_sdpa_bench: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
