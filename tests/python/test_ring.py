"""test_ring.py — the Python binding's ring and split-KV attention (attnrun.Group over an
mpi4py communicator) against the float64 NumPy reference of the whole sequence: each rank
checks its own rows of O, LSE, dQ, dK, dV and the summed d(sinks), for both CP layouts and
several masks (split-KV: every rank holds all query rows). Run under mpiexec:
    mpiexec -n 2 python3 tests/python/test_ring.py [cpu|cuda]
Exit 0: passed on every rank; 1: failed; 77: skipped (no NumPy / mpi4py, or no device)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_case import COMM, RANK, SIZE, attnrun, np, start, verdict  # noqa: E402  (exits 77 first)
import ref_numpy as ref  # noqa: E402
from test_binding import rel_err  # noqa: E402

TOL = {"o": 2e-5, "lse": 2e-5, "dq": 1e-4, "dk": 1e-4, "dv": 1e-4, "dsinks": 1e-4}
# float16 storage on the cpu backend: float32 arithmetic, O rounded once (2^-12 relative);
# on a CUDA context the kernels round P and dS too
TOL_F16 = {"o": 5e-4, "lse": 2e-5, "dq": 1e-3, "dk": 1e-3, "dv": 1e-4}


def rows(layout, seq):
    """This rank's global rows, in local order."""
    return np.concatenate([np.arange(s, s + n) for s, n in attnrun.cp_shard_rows(layout, SIZE, RANK, seq)])


def case(grp, rng, layout, B=1, Sq=61, Skv=61, Hq=4, Hkv=2, D=16, dtype=np.float32, split=False,
         **spec):
    if spec.pop("sinks", False):
        spec["sinks"] = rng.standard_normal(Hq).astype(np.float32)
    q, k, v, do = (rng.standard_normal(s).astype(dtype) for s in
                   ((B, Sq, Hq, D), (B, Skv, Hkv, D), (B, Skv, Hkv, D), (B, Sq, Hq, D)))
    rq, rk = np.arange(Sq) if split else rows(layout, Sq), rows(layout, Skv)
    lq, lk, lv, ldo = (np.ascontiguousarray(x[:, r]) for x, r in ((q, rq), (k, rk), (v, rk), (do, rq)))
    fwd, bwd = (grp.split_kv_forward, grp.split_kv_backward) if split else (grp.ring_forward, grp.ring_backward)
    o, lse = fwd(lq, lk, lv, Sq, Skv, layout=layout, **spec)
    dq, dk, dv, ds = bwd(lq, lk, lv, o, lse, ldo, Sq, Skv, layout=layout, **spec)
    q, k, v, do = (x.astype(np.float32) for x in (q, k, v, do))  # the reference's view of them
    ro, rlse = ref.forward(q, k, v, **spec)
    rdq, rdk, rdv, rds = ref.backward(q, k, v, do, **spec)
    errs = {"o": rel_err(o, ro[:, rq]), "lse": rel_err(lse, rlse[:, :, rq]),
            "dq": rel_err(dq, rdq[:, rq]), "dk": rel_err(dk, rdk[:, rk]), "dv": rel_err(dv, rdv[:, rk])}
    if rds is not None:
        errs["dsinks"] = rel_err(ds, rds)
    tol = TOL if dtype == np.float32 else TOL_F16
    bad = [n for n, e in errs.items() if not e <= tol[n]]
    if o.dtype != dtype:
        bad.append(f"o dtype {o.dtype}")
    name = (("split-kv " if split else "") + f"{layout} {','.join(sorted(spec)) or 'plain'} {Sq}x{Skv}"
            + ("" if dtype == np.float32 else " float16"))
    print(f"rank {RANK}: {'ok ' if not bad else 'BAD'} {name}: "
          + " ".join(f"{n} {e:.1e}" for n, e in errs.items()), flush=True)
    return bad


def main():
    ctx, rng = start("test_ring")  # the same global problem on every rank
    grp = attnrun.Group(ctx, COMM, tp=1, timeout_s=60)
    bad = []
    for layout in ("zigzag", "contiguous"):
        bad += case(grp, rng, layout)
        bad += case(grp, rng, layout, causal=True, sinks=True)
        bad += case(grp, rng, layout, Sq=40, Skv=72, causal=True, window=(11, 0))
        bad += case(grp, rng, layout, softcap=2.5, alibi_slopes=np.array([0.5, 0.25, 0.1, 0.05], np.float32))
        if ctx.device == 0:
            bad += case(grp, rng, layout, Sq=70, Skv=70, causal=True, window=(20, 0), dtype=np.float16)
        bad += case(grp, rng, layout, Sq=1, Skv=97, split=True, causal=True, sinks=True)
        bad += case(grp, rng, layout, Sq=5, Skv=64, Hkv=1, split=True, causal=True, window=(30, 0),
                    softcap=2.5)
    grp.close()
    return verdict("test_ring", ctx, bad)


if __name__ == "__main__":
    sys.exit(main())
