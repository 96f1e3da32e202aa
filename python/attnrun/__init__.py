"""attnrun — the thin Python binding of libattnrun (include/attnrun.h, over ctypes): exact
softmax attention, forward and backward, on one rank (Context.forward / .backward, and the
block API) or over MPI ranks (Group.ring_forward / .ring_backward: context parallel, K/V
passed around the ring; Layer: the tensor-parallel attention layer with its projections),
with every mask and feature of the C API (DESIGN.md §2): causal (bottom-right), sliding
window, sinks, ALiBi, softcap, GQA/MQA, varlen, block-sparse masks, Dqk != Dv.

Arrays are NumPy arrays (host: float32 or float16) or torch tensors (host or CUDA: float32,
bfloat16 or float16, on either backend) in the logical layouts Q [B, Sq, Hq, Dqk],
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

__all__ = ["AttnError", "Context", "Group", "Layer", "State", "cp_shard_rows", "flops_fwd",
           "version"]


def version():
    """libattnrun's version string."""
    return C.lib.attn_version_string().decode()


class _Spec:
    """An attn_spec built from keyword arguments, its arrays staged to the context's memory
    and kept alive by the Staging (one call's, or a layer's for its life)."""

    def __init__(self, func, stage, dims, causal=False, window=(-1, -1), softcap=0.0,
                 scale=None, sinks=None, alibi_slopes=None, cu_seqlens_q=None,
                 cu_seqlens_kv=None, block_mask=None, block_table=None, seqused_kv=None,
                 spec=None):
        s = self.spec = C.Spec() if spec is None else spec
        s.num_heads_q, s.num_heads_kv, s.head_dim_qk, s.head_dim_v = (int(d) for d in dims)
        s.scale = 0.0 if scale is None else float(scale)
        s.causal = int(bool(causal))
        if window is None:
            window = (-1, -1)
        if len(window) != 2:
            raise C.invalid(func, f"window: expected (left, right), got {window!r}")
        s.window_left, s.window_right = (-1 if w is None else int(w) for w in window)
        s.softcap = float(softcap or 0.0)
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
        if block_table is not None or seqused_kv is not None:
            kc = self.kc = C.KvCache()
            if block_table is not None:
                if len(getattr(block_table, "shape", ())) != 2:
                    raise C.invalid(func, "block_table: expected [B, pages_per_seq] int32")
                kc.pages_per_seq = int(block_table.shape[1])
                kc.block_table = self._vec(stage, func, "block_table", block_table, "int32")
            kc.seqused_kv = self._vec(stage, func, "seqused_kv", seqused_kv, "int32")
            s.kv_cache = ctypes.pointer(kc)

    def _vec(self, stage, func, name, x, dtype):
        x = A.vector(x, dtype, func, name)
        if x is None:
            return None
        stage.keep.append(x)
        return stage.ptr(x, func, name)


def _dim(x, i):
    shape = getattr(x, "shape", ())
    return int(shape[i]) if len(shape) == 4 else 0


def _dims(q, k, v):
    """(Hq, Hkv, Dqk, Dv) of 4-D q, k, v (0 where one is not 4-D: the library says so)."""
    return _dim(q, 2), _dim(k, 2), _dim(q, 3), _dim(v, 3)


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


def _f32_ptr(st, x, func, name, out=False):
    """The context pointer of a contiguous float32 argument (lse, delta, the layer's
    arrays): NumPy arrays converted when needed, torch tensors checked."""
    x32 = A.vector(x, "float32", func, name)
    st.keep.append(x32)
    return _fptr(st.ptr(x32, func, name, out))


def _fwd_call(ctx, func, q, k, v, spec, call):
    """(o, lse) of call(spec, q, k, v, o, lse): a one-shot or ring forward, staged."""
    B, Sq, Hq, Dv = _dim(q, 0), _dim(q, 1), _dim(q, 2), _dim(v, 3)
    o, lse = A.new_like(q, (B, Sq, Hq, Dv)), A.new_like(q, (B, Hq, Sq), float32=True)
    with _Call(ctx) as st:
        sp = _Spec(func, st, _dims(q, k, v), **spec)
        ins = [st.tensor(x, func, n) for x, n in ((q, "q"), (k, "k"), (v, "v"))]
        to, plse = st.tensor(o, func, "o", out=True), st.ptr(lse, func, "lse", out=True)
        C.check(func, call(ctypes.byref(sp.spec), *ins, to, _fptr(plse)))
    return o, lse


def _bwd_call(ctx, func, q, k, v, o, lse, dout, spec, call):
    """(dq, dk, dv, dsinks) of call(spec, q, k, v, o, lse, dout, dq, dk, dv, dsinks)."""
    dq, dk, dv = (A.new_like(x, tuple(x.shape), float32=True) for x in (q, k, v))
    dsinks = A.new_like(q, (_dim(q, 2),), float32=True) if spec.get("sinks") is not None else None
    with _Call(ctx) as st:
        sp = _Spec(func, st, _dims(q, k, v), **spec)
        ins = [st.tensor(x, func, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"))]
        plse, tdo = _f32_ptr(st, lse, func, "lse"), st.tensor(dout, func, "dout")
        outs = [st.tensor(x, func, n, out=True) for x, n in ((dq, "dq"), (dk, "dk"), (dv, "dv"))]
        pds = st.ptr(dsinks, func, "dsinks", out=True)
        C.check(func, call(ctypes.byref(sp.spec), *ins, plse, tdo, *outs, _fptr(pds)))
    return dq, dk, dv, dsinks


class _Handle:
    """A library object: close() (also on garbage collection) destroys it, once."""
    _h, _destroy = None, None  # the handle; the name of its attn_*_destroy

    def close(self):
        if self._h:
            getattr(C.lib, self._destroy)(self._h)
            self._h = None
            self._closed()

    def _closed(self):
        pass

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


class Context(_Handle):
    """A compute context: backend "auto" (CUDA when a device is present), "cpu" or "cuda";
    device: CUDA ordinal; threads: CPU threads (0: OpenMP's default); stream: a CUDA
    stream handle (int, e.g. torch.cuda.current_stream().cuda_stream) or None."""
    _destroy = "attn_ctx_destroy"

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

    def forward(self, q, k, v, **spec):
        """(o [B, Sq, Hq, Dv] in q's dtype, lse [B, Hq, Sq] float32). Keywords: causal,
        window=(left, right) (-1: unbounded), softcap, scale (None: 1/sqrt(Dqk)), sinks [Hq],
        alibi_slopes [Hq], cu_seqlens_q / cu_seqlens_kv (varlen, B = 1), block_mask =
        (mask [num_q_blocks, num_k_blocks] uint8, block_q, block_k). A KV cache (forward
        only): block_table [B, pages_per_seq] int32 with k, v [num_pages, page_size, Hkv, D]
        (paged), and/or seqused_kv [B] int32, the keys each batch uses."""
        return _fwd_call(self, "attn_fwd", q, k, v, spec,
                         lambda sp, *args: C.lib.attn_fwd(self._h, sp, *args))

    def backward(self, q, k, v, o, lse, dout, **spec):
        """(dq, dk, dv float32 in the layouts of q, k, v; dsinks [Hq] float32 or None) from
        forward's o and lse and the output gradient dout; the same keywords as forward."""
        return _bwd_call(self, "attn_bwd", q, k, v, o, lse, dout, spec,
                         lambda sp, *args: C.lib.attn_bwd(self._h, sp, *args))

    # ---- the block API: what ring mode is built on (split-KV, schedules of one's own) ----
    def state(self, q, k, v, rows=None):
        """A new float32 online-softmax state for q's heads and rows (or `rows` rows) in
        arrays of q's kind, initialised (m = -inf, l = 0, acc = 0); k and v give the spec's
        remaining dims, kept with the state for finalize."""
        st = State(q, rows, _dims(q, k, v))
        with _Call(self) as call:
            C.check("attn_state_init", C.lib.attn_state_init(self._h, st._c(call, "attn_state_init")))
        return st

    def forward_block(self, state, q, k, v, q_row0=0, q_pos0=0, k_pos0=0, seq_q=0, seq_kv=0,
                      **spec):
        """Folds this K/V block into the state of q's rows (state rows q_row0 ...); the
        positions are global (causal, window, ALiBi, masks); seq_q / seq_kv: the global
        lengths (0: q's / k's)."""
        func = "attn_fwd_block"
        pos = C.BlockPos(q_row0, q_pos0, k_pos0, seq_q, seq_kv)
        with _Call(self) as st:
            sp = _Spec(func, st, _dims(q, k, v), **spec)
            cs = state._c(st, func)
            ins = [st.tensor(x, func, n) for x, n in ((q, "q"), (k, "k"), (v, "v"))]
            C.check(func, C.lib.attn_fwd_block(self._h, ctypes.byref(sp.spec), cs, *ins, ctypes.byref(pos)))

    def merge(self, dst, src):
        """dst := merge(dst, src): states of the same rows over disjoint key sets."""
        func = "attn_state_merge"
        with _Call(self) as st:
            C.check(func, C.lib.attn_state_merge(self._h, dst._c(st, func), src._c(st, func, "src", False)))

    def finalize(self, state, out_like=None, **spec):
        """(o [B, rows, Hq, Dv] in out_like's dtype (default float32), lse [B, Hq, rows])
        from the state; sinks (a spec keyword) enter here, once."""
        func = "attn_state_finalize"
        B, H, rows, Dv = state.acc.shape
        o = A.new_like(out_like if out_like is not None else state.acc, (B, rows, H, Dv))
        lse = A.new_like(state.acc, (B, H, rows), float32=True)
        with _Call(self) as st:
            sp = _Spec(func, st, state.dims, **spec)
            cs = state._c(st, func, "state", False)
            to, plse = st.tensor(o, func, "o", out=True), st.ptr(lse, func, "lse", out=True)
            C.check(func, C.lib.attn_state_finalize(self._h, ctypes.byref(sp.spec), cs, to, _fptr(plse)))
        return o, lse

    def backward_prepare(self, q, k, v, o, dout, lse, **spec):
        """(delta [B, Hq, Sq] = rowsum(dO * O), dsinks [Hq] or None) before the blocks."""
        func = "attn_bwd_prepare"
        B, Sq, Hq = _dim(o, 0), _dim(o, 1), _dim(o, 2)
        delta = A.new_like(o, (B, Hq, Sq), float32=True)
        dsinks = A.new_like(o, (Hq,), float32=True) if spec.get("sinks") is not None else None
        if dsinks is not None:
            dsinks[:] = 0  # the call adds into it
        with _Call(self) as st:
            sp = _Spec(func, st, _dims(q, k, v), **spec)
            to, tdo = st.tensor(o, func, "o"), st.tensor(dout, func, "dout")
            plse = _f32_ptr(st, lse, func, "lse")
            pd, pds = st.ptr(delta, func, "delta", out=True), st.ptr(dsinks, func, "dsinks", inout=True)
            C.check(func, C.lib.attn_bwd_prepare(self._h, ctypes.byref(sp.spec), to, tdo, plse,
                                                 _fptr(pd), _fptr(pds)))
        return delta, dsinks

    def backward_block(self, q, k, v, dout, lse, delta, dq, dk, dv, q_row0=0, q_pos0=0,
                       k_pos0=0, seq_q=0, seq_kv=0, **spec):
        """Adds (+=) this K/V block's gradient into the float32 dq, dk, dv (in place); lse
        and delta [B, Hq, lse_rows] are indexed by state rows (q_row0 + local row)."""
        func = "attn_bwd_block"
        pos = C.BlockPos(q_row0, q_pos0, k_pos0, seq_q, seq_kv)
        with _Call(self) as st:
            sp = _Spec(func, st, _dims(q, k, v), **spec)
            ins = [st.tensor(x, func, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout"))]
            plse, pdelta = _f32_ptr(st, lse, func, "lse"), _f32_ptr(st, delta, func, "delta")
            outs = [st.tensor(x, func, n, inout=True) for x, n in ((dq, "dq"), (dk, "dk"), (dv, "dv"))]
            C.check(func, C.lib.attn_bwd_block(self._h, ctypes.byref(sp.spec), *ins, plse, pdelta,
                                               int(lse.shape[-1]), *outs, ctypes.byref(pos)))

    def last_stats(self):
        """What the last call computed: dict of flops_computed, tiles_computed, tiles_skipped."""
        s = C.Stats()
        C.check("attn_ctx_last_stats", C.lib.attn_ctx_last_stats(self._h, ctypes.byref(s)))
        return {"flops_computed": s.flops_computed, "tiles_computed": s.tiles_computed,
                "tiles_skipped": s.tiles_skipped}


class State:
    """A float32 online-softmax state (Context.state): m, l [B, Hq, rows] (natural-log
    units of the final scores), acc [B, Hq, rows, Dv] (unnormalised output), as arrays of
    the kind Context.state was given; dims = (Hq, Hkv, Dqk, Dv) of its spec."""

    def __init__(self, like, rows, dims):
        B, Sq, Hq, Dv = _dim(like, 0), _dim(like, 1), dims[0], dims[3]
        rows = Sq if rows is None else int(rows)
        self.m = A.new_like(like, (B, Hq, rows), float32=True)
        self.l = A.new_like(like, (B, Hq, rows), float32=True)
        self.acc = A.new_like(like, (B, Hq, rows, Dv), float32=True)
        self.dims = dims

    def _c(self, stage, func, name="state", writes=True):
        """The attn_state for one call (staged, and copied back when the call writes it)."""
        B, H, rows, Dv = self.acc.shape
        ptrs = [stage.ptr(x, func, f"{name}.{n}", inout=writes) for x, n in
                ((self.m, "m"), (self.l, "l"), (self.acc, "acc"))]
        return ctypes.byref(C.State(*ptrs, B, H, rows, Dv))


class Group(_Handle):
    """Ranks of an MPI communicator (an mpi4py communicator; MPI must be initialised, as
    importing mpi4py does) split into tp x cp: tp consecutive ranks share heads, cp ranks
    form the ring. Collective: every rank of comm constructs it."""
    _destroy = "attn_group_destroy"

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

    def ring_forward(self, q, k, v, seq_q, seq_kv=None, layout="zigzag", **spec):
        """Ring attention over this rank's CP group: q, k, v are this rank's rows
        (cp_shard_rows of the global lengths); returns (o, lse) of those rows."""
        lay, skv = _layout("attn_ring_fwd", layout), int(seq_q if seq_kv is None else seq_kv)
        return _fwd_call(self.ctx, "attn_ring_fwd", q, k, v, spec, lambda sp, *args:
                         C.lib.attn_ring_fwd(self._h, sp, lay, int(seq_q), skv, *args))

    def ring_backward(self, q, k, v, o, lse, dout, seq_q, seq_kv=None, layout="zigzag", **spec):
        """(dq, dk, dv of this rank's rows, float32; dsinks [Hq] summed over the ring, or None)."""
        lay, skv = _layout("attn_ring_bwd", layout), int(seq_q if seq_kv is None else seq_kv)
        return _bwd_call(self.ctx, "attn_ring_bwd", q, k, v, o, lse, dout, spec, lambda sp, *args:
                         C.lib.attn_ring_bwd(self._h, sp, lay, int(seq_q), skv, *args))

    def split_kv_forward(self, q, k, v, seq_q, seq_kv=None, layout="contiguous", **spec):
        """Split-KV attention (context-parallel decode): q holds all seq_q query rows, the
        same on every CP rank; k, v this rank's key rows (cp_shard_rows of seq_kv). Returns
        (o, lse) of all query rows, bitwise the same on every rank."""
        lay, skv = _layout("attn_split_kv_fwd", layout), int(seq_q if seq_kv is None else seq_kv)
        return _fwd_call(self.ctx, "attn_split_kv_fwd", q, k, v, spec, lambda sp, *args:
                         C.lib.attn_split_kv_fwd(self._h, sp, lay, int(seq_q), skv, *args))

    def split_kv_backward(self, q, k, v, o, lse, dout, seq_q, seq_kv=None, layout="contiguous",
                          **spec):
        """(dq of all query rows summed over the CP group, dk, dv of this rank's key rows,
        float32; dsinks [Hq] or None)."""
        lay, skv = _layout("attn_split_kv_bwd", layout), int(seq_q if seq_kv is None else seq_kv)
        return _bwd_call(self.ctx, "attn_split_kv_bwd", q, k, v, o, lse, dout, spec,
                         lambda sp, *args: C.lib.attn_split_kv_bwd(self._h, sp, lay, int(seq_q),
                                                                   skv, *args))


class Layer(_Handle):
    """The tensor-parallel attention layer y = Attn(x W_q, x W_k, x W_v) W_o over a Group:
    heads sharded over its TP ranks (each rank passes its own weight shards, see heads),
    the attention a ring over its CP ranks when cp > 1 (x's rows as cp_shard_rows), RoPE
    on Q and K when rope_theta > 0 (GPT-NeoX half split, global positions). Keywords: the
    attention spec's (global: sinks / alibi_slopes are [Hq]); their arrays stay with the
    layer until close. All arrays float32: x, y [B, S_loc, d_model], w_qkv [d_model,
    hq*Dqk + hk*Dqk + hk*Dv] = this rank's [W_q | W_k | W_v] columns (head-major), w_o
    [hq*Dv, d_model] its rows of W_o. attention_dtype: "f32", "bf16" or "f16", the storage
    of the attention's Q, K, V, O inside the layer (None: bf16 on cuda, f32 on the host)."""
    _destroy = "attn_layer_destroy"

    def __init__(self, group, d_model, num_heads_q, num_heads_kv, head_dim, head_dim_v=0,
                 rope_theta=0.0, layout="zigzag", attention_dtype=None, **spec):
        func = "attn_layer_create"
        if attention_dtype not in C.LAYER_DTYPES:
            raise C.invalid(func, f"attention_dtype: {attention_dtype!r} is not None, 'f32', 'bf16' or 'f16'")
        self.group = group
        self._stage = A.Staging(group.ctx._h, group.ctx.device)
        cfg = C.LayerConfig()
        cfg.size, cfg.version = ctypes.sizeof(C.LayerConfig), C.LAYER_CONFIG_VERSION
        cfg.d_model, cfg.rope_theta = int(d_model), float(rope_theta)
        cfg.layout = _layout(func, layout)
        cfg.attention_dtype = C.LAYER_DTYPES[attention_dtype]
        cfg.spec.size, cfg.spec.version = ctypes.sizeof(C.Spec), C.SPEC_VERSION
        cfg.spec.window_left = cfg.spec.window_right = -1
        try:
            self._spec = _Spec(func, self._stage, (num_heads_q, num_heads_kv, head_dim, head_dim_v),
                               spec=cfg.spec, **spec)
            h = ctypes.c_void_p()
            C.check(func, C.lib.attn_layer_create(ctypes.byref(h), group._h, ctypes.byref(cfg)))
        except BaseException:
            self._stage.finish(False)
            raise
        self._h, self._cfg = h, cfg
        hd = C.LayerHeads()
        C.check("attn_layer_get_heads", C.lib.attn_layer_get_heads(h, ctypes.byref(hd)))
        self.heads = {n: getattr(hd, n) for n, _ in C.LayerHeads._fields_}
        self._shapes = None

    def _closed(self):
        self._stage.finish(False)  # the spec arrays staged for the layer's life

    def forward(self, x, w_qkv, w_o, seq_global):
        """y [B, S_loc, d_model] (identical over the TP group)."""
        func = "attn_layer_fwd"
        if len(getattr(x, "shape", ())) != 3:
            raise C.invalid(func, f"x: expected [B, S_loc, d_model], got shape {getattr(x, 'shape', None)}")
        y = A.new_like(x, tuple(x.shape), float32=True)
        with _Call(self.group.ctx) as st:
            px, pw, po = (_f32_ptr(st, a, func, n) for a, n in ((x, "x"), (w_qkv, "w_qkv"), (w_o, "w_o")))
            py = _f32_ptr(st, y, func, "y", out=True)
            C.check(func, C.lib.attn_layer_fwd(self._h, int(x.shape[0]), int(seq_global), px, pw, po, py))
        self._shapes = (tuple(x.shape), tuple(w_qkv.shape), tuple(w_o.shape), x)
        return y

    def backward(self, dy):
        """(dx [B, S_loc, d_model] summed over TP, dw_qkv and dw_o: this rank's shards) of
        the last forward."""
        func = "attn_layer_bwd"
        if self._shapes is None:
            raise C.invalid(func, "layer: backward before forward")
        xs, ws, os_, x = self._shapes
        dx, dw, do = (A.new_like(x, sh, float32=True) for sh in (xs, ws, os_))
        with _Call(self.group.ctx) as st:
            pdy = _f32_ptr(st, dy, func, "dy")
            pdx, pdw, pdo = (_f32_ptr(st, a, func, n, out=True) for a, n in ((dx, "dx"), (dw, "dw_qkv"), (do, "dw_o")))
            C.check(func, C.lib.attn_layer_bwd(self._h, pdy, pdx, pdw, pdo))
        return dx, dw, do

    def dsinks(self):
        """d(sinks) of this rank's query heads [hq] from the last backward (needs sinks)."""
        func = "attn_layer_get_dsinks"
        out = A.new_like(self._shapes[3], (self.heads["hq"],), float32=True)
        with _Call(self.group.ctx) as st:
            C.check(func, C.lib.attn_layer_get_dsinks(self._h, _f32_ptr(st, out, func, "dsinks", out=True)))
        return out


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
