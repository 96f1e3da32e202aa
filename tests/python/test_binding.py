"""test_binding.py — the Python binding (python/attnrun) on one rank against the float64
NumPy reference (ref_numpy.py): forward and backward with every feature on and off, random
inputs drawn fresh per case, strided (BHSD) views, empty rows, bad arguments (AttnError
naming the argument, nothing written), the block API (fold, merge, finalize; prepare and
block gradients), float16 NumPy arrays, the finite-difference check of the reference itself;
bf16 / f16 torch tensors and torch.autograd on the context's device (when torch is
installed).

    python3 tests/python/test_binding.py [cpu|cuda|auto]
Exit 0: passed; 1: failed; 77: skipped (no NumPy, or no device for "cuda")."""
import os
import sys

try:
    import numpy as np
except ImportError:
    print("test_binding: no NumPy, skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attnrun  # noqa: E402
import ref_numpy as ref  # noqa: E402

FAILS = []
TOL = {"o": 2e-5, "lse": 2e-5, "dq": 1e-4, "dk": 1e-4, "dv": 1e-4, "dsinks": 1e-4}


def rel_err(got, want):
    """‖got − want‖ / ‖want‖ over the finite entries; inf where NaN shows or infinities differ."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if np.isnan(got).any() or (np.isinf(got) != np.isinf(want)).any() or \
            (got[np.isinf(got)] != want[np.isinf(want)]).any():
        return np.inf
    f = np.isfinite(want)
    return np.linalg.norm(got[f] - want[f]) / max(np.linalg.norm(want[f]), 1e-30)


def expect(name, got, want, tol):
    e = rel_err(got, want)
    ok = e <= tol
    print(f"  {'ok ' if ok else 'BAD'} {name:28s} rel err {e:.2e} (tol {tol:.0e})")
    if not ok:
        FAILS.append(name)


def expect_dsinks(name, got, want, o, lse, do, sinks, u):
    """d(sink_h) = -sum_i e^(sink_h - lse_i) delta_i, delta_i = dO_i . O_i with O rounded to
    the storage (relative unit u): a sum that cancels, so it is judged by how far O's
    rounding can move it, u * sum_i e^(sink_h - lse_i) sum_d |dO_id O_id|, not relatively."""
    o, do, lse = (np.asarray(x, np.float64) for x in (o, do, lse))  # [B,S,H,D], [B,H,S]
    bound = 2 * u * ref.sink_terms(o, lse, do, sinks) + 1e-6
    err = np.abs(np.asarray(got, np.float64) - want)
    ok = bool((err <= bound).all())
    print(f"  {'ok ' if ok else 'BAD'} {name:28s} err/bound {np.max(err / bound):.2f}")
    if not ok:
        FAILS.append(name)


def case(rng, B=2, Sq=37, Skv=45, Hq=4, Hkv=2, Dqk=32, Dv=None, bhsd=False, **spec):
    """Draws a random problem, runs the binding's forward and backward and compares."""
    Dv = Dv or Dqk
    if spec.pop("sinks", False):
        spec["sinks"] = rng.standard_normal(Hq).astype(np.float32)
    if spec.pop("alibi", False):
        spec["alibi_slopes"] = (0.5 ** np.arange(1, Hq + 1)).astype(np.float32)
    shapes = [(B, Sq, Hq, Dqk), (B, Skv, Hkv, Dqk), (B, Skv, Hkv, Dv), (B, Sq, Hq, Dv)]
    if bhsd:  # [B, H, S, D] storage seen through a [B, S, H, D] view
        q, k, v, do = (rng.standard_normal((s[0], s[2], s[1], s[3])).astype(np.float32)
                       .transpose(0, 2, 1, 3) for s in shapes)
    else:
        q, k, v, do = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    o, lse = CTX.forward(q, k, v, **spec)
    ro, rlse = ref.forward(q, k, v, **spec)
    name = ",".join(a if hasattr(b, "shape") or isinstance(b, tuple) and hasattr(b[0], "shape")
                    else f"{a}={b}" for a, b in spec.items()) or "plain"
    name += f" B{B} {Sq}x{Skv} H{Hq}/{Hkv} D{Dqk}/{Dv}" + (" bhsd" if bhsd else "")
    print(name)
    expect("o", o, ro, TOL["o"])
    expect("lse", lse, rlse, TOL["lse"])
    dq, dk, dv, dsinks = CTX.backward(q, k, v, o, lse, do, **spec)
    rdq, rdk, rdv, rds = ref.backward(q, k, v, do, **spec)
    for n, g, w in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        expect(n, g, w, TOL[n])
    if rds is not None:
        expect("dsinks", dsinks, rds, TOL["dsinks"])
    elif dsinks is not None:
        FAILS.append(name + ": dsinks without sinks")
    return o, lse, dq


def varlen_case(rng, lens_q, lens_kv, **spec):
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_kv)]).astype(np.int32)
    return case(rng, B=1, Sq=int(cq[-1]), Skv=int(ck[-1]), cu_seqlens_q=cq, cu_seqlens_kv=ck, **spec)


def kv_cache_case(rng, B=3, Sq=2, Skv=90, Hq=4, Hkv=2, D=16, page=16, **spec):
    """A KV cache: each batch's used keys (seqused_kv) and K/V in shuffled pages (a block
    table; rows past the used keys and the spare page NaN), against the reference run per
    batch on exactly its used keys."""
    if spec.pop("sinks", False):
        spec["sinks"] = rng.standard_normal(Hq).astype(np.float32)
    q = rng.standard_normal((B, Sq, Hq, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, Skv, Hkv, D)).astype(np.float32) for _ in range(2))
    used = np.array([Skv, 0] + [int(x) for x in rng.integers(0, Skv + 1, B - 2)], np.int32)
    pps = -(-Skv // page)
    perm = rng.permutation(B * pps + 1).astype(np.int32)
    table = np.full((B, pps), -1, np.int32)
    kp, vp = (np.full((B * pps + 1, page, Hkv, D), np.nan, np.float32) for _ in range(2))
    for b in range(B):
        for j in range(used[b]):
            table[b, j // page] = perm[b * pps + j // page]
            kp[table[b, j // page], j % page], vp[table[b, j // page], j % page] = k[b, j], v[b, j]
    o, lse = CTX.forward(q, kp, vp, block_table=table, seqused_kv=used, **spec)
    o2, lse2 = CTX.forward(q, k, v, seqused_kv=used, **spec)
    ro, rlse = np.zeros_like(o, np.float64), np.full(lse.shape, -np.inf)
    for b in range(B):
        if used[b]:
            ob, lb = ref.forward(q[b:b + 1], k[b:b + 1, :used[b]], v[b:b + 1, :used[b]], **spec)
            ro[b], rlse[b] = ob[0], lb[0]
        elif "sinks" in spec:
            rlse[b] = spec["sinks"][:, None]
    print(f"kv cache B{B} Sq{Sq} Skv{Skv} page {page} used {list(used)} {sorted(spec)}")
    for n, got in (("paged", (o, lse)), ("seqused_kv", (o2, lse2))):
        expect(f"{n} o", got[0], ro, TOL["o"])
        expect(f"{n} lse", got[1], rlse, TOL["lse"])
    try:
        CTX.backward(q, k, v, o2, lse2, o2, seqused_kv=used, **spec)
        FAILS.append("kv cache: backward accepted a cache")
    except attnrun.AttnError as e:
        if "kv_cache" not in str(e):
            FAILS.append(f"kv cache backward: {e}")


def bad_arguments(rng):
    """Each mistake raises AttnError with the argument's name; the inputs are untouched."""
    print("bad arguments")
    q = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    k = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    v = rng.standard_normal((1, 8, 2, 16)).astype(np.float32)
    keep = [x.copy() for x in (q, k, v)]
    bad = [("v shape", dict(k=k[:, :, :1])), ("k shape", dict(k=k[..., :8])),
           ("q", dict(q=q[0])), ("dtype", dict(q=q.astype(np.float64))),
           ("window", dict(window=(1, 2, 3))), ("cu_seqlens", dict(cu_seqlens_q=[0, 8])),
           ("backend", None)]
    for needle, kw in bad:
        try:
            if kw is None:
                attnrun.Context("tpu")
            else:
                args = dict(q=q, k=k, v=v)
                args.update(kw)
                CTX.forward(args.pop("q"), args.pop("k"), args.pop("v"), **args)
        except attnrun.AttnError as e:
            ok = e.code in (1, 2) and needle in str(e)
            print(f"  {'ok ' if ok else 'BAD'} {needle}: {e}")
            if not ok:
                FAILS.append(f"bad argument {needle}: {e}")
            continue
        FAILS.append(f"bad argument {needle}: no error")
        print(f"  BAD {needle}: no error")
    if any((a != b).any() for a, b in zip((q, k, v), keep)):
        FAILS.append("bad arguments: an input changed")


def block_api(rng):
    """The state-carrying calls: K/V in three blocks folded into one state, or split over
    two states and merged, then finalized (sinks once), equal the one-shot reference; the
    backward prepared once and accumulated block by block equals the reference gradients."""
    B, Sq, Skv, Hq, Hkv, D = 2, 33, 50, 4, 2, 32
    spec = {"causal": True, "window": (30, 0), "softcap": 4.0,
            "sinks": rng.standard_normal(Hq).astype(np.float32)}
    q, do = (rng.standard_normal((B, Sq, Hq, D)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((B, Skv, Hkv, D)).astype(np.float32) for _ in range(2))
    cuts = [0, 17, 31, Skv]
    blocks = [(np.ascontiguousarray(k[:, a:b]), np.ascontiguousarray(v[:, a:b]), a)
              for a, b in zip(cuts, cuts[1:])]
    mask_spec = {n: x for n, x in spec.items() if n != "sinks"}
    ro, rlse = ref.forward(q, k, v, **spec)
    print("block API: 3 key blocks, then 2 + 1 merged")
    whole = CTX.state(q, k, v)
    for kb, vb, k0 in blocks:
        CTX.forward_block(whole, q, kb, vb, k_pos0=k0, seq_kv=Skv, **mask_spec)
    first, last = CTX.state(q, k, v), CTX.state(q, k, v)
    for kb, vb, k0 in blocks[:2]:
        CTX.forward_block(first, q, kb, vb, k_pos0=k0, seq_kv=Skv, **mask_spec)
    CTX.forward_block(last, q, *blocks[2][:2], k_pos0=blocks[2][2], seq_kv=Skv, **mask_spec)
    CTX.merge(first, last)
    for name, st in (("folded", whole), ("merged", first)):
        o, lse = CTX.finalize(st, out_like=q, **spec)
        expect(f"{name} o", o, ro, TOL["o"])
        expect(f"{name} lse", lse, rlse, TOL["lse"])
    rdq, rdk, rdv, rds = ref.backward(q, k, v, do, **spec)
    o, lse = CTX.forward(q, k, v, **spec)
    delta, dsinks = CTX.backward_prepare(q, k, v, o, do, lse, **spec)
    dq = np.zeros(q.shape, np.float32)
    dks, dvs = [], []
    for kb, vb, k0 in blocks:
        dk, dv = np.zeros(kb.shape, np.float32), np.zeros(vb.shape, np.float32)
        CTX.backward_block(q, kb, vb, do, lse, delta, dq, dk, dv, k_pos0=k0, seq_kv=Skv, **mask_spec)
        dks.append(dk)
        dvs.append(dv)
    expect("blocks dq", dq, rdq, TOL["dq"])
    expect("blocks dk", np.concatenate(dks, 1), rdk, TOL["dk"])
    expect("blocks dv", np.concatenate(dvs, 1), rdv, TOL["dv"])
    expect("prepare dsinks", dsinks, rds, TOL["dsinks"])


def staging_mechanics(rng):
    """The host-array staging a CUDA context uses, driven through the cpu context's memory
    (attn_ctx_alloc / attn_ctx_copy are the same calls): inputs copied in, outputs copied
    back only on success, buffers distinct from the arrays."""
    import ctypes
    from attnrun import arrays
    if CTX.device != 0:
        return  # the check reads context memory from the host
    x = rng.standard_normal(1000).astype(np.float32)
    for ok in (True, False):
        y = np.full(1000, np.nan, np.float32)
        st = arrays.Staging(CTX._h, 1)  # pretend the context computes elsewhere
        px, py = st.ptr(x, "staging", "x"), st.ptr(y, "staging", "y", out=True)
        seen = np.empty_like(x)
        ctypes.memmove(seen.ctypes.data, px, x.nbytes)
        ctypes.memmove(py, px, x.nbytes)  # the "kernel": y := x in context memory
        st.finish(ok)
        good = px not in (x.ctypes.data, None) and (seen == x).all() and \
            ((y == x).all() if ok else np.isnan(y).all())
        print(f"  {'ok ' if good else 'BAD'} staging, call {'succeeded' if ok else 'failed'}")
        if not good:
            FAILS.append(f"staging ok={ok}")
    # a strided (BHSD) host input travels as a contiguous copy with plain strides
    x4 = rng.standard_normal((2, 3, 5, 8)).astype(np.float32).transpose(0, 2, 1, 3)
    st = arrays.Staging(CTX._h, 1)
    t = st.tensor(x4, "staging", "q")
    seen = np.empty(x4.shape, np.float32)
    ctypes.memmove(seen.ctypes.data, t.data, x4.nbytes)
    good = list(t.stride) == [120, 24, 8, 1] and (seen == x4).all()
    st.finish(True)
    print(f"  {'ok ' if good else 'BAD'} staging a strided host input")
    if not good:
        FAILS.append("staging strided")


def f16_numpy(rng):
    """float16 NumPy arrays (the CPU backend takes f16 storage too; a CUDA context stages
    them): o comes back float16, LSE and the gradients float32, against the reference on
    the same rounded inputs; tolerances of f16 storage (O rounded once: 2^-12 relative)."""
    tol = {"o": 1e-3, "lse": 1e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dsinks": 8e-3}
    if CTX.device == 0:  # the CPU computes in float32 and rounds only O
        tol = {"o": 5e-4, "lse": 2e-5, "dq": 1e-3, "dk": 1e-3, "dv": 1e-4, "dsinks": 1e-3}
    for D, spec in ((64, {"causal": True, "window": (30, 0)}),
                    (128, {"sinks": True, "softcap": 3.0, "bhsd": True})):
        B, Sq, Skv, Hq, Hkv = 2, 130, 150, 4, 2
        if spec.pop("sinks", False):
            spec["sinks"] = rng.standard_normal(Hq).astype(np.float32)
        bhsd = spec.pop("bhsd", False)
        shapes = [(B, Sq, Hq, D), (B, Skv, Hkv, D), (B, Skv, Hkv, D), (B, Sq, Hq, D)]
        if bhsd:
            q, k, v, do = (rng.standard_normal((s[0], s[2], s[1], s[3])).astype(np.float16)
                           .transpose(0, 2, 1, 3) for s in shapes)
        else:
            q, k, v, do = (rng.standard_normal(s).astype(np.float16) for s in shapes)
        o, lse = CTX.forward(q, k, v, **spec)
        dq, dk, dv, ds = CTX.backward(q, k, v, o, lse, do, **spec)
        w = [x.astype(np.float32) for x in (q, k, v, do)]
        ro, rlse = ref.forward(*w[:3], **spec)
        grads = ref.backward(*w, **spec)
        print(f"numpy float16 D{D} {','.join(spec)}" + (" bhsd" if bhsd else ""))
        if o.dtype != np.float16 or dq.dtype != np.float32:
            FAILS.append(f"float16 dtypes: o {o.dtype}, dq {dq.dtype}")
        for n, g, want in (("o", o, ro), ("lse", lse, rlse), ("dq", dq, grads[0]),
                           ("dk", dk, grads[1]), ("dv", dv, grads[2]), ("dsinks", ds, grads[3])):
            if want is None:
                continue
            if n == "dsinks" and CTX.device == 0:
                expect_dsinks("f16 dsinks", g, want, o, lse, do, spec["sinks"], 2.0 ** -11)
            else:
                expect("f16 " + n, g, want, tol[n])


def torch_cases(rng):
    """bf16 / f16 torch tensors straight into the context (CUDA tensors on a CUDA context,
    host tensors on the CPU one; no staging), against the reference on the same rounded
    inputs, with the tolerances of bf16 / f16 storage; then the same through autograd."""
    try:
        import torch
    except Exception as e:  # not installed, or its libraries do not load next to ours
        print(f"torch cases: import torch failed ({e}), skipped")
        return
    cuda = CTX.device == 1
    if cuda and not torch.cuda.is_available():
        print("torch cases: a CUDA context but torch sees no CUDA device, skipped")
        return
    where = "cuda" if cuda else "cpu"
    for dt, D, spec in ((torch.bfloat16, 128, {"causal": True}),
                        (torch.float16, 64, {"window": (40, 0), "sinks": True})):
        if cuda:  # the kernels round P and dS too
            tol = {"o": 2e-2, "lse": 2e-3, "dq": 5e-2, "dk": 5e-2, "dv": 5e-2, "dsinks": 5e-2}
        else:     # float32 arithmetic; only O is rounded (and the gradients cast back)
            u = 2.0 ** (-8 if dt == torch.bfloat16 else -11)
            tol = {"o": u, "lse": 2e-5, "dq": 2 * u, "dk": 2 * u, "dv": 2 * u, "dsinks": 4 * u}
        B, S, Hq, Hkv = 2, 300, 4, 2
        if spec.pop("sinks", False):
            spec["sinks"] = rng.standard_normal(Hq).astype(np.float32)
        dev = [torch.from_numpy(rng.standard_normal(sh).astype(np.float32)).to(where, dt)
               for sh in ((B, S, Hq, D), (B, S, Hkv, D), (B, S, Hkv, D), (B, S, Hq, D))]
        q, k, v, do = (x.float().cpu().numpy() for x in dev)
        o, lse = CTX.forward(*dev[:3], **spec)
        dq, dk, dv, ds = CTX.backward(*dev[:3], o, lse, dev[3], **spec)
        ro, rlse = ref.forward(q, k, v, **spec)
        grads = ref.backward(q, k, v, do, **spec)
        print(f"torch {dt} on {where}, D{D} {','.join(spec)}")
        if o.dtype != dt or o.device.type != where or dq.dtype != torch.float32:
            FAILS.append(f"torch {dt}: o {o.dtype} on {o.device}, dq {dq.dtype}")
        for n, g, w in (("o", o, ro), ("lse", lse, rlse), ("dq", dq, grads[0]), ("dk", dk, grads[1]),
                        ("dv", dv, grads[2]), ("dsinks", ds, grads[3])):
            if w is None:
                continue
            if n == "dsinks" and not cuda:
                expect_dsinks(n, ds.cpu().numpy(), w, o.float().cpu().numpy(), lse.cpu().numpy(),
                              do, spec["sinks"], u)
            else:
                expect(n, g.float().cpu().numpy(), w, tol[n])
        # the same through torch.autograd (attnrun.autograd.attention)
        from attnrun.autograd import attention
        leaves = [x.clone().requires_grad_() for x in dev[:3]]
        sk = spec.get("sinks")
        sk = torch.tensor(sk, device=where, requires_grad=True) if sk is not None else None
        oa = attention(*leaves, ctx=CTX, sinks=sk, **{a: b for a, b in spec.items() if a != "sinks"})
        oa.backward(dev[3])
        if leaves[0].grad.dtype != dt:
            FAILS.append(f"autograd {dt}: q.grad is {leaves[0].grad.dtype}")
        for n, g, w in (("autograd o", oa, ro), ("autograd dq", leaves[0].grad, grads[0]),
                        ("autograd dk", leaves[1].grad, grads[1]), ("autograd dv", leaves[2].grad, grads[2]),
                        ("autograd dsinks", sk.grad if sk is not None else None, grads[3])):
            if w is None:
                continue
            if n == "autograd dsinks" and not cuda:
                expect_dsinks(n, g.detach().cpu().numpy(), w, oa.detach().float().cpu().numpy(),
                              lse.cpu().numpy(), do, spec["sinks"], u)
            else:
                expect(n, g.detach().float().cpu().numpy(), w, tol[n.split()[1]])


def main():
    global CTX
    backend = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    try:
        CTX = attnrun.Context(backend)
    except attnrun.AttnError as e:
        if backend == "cuda":
            print(f"test_binding: no CUDA context ({e}), skipped")
            return 77
        raise
    print(f"attnrun {attnrun.version()} on {CTX.backend}")
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))

    gap = max(ref.check_backward_by_differences(rng, **s) for s in (
        {}, {"causal": True, "softcap": 2.0}, {"sinks": True, "alibi_slopes": np.array([0.3, 0.7])}))
    print(f"reference backward vs central differences: {gap:.1e}")
    if gap > 1e-6:
        FAILS.append("reference backward")

    case(rng)
    case(rng, causal=True)
    case(rng, causal=True, window=(9, 0))
    case(rng, window=(5, 7))
    case(rng, softcap=3.0, scale=0.2)
    case(rng, sinks=True, causal=True)
    case(rng, alibi=True)
    case(rng, Hq=4, Hkv=1, Dqk=64, Dv=32, causal=True)  # MQA, Dqk != Dv
    case(rng, bhsd=True, causal=True, sinks=True)
    mask = (rng.random((3, 2)) < 0.6).astype(np.uint8)
    mask[0, 0] = 0  # a query block that may see nothing
    case(rng, Sq=40, Skv=40, block_mask=(mask, 16, 32))
    # bottom-right causal with Sq > Skv: rows 0..Sq-Skv-1 see nothing (O = 0, LSE = -inf)
    o, lse, dq = case(rng, Sq=20, Skv=12, causal=True)
    if not ((o[:, :8] == 0).all() and np.isneginf(lse[:, :, :8]).all() and (dq[:, :8] == 0).all()):
        FAILS.append("empty rows: O, LSE or dQ not 0 / -inf")
    varlen_case(rng, [7, 0, 19, 5], [11, 4, 19, 9], causal=True)
    varlen_case(rng, [16, 9], [16, 30], window=(4, 4), sinks=True)
    kv_cache_case(rng, causal=True)
    kv_cache_case(rng, Sq=5, page=7, sinks=True, window=(20, 0))
    kv_cache_case(rng, B=2, Sq=1, Skv=256, page=128)
    block_api(rng)
    bad_arguments(rng)
    staging_mechanics(rng)
    f16_numpy(rng)
    torch_cases(rng)
    CTX.close()
    if FAILS:
        print(f"test_binding: {len(FAILS)} failed: {FAILS}")
        return 1
    print("test_binding: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
