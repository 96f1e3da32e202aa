"""test_layer.py — the Python binding's tensor-parallel layer (attnrun.Layer over an mpi4py
communicator) against a float64 NumPy reference of the whole layer: projections, RoPE
(GPT-NeoX half split, global positions), attention (ref_numpy.py), W_o; backward by the
chain rule. Every TP x CP split of the ranks is run (tp = ranks, cp = ranks, and tp = cp = 2
on 4 ranks); each rank checks y and dx of its rows, its shards of dW_qkv and dW_o, and
d(sinks) of its heads (against the size of its terms: a head's sum can cancel, see ref_numpy.sink_terms).
    mpiexec -n 2 python3 tests/python/test_layer.py [cpu|cuda]
Exit 0: passed on every rank; 1: failed; 77: skipped (no NumPy / mpi4py, or no device)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_case import COMM, RANK, SIZE, attnrun, np, start, verdict  # noqa: E402  (exits 77 first)
import ref_numpy as ref  # noqa: E402
from test_binding import rel_err  # noqa: E402

TOL = 1e-4


def rope(x, theta, inverse=False):
    """x [B, S, H, D] rotated by pos * theta^(-2i/D) per half-split pair (positions 0..S-1)."""
    D = x.shape[3]
    half = D // 2
    ang = np.arange(x.shape[1])[:, None] * theta ** (-2.0 * np.arange(half) / D)  # [S, half]
    c, s = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :] * (-1 if inverse else 1)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def layer_ref(x, wq, wk, wv, wo, Hq, Hkv, D, theta, dy, **spec):
    """Forward y and the gradients (dx, dwq, dwk, dwv, dwo, dsinks) of sum(y * dy), and the
    sink_terms that dsinks is judged against (None without sinks)."""
    B, S, _ = x.shape
    q0, k0 = (x @ wq).reshape(B, S, Hq, D), (x @ wk).reshape(B, S, Hkv, D)
    v = (x @ wv).reshape(B, S, Hkv, D)
    q, k = rope(q0, theta), rope(k0, theta)
    o, lse = ref.forward(q, k, v, **spec)
    y = o.reshape(B, S, Hq * D) @ wo
    do = (dy @ wo.T).reshape(B, S, Hq, D)
    dq, dk, dv, dsinks = ref.backward(q, k, v, do, **spec)
    dq0, dk0 = rope(dq, theta, inverse=True), rope(dk, theta, inverse=True)
    flat = lambda t: t.reshape(B * S, -1)  # noqa: E731
    xs = flat(x)
    dwq, dwk, dwv = xs.T @ flat(dq0), xs.T @ flat(dk0), xs.T @ flat(dv)
    dwo = flat(o).T @ flat(dy)
    dx = (flat(dq0) @ wq.T + flat(dk0) @ wk.T + flat(dv) @ wv.T).reshape(x.shape)
    terms = ref.sink_terms(o, lse, do, spec["sinks"]) if dsinks is not None else None
    return y, dx, dwq, dwk, dwv, dwo, dsinks, terms


def run(ctx, rng, tp, cp, layout="zigzag", B=2, S=48, d_model=40, Hq=4, Hkv=2, D=16,
        theta=10000.0, attention_dtype=None, **spec):
    grp = attnrun.Group(ctx, COMM, tp=tp, cp=cp, timeout_s=60)
    if spec.pop("sinks", False):
        spec["sinks"] = rng.standard_normal(Hq).astype(np.float32)
    x, dy = rng.standard_normal((B, S, d_model)), rng.standard_normal((B, S, d_model))
    wq, wk, wv = (rng.standard_normal((d_model, h * D)) / np.sqrt(d_model) for h in (Hq, Hkv, Hkv))
    wo = rng.standard_normal((Hq * D, d_model)) / np.sqrt(Hq * D)
    x, dy, wq, wk, wv, wo = (a.astype(np.float32) for a in (x, dy, wq, wk, wv, wo))
    want = layer_ref(x, wq, wk, wv, wo, Hq, Hkv, D, theta, dy, **spec)
    layer = attnrun.Layer(grp, d_model, Hq, Hkv, D, rope_theta=theta, layout=layout,
                          attention_dtype=attention_dtype, **spec)
    h = layer.heads
    cq, ck = slice(h["hq0"] * D, (h["hq0"] + h["hq"]) * D), slice(h["hk0"] * D, (h["hk0"] + h["hk"]) * D)
    rows = np.concatenate([np.arange(s, s + n) for s, n in
                           attnrun.cp_shard_rows(layout, cp, grp.info["cp_rank"], S)])
    w_qkv = np.ascontiguousarray(np.concatenate([wq[:, cq], wk[:, ck], wv[:, ck]], axis=1))
    w_o = np.ascontiguousarray(wo[cq])
    y = layer.forward(np.ascontiguousarray(x[:, rows]), w_qkv, w_o, S)
    dx, dw_qkv, dw_o = layer.backward(np.ascontiguousarray(dy[:, rows]))
    ry, rdx, rdwq, rdwk, rdwv, rdwo, rds, rterms = want
    errs = {"y": rel_err(y, ry[:, rows]), "dx": rel_err(dx, rdx[:, rows]),
            "dw_qkv": rel_err(dw_qkv, np.concatenate([rdwq[:, cq], rdwk[:, ck], rdwv[:, ck]], axis=1)),
            "dw_o": rel_err(dw_o, rdwo[cq])}
    if rds is not None:
        mine = slice(h["hq0"], h["hq0"] + h["hq"])
        errs["dsinks"] = np.max(np.abs(np.asarray(layer.dsinks(), np.float64) - rds[mine]) / rterms[mine])
    layer.close()
    grp.close()
    tol = {None: TOL, "f32": TOL, "bf16": 1e-2, "f16": 1.5e-3}[attention_dtype]  # Q, K, V, O rounded
    bad = [n for n, e in errs.items() if not e <= tol]
    print(f"rank {RANK}: {'ok ' if not bad else 'BAD'} tp {tp} cp {cp} {layout} "
          f"{attention_dtype or ''} {','.join(sorted(spec)) or 'plain'}: " + " ".join(f"{n} {e:.1e}" for n, e in errs.items()),
          flush=True)
    return bad


def main():
    ctx, rng = start("test_layer")
    splits = [(SIZE, 1), (1, SIZE)] + ([(2, SIZE // 2)] if SIZE % 2 == 0 and SIZE > 2 else [])
    bad = []
    # on a device the layer's attention defaults to bf16: ask for float32 (any head dim, the
    # float32 tolerance), and give the bf16 case a head dim the tensor-core kernels have
    f32 = "f32" if ctx.device == 1 else None
    for tp, cp in splits:
        bad += run(ctx, rng, tp, cp, causal=True, sinks=True, attention_dtype=f32)
        bad += run(ctx, rng, tp, cp, layout="contiguous", window=(9, 0), causal=True, attention_dtype=f32)
    bad += run(ctx, rng, splits[0][0], splits[0][1], attention_dtype="bf16", causal=True, window=(20, 0),
               D=64 if ctx.device == 1 else 16)
    return verdict("test_layer", ctx, bad)


if __name__ == "__main__":
    sys.exit(main())
