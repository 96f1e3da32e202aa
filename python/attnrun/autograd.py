"""autograd.py — attnrun attention as a torch.autograd.Function, for training code:

    from attnrun.autograd import attention
    o = attention(q, k, v, causal=True, window=(1024, 0))   # q [B, S, Hq, D] torch tensors
    o.sum().backward()                                       # q.grad, k.grad, v.grad

Forward keeps (q, k, v, o, lse) for the backward, which calls Context.backward; gradients
come back in the inputs' dtypes (the library accumulates them in float32). A sinks tensor
that requires grad gets its gradient too (float32, as the library keeps sinks). One Context per device is made on first use
(or pass ctx=). Imports torch only when used."""
import torch

from . import Context

_CONTEXTS = {}


def _context(t):
    key = (t.device.type, t.device.index or 0)
    if key not in _CONTEXTS:
        _CONTEXTS[key] = Context("cuda" if t.device.type == "cuda" else "cpu", device=key[1])
    return _CONTEXTS[key]


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(fctx, q, k, v, sinks, ctx, spec):
        if isinstance(sinks, torch.Tensor):
            sinks = sinks.detach().float().contiguous()
        spec = dict(spec, sinks=sinks)
        o, lse = ctx.forward(q.detach(), k.detach(), v.detach(), **spec)
        fctx.save_for_backward(q, k, v, o, lse)
        fctx.ctx, fctx.spec = ctx, spec
        return o

    @staticmethod
    def backward(fctx, do):
        q, k, v, o, lse = fctx.saved_tensors
        dq, dk, dv, dsinks = fctx.ctx.backward(q, k, v, o, lse, do.contiguous(), **fctx.spec)
        ds = dsinks if fctx.needs_input_grad[3] else None
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), ds, None, None


def attention(q, k, v, ctx=None, sinks=None, **spec):
    """o [B, Sq, Hq, Dv] with autograd; keywords as Context.forward (causal, window,
    softcap, scale, alibi_slopes, cu_seqlens_q / _kv, block_mask)."""
    return _Attention.apply(q, k, v, sinks, ctx or _context(q), spec)
