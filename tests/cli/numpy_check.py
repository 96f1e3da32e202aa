#!/usr/bin/env python3
"""numpy_check.py — CLI test independent of the C code: numpy writes the inputs, attnrun
--load/--save runs them, and a float64 numpy attention checks o.npy and lse.npy. Checks
both directions of the .npy format. Exits 77 (skipped) when numpy is not installed.

usage: numpy_check.py ATTNRUN WORKDIR
"""
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipped (pip install numpy)")
    sys.exit(77)


def reference(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, sinks=None,
              alibi=None, cu_q=None, cu_kv=None):
    """Float64 attention by DESIGN.md §2: o [B,Sq,Hq,Dv], lse [B,Hq,Sq]."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, Sq, Hq, _ = q.shape
    Skv, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    if cu_q is None:
        cu_q, cu_kv = np.array([0, Sq]), np.array([0, Skv])
    o = np.zeros((B, Sq, Hq, Dv))
    lse = np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            for n in range(len(cu_q) - 1):
                q0, q1, k0, k1 = cu_q[n], cu_q[n + 1], cu_kv[n], cu_kv[n + 1]
                i = np.arange(q1 - q0)[:, None]
                j = np.arange(k1 - k0)[None, :]
                off = (k1 - k0) - (q1 - q0)
                s = scale * q[b, q0:q1, h] @ k[b, k0:k1, kh].T
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if alibi is not None:
                    s = s - alibi[h] * np.abs(i + off - j)
                ok = np.ones(s.shape, bool)
                if causal:
                    ok &= j <= i + off
                if window[0] >= 0:
                    ok &= j >= i + off - window[0]
                if window[1] >= 0:
                    ok &= j <= i + off + window[1]
                s = np.where(ok, s, -np.inf)
                m = s.max(axis=1, initial=-np.inf, keepdims=True)
                if sinks is not None:
                    m = np.maximum(m, sinks[h])
                m_safe = np.where(np.isfinite(m), m, 0.0)
                p = np.exp(s - m_safe)
                den = p.sum(axis=1, keepdims=True)
                if sinks is not None:
                    den = den + np.exp(sinks[h] - m_safe)
                with np.errstate(divide="ignore", invalid="ignore"):
                    o[b, q0:q1, h] = np.where(den > 0, (p @ v[b, k0:k1, kh]) / den, 0.0)
                    lse[b, h, q0:q1] = np.where(den[:, 0] > 0,
                                                m_safe[:, 0] + np.log(den[:, 0]), -np.inf)
    return o, lse


def rel_err(got, ref):
    fin = np.isfinite(ref)
    same_inf = (~fin) & (got == ref)
    if np.any(~fin & ~same_inf):
        return np.inf
    scale = max(np.abs(ref[fin]).max(initial=0.0), 1e-30)
    return np.abs(got[fin].astype(np.float64) - ref[fin]).max(initial=0.0) / scale


def run_case(attnrun, work, name, shapes, flags, ref_kwargs, extras):
    rng = np.random.default_rng(sum(map(ord, name)))
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "in"))
    (B, Sq, Skv, Hq, Hkv, D, Dv) = shapes
    q = rng.standard_normal((B, Sq, Hq, D), dtype=np.float32)
    k = rng.standard_normal((B, Skv, Hkv, D), dtype=np.float32)
    v = rng.standard_normal((B, Skv, Hkv, Dv), dtype=np.float32)
    for fname, arr in [("q", q), ("k", k), ("v", v)] + list(extras.items()):
        np.save(os.path.join(d, "in", fname + ".npy"), arr)
    cmd = [attnrun, "--backend", "cpu", "--load", os.path.join(d, "in"),
           "--save", os.path.join(d, "out"), "--iters", "1", "--warmup", "0"] + flags
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    print(" ".join(cmd), "\n", res.stdout, res.stderr)
    if res.returncode != 0:
        print(f"{name}: attnrun exited {res.returncode}")
        return False
    o = np.load(os.path.join(d, "out", "o.npy"))
    lse = np.load(os.path.join(d, "out", "lse.npy"))
    kw = dict(ref_kwargs)
    for key in ("sinks", "alibi", "cu_q", "cu_kv"):
        src = {"cu_q": "cu_seqlens_q", "cu_kv": "cu_seqlens_kv"}.get(key, key)
        if src in extras:
            kw[key] = extras[src].astype(np.float64) if key in ("sinks", "alibi") else extras[src]
    ro, rl = reference(q, k, v, kw.pop("scale", 1.0 / np.sqrt(D)), **kw)
    eo, el = rel_err(o, ro), rel_err(lse, rl)
    ok = o.dtype == np.float32 and o.shape == ro.shape and lse.shape == rl.shape \
        and eo <= 2e-5 and el <= 2e-5
    print(f"{name}: O rel err {eo:.3e}, LSE rel err {el:.3e}: {'ok' if ok else 'FAILED'}")
    return ok


def bad_file_case(attnrun, work, name, arrays, expect):
    """attnrun --load of files numpy wrote but attnrun must refuse: exit 1 and a message."""
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for fname, arr in arrays.items():
        np.save(os.path.join(d, fname + ".npy"), arr)
    res = subprocess.run([attnrun, "--load", d, "--iters", "1", "--warmup", "0"],
                         capture_output=True, text=True, timeout=60)
    ok = res.returncode == 1 and expect in res.stderr
    verdict = "ok" if ok else "FAILED"
    print(f"{name}: exit {res.returncode}, stderr {res.stderr.strip()!r}: {verdict}")
    return ok


def bad_file_cases(attnrun, work):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 8, 2, 16), dtype=np.float32)
    good = {"q": q, "k": q, "v": q}
    return all([
        bad_file_case(attnrun, work, "bad_float64", dict(good, q=q.astype(np.float64)),
                      "dtype '<f8'"),
        bad_file_case(attnrun, work, "bad_fortran", dict(good, k=np.asfortranarray(q)),
                      "Fortran-order"),
        bad_file_case(attnrun, work, "bad_rank", dict(good, v=q[0]), "expected 4 dims"),
        bad_file_case(attnrun, work, "bad_heads",
                      dict(good, k=q[:, :, :1].repeat(3, axis=2), v=q[:, :, :1].repeat(3, axis=2)),
                      "not a multiple"),
        bad_file_case(attnrun, work, "bad_sinks", dict(good, sinks=np.zeros(3, np.float32)),
                      "expected [2]"),
    ])


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    attnrun, work = sys.argv[1], sys.argv[2]
    hq = 4
    slopes = (2.0 ** (-8.0 * (np.arange(hq) + 1) / hq)).astype(np.float32)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32)
    cases = [
        ("plain", (2, 37, 53, 4, 2, 24, 16), [], {}, {}),
        ("causal_window_softcap", (1, 70, 50, 4, 1, 32, 32),
         ["--causal", "--window", "16,4", "--softcap", "5"],
         {"causal": True, "window": (16, 4), "softcap": 5.0}, {}),
        ("sinks_alibi_scale", (1, 33, 33, 4, 4, 16, 8), ["--scale", "0.3"],
         {"scale": np.float32(0.3)}, {"sinks": sinks, "alibi": slopes}),
        ("varlen_causal", (1, 60, 60, 4, 2, 16, 16), ["--causal"], {"causal": True},
         {"cu_seqlens_q": np.array([0, 10, 11, 60], np.int32),
          "cu_seqlens_kv": np.array([0, 10, 11, 60], np.int32)}),
    ]
    ok = all([run_case(attnrun, work, *c) for c in cases])
    ok = bad_file_cases(attnrun, work) and ok
    print("numpy check:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
