"""attnrun — the thin Python binding of libattnrun (include/attnrun.h, over ctypes): exact
softmax attention, forward and backward, on one rank (Context.forward / .backward) or over
MPI ranks (Group.ring_forward / .ring_backward: context parallel, K/V passed around the
ring), with every mask and feature of the C API (DESIGN.md §2): causal (bottom-right),
sliding window, sinks, ALiBi, softcap, GQA/MQA, varlen, block-sparse masks, Dqk != Dv.

Arrays are NumPy arrays (host, float32 on the cpu backend) or torch tensors (host or CUDA:
float32, bfloat16, float16 on the cuda backend) in the logical layouts Q [B, Sq, Hq, Dqk],
K [B, Skv, Hkv, Dqk], V [B, Skv, Hkv, Dv], O [B, Sq, Hq, Dv], LSE [B, Hq, Sq] (float32,
natural log), any strides with a contiguous last dimension. Outputs are new arrays of the
inputs' kind; NumPy arrays given to a CUDA context are copied to the device and back.
Failures raise AttnError (.code, .status, .message naming the argument); nothing exits.

    import numpy as np, attnrun
    ctx = attnrun.Context("cpu")
    o, lse = ctx.forward(q, k, v, causal=True, window=(256, 0))
    dq, dk, dv, dsinks = ctx.backward(q, k, v, o, lse, do, causal=True, window=(256, 0))
"""
import ctypes

from . import _capi as C
from . import arrays as A
from ._capi import AttnError

__all__ = ["AttnError", "Context", "Group", "cp_shard_rows", "flops_fwd", "version"]


def version():
    """libattnrun's version string."""
    return C.lib.attn_version_string().decode()


class _Spec:
    """An attn_spec built from keyword arguments, with its arrays kept alive (and staged to
    the context's memory) for the duration of one call."""

    def __init__(self, func, stage, q, k, v, causal=False, window=(-1, -1), softcap=0.0,
                 scale=None, sinks=None, alibi_slopes=None, cu_seqlens_q=None,
                 cu_seqlens_kv=None, block_mask=None):
        s = self.spec = C.Spec()
        s.num_heads_q, s.num_heads_kv = _dim(q, 2), _dim(k, 2)
        s.head_dim_qk, s.head_dim_v = _dim(q, 3), _dim(v, 3)
        s.scale = 0.0 if scale is None else float(scale)
        s.causal = int(bool(causal))
        if window is None:
            window = (-1, -1)
        if len(window) != 2:
            raise C.invalid(func, f"window: expected (left, right), got {window!r}")
        s.window_left, s.window_right = (-1 if w is None else int(w) for w in window)
        s.softcap = float(softcap or 0.0)
        self.keep = []
        s.sinks = self._vec(stage, func, "sinks", sinks, "float32")
        s.alibi_slopes = self._vec(stage, func, "alibi_slopes", alibi_slopes, "float32")
        if (cu_seqlens_q is None) != (cu_seqlens_kv is None):
            raise C.invalid(func, "cu_seqlens_q and cu_seqlens_kv: give both or neither")
        if cu_seqlens_q is not None:
            s.num_seqs = len(cu_seqlens_q) - 1
            s.cu_seqlens_q = self._vec(stage, func, "cu_seqlens_q", cu_seqlens_q, "int32")
            s.cu_seqlens_kv = self._vec(stage, func, "cu_seqlens_kv", cu_seqlens_kv, "int32")
        if block_mask is not None:
            if len(block_mask) != 3:
                raise C.invalid(func, "block_mask: expected (mask [num_q_blocks, num_k_blocks] "
                                      "uint8, block_q, block_k)")
            mask, bq, bk = block_mask
            bm = self.bm = C.BlockMask()
            bm.num_q_blocks, bm.num_k_blocks = mask.shape
            bm.block_q, bm.block_k = int(bq), int(bk)
            bm.mask = self._vec(stage, func, "block_mask", mask, "uint8")
            s.block_mask = ctypes.pointer(bm)

    def _vec(self, stage, func, name, x, dtype):
        x = A.vector(x, dtype, func, name)
        if x is None:
            return None
        self.keep.append(x)
        return stage.ptr(x, func, name)


def _dim(x, i):
    shape = getattr(x, "shape", ())
    return int(shape[i]) if len(shape) == 4 else 0


def _fptr(p):
    return ctypes.cast(p, C.PF) if p else None


class _Call:
    """One library call's staging: `with _Call(ctx) as st:` gives a Staging that copies
    outputs back when the block ends without an exception, and frees what it allocated."""

    def __init__(self, ctx):
        self.st = A.Staging(ctx._h, ctx.device)

    def __enter__(self):
        return self.st

    def __exit__(self, et, ev, tb):
        self.st.finish(et is None)
        return False


class Context:
    """A compute context: backend "auto" (CUDA when a device is present), "cpu" or "cuda";
    device: CUDA ordinal; threads: CPU threads (0: OpenMP's default); stream: a CUDA
    stream handle (int, e.g. torch.cuda.current_stream().cuda_stream) or None."""

    def __init__(self, backend="auto", device=0, threads=0, stream=None):
        if backend not in C.BACKENDS:
            raise C.invalid("attn_ctx_create", f"backend: {backend!r} is not one of "
                                               f"{', '.join(C.BACKENDS)}")
        cfg = C.CtxConfig(ctypes.sizeof(C.CtxConfig), 1, C.BACKENDS[backend], int(device),
                          int(threads), 0, stream)
        h = ctypes.c_void_p()
        C.check("attn_ctx_create", C.lib.attn_ctx_create(ctypes.byref(h), ctypes.byref(cfg)))
        self._h = h
        self.device = C.lib.attn_ctx_device(h)
        self.backend = C.lib.attn_ctx_backend_name(h).decode()

    def close(self):
        if getattr(self, "_h", None):
            C.lib.attn_ctx_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the module may be gone already
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def forward(self, q, k, v, **spec):
        """(o [B, Sq, Hq, Dv] in q's dtype, lse [B, Hq, Sq] float32). Keywords: causal,
        window=(left, right) (-1: unbounded), softcap, scale (None: 1/sqrt(Dqk)), sinks [Hq],
        alibi_slopes [Hq], cu_seqlens_q / cu_seqlens_kv (varlen, B = 1), block_mask =
        (mask [num_q_blocks, num_k_blocks] uint8, block_q, block_k)."""
        B, Sq, Hq, Dv = _dim(q, 0), _dim(q, 1), _dim(q, 2), _dim(v, 3)
        o, lse = A.new_like(q, (B, Sq, Hq, Dv)), A.new_like(q, (B, Hq, Sq), float32=True)
        with _Call(self) as st:
            sp = _Spec("attn_fwd", st, q, k, v, **spec)
            tq, tk, tv = (st.tensor(x, "attn_fwd", n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
            to = st.tensor(o, "attn_fwd", "o", out=True)
            plse = st.ptr(lse, "attn_fwd", "lse", out=True)
            C.check("attn_fwd", C.lib.attn_fwd(self._h, ctypes.byref(sp.spec), tq, tk, tv, to,
                                               _fptr(plse)))
        return o, lse

    def backward(self, q, k, v, o, lse, dout, **spec):
        """(dq, dk, dv float32 in the layouts of q, k, v; dsinks [Hq] float32 or None) from
        forward's o and lse and the output gradient dout; the same keywords as forward."""
        func = "attn_bwd"
        dq = A.new_like(q, tuple(q.shape), float32=True)
        dk = A.new_like(k, tuple(k.shape), float32=True)
        dv = A.new_like(v, tuple(v.shape), float32=True)
        dsinks = A.new_like(q, (_dim(q, 2),), float32=True) if spec.get("sinks") is not None else None
        with _Call(self) as st:
            sp = _Spec(func, st, q, k, v, **spec)
            ins = [st.tensor(x, func, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"))]
            lse32 = A.vector(lse, "float32", func, "lse") if A.is_numpy(lse) else lse
            plse = st.ptr(lse32, func, "lse")
            tdo = st.tensor(dout, func, "dout")
            outs = [st.tensor(x, func, n, out=True) for x, n in ((dq, "dq"), (dk, "dk"), (dv, "dv"))]
            pds = st.ptr(dsinks, func, "dsinks", out=True)
            C.check(func, C.lib.attn_bwd(self._h, ctypes.byref(sp.spec), *ins, _fptr(plse), tdo,
                                         *outs, _fptr(pds)))
        return dq, dk, dv, dsinks

    def last_stats(self):
        """What the last call computed: dict of flops_computed, tiles_computed, tiles_skipped."""
        s = C.Stats()
        C.check("attn_ctx_last_stats", C.lib.attn_ctx_last_stats(self._h, ctypes.byref(s)))
        return {"flops_computed": s.flops_computed, "tiles_computed": s.tiles_computed,
                "tiles_skipped": s.tiles_skipped}


class Group:
    """Ranks of an MPI communicator (an mpi4py communicator; MPI must be initialised, as
    importing mpi4py does) split into tp x cp: tp consecutive ranks share heads, cp ranks
    form the ring. Collective: every rank of comm constructs it."""

    def __init__(self, ctx, comm, tp=1, cp=None, timeout_s=0.0):
        from mpi4py import MPI  # the communicator's handle, for libattnrun's MPI_Comm
        size = comm.Get_size()
        cp = size // max(int(tp), 1) if cp is None else int(cp)
        cfg = C.GroupConfig(ctypes.sizeof(C.GroupConfig), 1, int(tp), cp, float(timeout_s))
        h = ctypes.c_void_p()
        self._comm_handle = ctypes.c_void_p(MPI._addressof(comm))
        C.check("attn_group_create", C.lib.attn_group_create(
            ctypes.byref(h), ctx._h, self._comm_handle, ctypes.byref(cfg)))
        self._h, self.ctx = h, ctx
        info = C.GroupInfo()
        C.check("attn_group_get_info", C.lib.attn_group_get_info(h, ctypes.byref(info)))
        self.info = {n: getattr(info, n) for n, _ in C.GroupInfo._fields_}

    def close(self):
        if getattr(self, "_h", None):
            C.lib.attn_group_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the module may be gone already
            pass

    def ring_forward(self, q, k, v, seq_q, seq_kv=None, layout="zigzag", **spec):
        """Ring attention over this rank's CP group: q, k, v are this rank's rows
        (cp_shard_rows of the global lengths); returns (o, lse) of those rows."""
        func, ctx = "attn_ring_fwd", self.ctx
        B, Sq, Hq, Dv = _dim(q, 0), _dim(q, 1), _dim(q, 2), _dim(v, 3)
        o, lse = A.new_like(q, (B, Sq, Hq, Dv)), A.new_like(q, (B, Hq, Sq), float32=True)
        with _Call(ctx) as st:
            sp = _Spec(func, st, q, k, v, **spec)
            ins = [st.tensor(x, func, n) for x, n in ((q, "q"), (k, "k"), (v, "v"))]
            to, plse = st.tensor(o, func, "o", out=True), st.ptr(lse, func, "lse", out=True)
            C.check(func, C.lib.attn_ring_fwd(self._h, ctypes.byref(sp.spec), _layout(func, layout),
                                              int(seq_q), int(seq_q if seq_kv is None else seq_kv),
                                              *ins, to, _fptr(plse)))
        return o, lse

    def ring_backward(self, q, k, v, o, lse, dout, seq_q, seq_kv=None, layout="zigzag", **spec):
        """(dq, dk, dv of this rank's rows, float32; dsinks [Hq] summed over the ring, or None)."""
        func, ctx = "attn_ring_bwd", self.ctx
        dq = A.new_like(q, tuple(q.shape), float32=True)
        dk = A.new_like(k, tuple(k.shape), float32=True)
        dv = A.new_like(v, tuple(v.shape), float32=True)
        dsinks = A.new_like(q, (_dim(q, 2),), float32=True) if spec.get("sinks") is not None else None
        with _Call(ctx) as st:
            sp = _Spec(func, st, q, k, v, **spec)
            ins = [st.tensor(x, func, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"))]
            lse32 = A.vector(lse, "float32", func, "lse") if A.is_numpy(lse) else lse
            plse = st.ptr(lse32, func, "lse")
            tdo = st.tensor(dout, func, "dout")
            outs = [st.tensor(x, func, n, out=True) for x, n in ((dq, "dq"), (dk, "dk"), (dv, "dv"))]
            pds = st.ptr(dsinks, func, "dsinks", out=True)
            C.check(func, C.lib.attn_ring_bwd(self._h, ctypes.byref(sp.spec), _layout(func, layout),
                                              int(seq_q), int(seq_q if seq_kv is None else seq_kv),
                                              *ins, _fptr(plse), tdo, *outs, _fptr(pds)))
        return dq, dk, dv, dsinks


def _layout(func, layout):
    if layout not in C.LAYOUTS:
        raise C.invalid(func, f"layout: {layout!r} is not one of {', '.join(C.LAYOUTS)}")
    return C.LAYOUTS[layout]


def cp_shard_rows(layout, cp, cp_rank, seq):
    """The global row ranges [(start, length), ...] that CP rank cp_rank holds of a
    sequence of seq rows: one run (contiguous) or two (zigzag), in local row order."""
    out = C.CpShard()
    C.check("attn_cp_shard_rows", C.lib.attn_cp_shard_rows(
        _layout("attn_cp_shard_rows", layout), int(cp), int(cp_rank), int(seq), ctypes.byref(out)))
    return [(out.start[i], out.len[i]) for i in range(out.count)]


def flops_fwd(num_heads_q, head_dim_qk, batch, seq_q, seq_kv, causal=False, head_dim_v=0):
    """Forward FLOPs by the peers' rule (2·B·Hq·Sq·Skv·(Dqk + Dv), halved when causal)."""
    s = C.Spec()
    s.num_heads_q = s.num_heads_kv = int(num_heads_q)
    s.head_dim_qk, s.head_dim_v, s.causal = int(head_dim_qk), int(head_dim_v), int(bool(causal))
    return C.lib.attn_flops_fwd(ctypes.byref(s), int(batch), int(seq_q), int(seq_kv))
