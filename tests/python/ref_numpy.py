"""ref_numpy.py — a float64 NumPy reference of DESIGN.md §2 for the Python binding's tests,
written from the spec (not from kernels/ref): dense scores per (batch, head), the mask from
positions, softmax with sinks, and the backward by the chain rule; plus a finite-difference
check of that backward, so the reference is itself tested.

Shapes: q [B, Sq, Hq, Dqk], k [B, Skv, Hkv, Dqk], v [B, Skv, Hkv, Dv], o [B, Sq, Hq, Dv],
lse [B, Hq, Sq]. Keywords as the binding's: causal, window, softcap, scale, sinks,
alibi_slopes, cu_seqlens_q / cu_seqlens_kv, block_mask = (mask, block_q, block_k)."""
import numpy as np


def visible(sq, skv, causal=False, window=(-1, -1), block_mask=None, **_):
    """[sq, skv] bool: which keys each query of one sequence may see (local positions)."""
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    off = skv - sq
    ok = np.ones((sq, skv), bool)
    if causal:
        ok &= j <= i + off
    left, right = window if window is not None else (-1, -1)
    if left is not None and left >= 0:
        ok &= j >= i + off - left
    if right is not None and right >= 0:
        ok &= j <= i + off + right
    if block_mask is not None:
        mask, bq, bk = block_mask
        ok &= np.asarray(mask, bool)[i // bq, j // bk]
    return ok


def _segments(q, k, spec):
    """(batch, q rows slice, kv rows slice) of each sequence: varlen, or the whole batch."""
    cq, ck = spec.get("cu_seqlens_q"), spec.get("cu_seqlens_kv")
    if cq is None:
        return [(b, slice(0, q.shape[1]), slice(0, k.shape[1])) for b in range(q.shape[0])]
    return [(0, slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])) for s in range(len(cq) - 1)]


def _scores(qh, kh, h, sq, skv, spec):
    """(s [sq, skv] final scores, pre-softcap tanh for the chain rule or None, mask)."""
    scale = spec.get("scale") or 1.0 / np.sqrt(qh.shape[-1])
    x = scale * qh @ kh.T
    th = None
    cap = spec.get("softcap") or 0.0
    if cap:
        th = np.tanh(x / cap)
        x = cap * th
    if spec.get("alibi_slopes") is not None:
        i = np.arange(sq)[:, None]
        j = np.arange(skv)[None, :]
        x = x - spec["alibi_slopes"][h] * np.abs(i + (skv - sq) - j)
    return x, th, visible(sq, skv, **spec), scale


def forward(q, k, v, **spec):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, Sq, Hq, _ = q.shape
    Hkv, Dv = k.shape[2], v.shape[3]
    o = np.zeros((B, Sq, Hq, Dv))
    lse = np.full((B, Hq, Sq), -np.inf)
    sinks = spec.get("sinks")
    for b, rq, rk in _segments(q, k, spec):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            qh, kh, vh = q[b, rq, h], k[b, rk, hk], v[b, rk, hk]
            s, _, ok, _ = _scores(qh, kh, h, len(qh), len(kh), spec)
            s = np.where(ok, s, -np.inf)
            cols = [s] + ([np.full((len(qh), 1), float(sinks[h]))] if sinks is not None else [])
            m = np.max(np.concatenate(cols, 1), 1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            e = np.exp(s - m)
            den = e.sum(1, keepdims=True) + (np.exp(float(sinks[h]) - m) if sinks is not None else 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                o[b, rq, h] = np.where(den > 0, (e @ vh) / np.where(den > 0, den, 1), 0.0)
                lse[b, h, rq] = np.where(den[:, 0] > 0, np.log(den[:, 0]) + m[:, 0], -np.inf)
    return o, lse


def sink_terms(o, lse, do, sinks):
    """[Hq]: sum_i e^(sink_h - lse_i) sum_d |dO_id O_id|, the size of the terms whose signed sum
    is d(sink_h) = -sum_i e^(sink_h - lse_i) dO_i . O_i. One head's sum can cancel to far below
    its terms, so its error is judged against this, not against d(sink_h) itself."""
    w = np.exp(np.asarray(sinks, np.float64)[None, :, None] - lse)  # [B, Hq, S]
    mag = np.abs(do * o).sum(-1).transpose(0, 2, 1)                  # [B, Hq, S]
    return np.where(np.isfinite(lse), w * mag, 0).sum((0, 2))


def backward(q, k, v, dout, **spec):
    """(dq, dk, dv, dsinks or None) of sum(o * dout)."""
    q, k, v, do = (np.asarray(a, np.float64) for a in (q, k, v, dout))
    o, lse = forward(q, k, v, **spec)
    B, Sq, Hq, _ = q.shape
    Hkv = k.shape[2]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    sinks = spec.get("sinks")
    dsinks = np.zeros(Hq) if sinks is not None else None
    for b, rq, rk in _segments(q, k, spec):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            qh, kh, vh, doh = q[b, rq, h], k[b, rk, hk], v[b, rk, hk], do[b, rq, h]
            s, th, ok, scale = _scores(qh, kh, h, len(qh), len(kh), spec)
            l = lse[b, h, rq][:, None]
            fin = np.isfinite(l)
            p = np.where(ok & fin, np.exp(np.where(ok, s, 0) - np.where(fin, l, 0)), 0.0)
            delta = (doh * o[b, rq, h]).sum(1, keepdims=True)
            dp = doh @ vh.T
            ds = p * (dp - delta)
            if th is not None:
                ds = ds * (1 - th * th)
            dq[b, rq, h] += scale * ds @ kh
            dk[b, rk, hk] += scale * ds.T @ qh
            dv[b, rk, hk] += p.T @ doh
            if sinks is not None:
                ps = np.where(fin, np.exp(float(sinks[h]) - np.where(fin, l, 0)), 0.0)
                dsinks[h] += -(ps * delta).sum()
    return dq, dk, dv, dsinks


def check_backward_by_differences(rng, eps=1e-6, **spec):
    """Largest relative gap between backward() and central differences of forward() on a
    tiny random problem with this spec (sinks drawn when spec has sinks=True)."""
    B, Sq, Skv, Hq, Hkv, D = 1, 5, 7, 2, 1, 4
    q, k, v, do = (rng.standard_normal(s) for s in ((B, Sq, Hq, D), (B, Skv, Hkv, D),
                                                    (B, Skv, Hkv, D), (B, Sq, Hq, D)))
    if spec.get("sinks") is True:
        spec["sinks"] = rng.standard_normal(Hq)
    grads = backward(q, k, v, do, **spec)
    worst = 0.0
    for idx, x in enumerate([q, k, v] + ([spec["sinks"]] if spec.get("sinks") is not None else [])):
        g = grads[idx] if idx < 3 else grads[3]
        num = np.zeros_like(x)
        for pos in np.ndindex(x.shape):
            old = x[pos]
            x[pos] = old + eps
            fp = (forward(q, k, v, **spec)[0] * do).sum()
            x[pos] = old - eps
            fm = (forward(q, k, v, **spec)[0] * do).sum()
            x[pos] = old
            num[pos] = (fp - fm) / (2 * eps)
        worst = max(worst, np.abs(num - g).max() / max(np.abs(num).max(), 1e-12))
    return worst
