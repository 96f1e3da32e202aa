"""_capi.py — libattnrun's C interface (include/attnrun.h) in ctypes: loading the library,
the structs the binding passes (attn_tensor, attn_spec, attn_block_mask, attn_ctx_config,
attn_group_config, attn_layer_config, attn_state, attn_block_pos, attn_cp_shard,
attn_stats), the prototypes, and statuses as exceptions.

The struct layouts mirror attnrun.h field for field (the C side checks each struct's size
and version, so a mismatch fails with a message instead of misreading memory)."""
import ctypes
import ctypes.util
import os
from pathlib import Path

c_i32, c_i64, c_u32, c_u64, c_f32, c_p = (ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32,
                                          ctypes.c_uint64, ctypes.c_float, ctypes.c_void_p)

# attn_dtype, attn_device, attn_backend, attn_cp_layout, attn_copy_kind
F32, BF16, F16 = 0, 1, 2
DEVICE_HOST, DEVICE_CUDA = 0, 1
BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}
LAYOUTS = {"contiguous": 0, "zigzag": 1}
COPY_HOST_TO_CTX, COPY_CTX_TO_HOST = 0, 1


class Tensor(ctypes.Structure):
    _fields_ = [("data", c_p), ("dtype", c_i32), ("device", c_i32), ("shape", c_i64 * 4),
                ("stride", c_i64 * 4)]


class BlockMask(ctypes.Structure):
    _fields_ = [("block_q", c_i32), ("block_k", c_i32), ("num_q_blocks", c_i64),
                ("num_k_blocks", c_i64), ("mask", c_p)]


class KvCache(ctypes.Structure):
    _fields_ = [("block_table", c_p), ("pages_per_seq", c_i32), ("seqused_kv", c_p)]


SPEC_VERSION = 2
LAYER_CONFIG_VERSION = 2


class Spec(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", c_u32), ("num_heads_q", c_i32),
                ("num_heads_kv", c_i32), ("head_dim_qk", c_i32), ("head_dim_v", c_i32),
                ("scale", c_f32), ("causal", c_i32), ("window_left", c_i64),
                ("window_right", c_i64), ("softcap", c_f32), ("sinks", c_p),
                ("alibi_slopes", c_p), ("cu_seqlens_q", c_p), ("cu_seqlens_kv", c_p),
                ("num_seqs", c_i32), ("block_mask", ctypes.POINTER(BlockMask)),
                ("kv_cache", ctypes.POINTER(KvCache))]

    def __init__(self):
        super().__init__()
        self.size, self.version = ctypes.sizeof(Spec), SPEC_VERSION
        self.window_left = self.window_right = -1


class CtxConfig(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", c_u32), ("backend", c_i32),
                ("device", c_i32), ("num_threads", c_i32), ("force_scalar", c_i32),
                ("stream", c_p), ("cpu_amx", c_i32)]


class GroupConfig(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", c_u32), ("tp", c_i32), ("cp", c_i32),
                ("timeout_s", ctypes.c_double)]


class GroupInfo(ctypes.Structure):
    _fields_ = [(n, c_i32) for n in ("rank", "size", "tp_rank", "tp_size", "cp_rank", "cp_size")]


class State(ctypes.Structure):
    _fields_ = [("m", c_p), ("l", c_p), ("acc", c_p), ("batch", c_i64), ("heads", c_i64),
                ("rows", c_i64), ("head_dim_v", c_i64)]


class BlockPos(ctypes.Structure):
    _fields_ = [(n, c_i64) for n in ("q_row0", "q_pos0", "k_pos0", "seq_q", "seq_kv")]


class LayerConfig(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", c_u32), ("d_model", c_i64), ("spec", Spec),
                ("rope_theta", c_f32), ("layout", c_i32), ("attention_dtype", c_i32)]


LAYER_DTYPES = {None: -1, "f32": F32, "bf16": BF16, "f16": F16}  # -1: ATTN_LAYER_DTYPE_AUTO


class LayerHeads(ctypes.Structure):
    _fields_ = [(n, c_i32) for n in ("hq0", "hq", "hk0", "hk")]


class CpShard(ctypes.Structure):
    _fields_ = [("count", c_i32), ("start", c_i64 * 2), ("len", c_i64 * 2), ("rows", c_i64)]


class Stats(ctypes.Structure):
    _fields_ = [("flops_computed", ctypes.c_double), ("tiles_computed", c_i64),
                ("tiles_skipped", c_i64)]


class AttnError(RuntimeError):
    """A libattnrun call (or the binding's own argument check) failed: .code is the
    attn_status (1 = ATTN_ERR_INVALID_ARG, 2 = UNSUPPORTED, ...), .status its text, .message
    the library's attn_last_error() text, which names the argument."""

    def __init__(self, func, code, status, message):
        super().__init__(f"{func}: {status}: {message}")
        self.func, self.code, self.status, self.message = func, code, status, message


def _candidates():
    """Where libattnrun is looked for, in order: $ATTNRUN_LIBRARY, the build tree next to
    this package (python/../build), the loader's search path (an installed library)."""
    env = os.environ.get("ATTNRUN_LIBRARY")
    if env:
        return [env]
    here = Path(__file__).resolve().parent
    out = [str(p) for p in (here.parents[1] / "build" / "libattnrun.so",) if p.exists()]
    found = ctypes.util.find_library("attnrun")
    return out + ["libattnrun.so.0"] + ([found] if found else [])


def _load():
    errors = []
    for path in _candidates():
        try:
            # RTLD_GLOBAL: Open MPI's plugins resolve libmpi's symbols from the global scope.
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("attnrun: cannot load libattnrun (set ATTNRUN_LIBRARY to its path): "
                      + "; ".join(errors))


lib = _load()
PT, PS, PF = ctypes.POINTER(Tensor), ctypes.POINTER(Spec), ctypes.POINTER(c_f32)
_PROTOS = {
    "attn_version_string": (ctypes.c_char_p, []),
    "attn_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "attn_last_error": (ctypes.c_char_p, []),
    "attn_ctx_create": (ctypes.c_int, [ctypes.POINTER(c_p), ctypes.POINTER(CtxConfig)]),
    "attn_ctx_destroy": (ctypes.c_int, [c_p]),
    "attn_ctx_backend_name": (ctypes.c_char_p, [c_p]),
    "attn_ctx_device": (ctypes.c_int, [c_p]),
    "attn_ctx_alloc": (ctypes.c_int, [c_p, ctypes.c_size_t, ctypes.POINTER(c_p)]),
    "attn_ctx_free": (ctypes.c_int, [c_p, c_p]),
    "attn_ctx_copy": (ctypes.c_int, [c_p, c_p, c_p, ctypes.c_size_t, ctypes.c_int]),
    "attn_ctx_sync": (ctypes.c_int, [c_p]),
    "attn_ctx_last_stats": (ctypes.c_int, [c_p, ctypes.POINTER(Stats)]),
    "attn_fwd": (ctypes.c_int, [c_p, PS, PT, PT, PT, PT, PF]),
    "attn_bwd": (ctypes.c_int, [c_p, PS, PT, PT, PT, PT, PF, PT, PT, PT, PT, PF]),
    "attn_state_init": (ctypes.c_int, [c_p, ctypes.POINTER(State)]),
    "attn_fwd_block": (ctypes.c_int, [c_p, PS, ctypes.POINTER(State), PT, PT, PT,
                                      ctypes.POINTER(BlockPos)]),
    "attn_state_merge": (ctypes.c_int, [c_p, ctypes.POINTER(State), ctypes.POINTER(State)]),
    "attn_state_finalize": (ctypes.c_int, [c_p, PS, ctypes.POINTER(State), PT, PF]),
    "attn_bwd_prepare": (ctypes.c_int, [c_p, PS, PT, PT, PF, PF, PF]),
    "attn_bwd_block": (ctypes.c_int, [c_p, PS, PT, PT, PT, PT, PF, PF, c_i64, PT, PT, PT,
                                      ctypes.POINTER(BlockPos)]),
    "attn_group_create": (ctypes.c_int, [ctypes.POINTER(c_p), c_p, c_p,
                                         ctypes.POINTER(GroupConfig)]),
    "attn_group_destroy": (ctypes.c_int, [c_p]),
    "attn_group_get_info": (ctypes.c_int, [c_p, ctypes.POINTER(GroupInfo)]),
    "attn_cp_shard_rows": (ctypes.c_int, [ctypes.c_int, c_i32, c_i32, c_i64,
                                          ctypes.POINTER(CpShard)]),
    "attn_ring_fwd": (ctypes.c_int, [c_p, PS, ctypes.c_int, c_i64, c_i64, PT, PT, PT, PT, PF]),
    "attn_ring_bwd": (ctypes.c_int, [c_p, PS, ctypes.c_int, c_i64, c_i64, PT, PT, PT, PT, PF,
                                     PT, PT, PT, PT, PF]),
    "attn_split_kv_fwd": (ctypes.c_int, [c_p, PS, ctypes.c_int, c_i64, c_i64, PT, PT, PT, PT, PF]),
    "attn_split_kv_bwd": (ctypes.c_int, [c_p, PS, ctypes.c_int, c_i64, c_i64, PT, PT, PT, PT, PF,
                                         PT, PT, PT, PT, PF]),
    "attn_layer_create": (ctypes.c_int, [ctypes.POINTER(c_p), c_p, ctypes.POINTER(LayerConfig)]),
    "attn_layer_destroy": (ctypes.c_int, [c_p]),
    "attn_layer_get_heads": (ctypes.c_int, [c_p, ctypes.POINTER(LayerHeads)]),
    "attn_layer_fwd": (ctypes.c_int, [c_p, c_i64, c_i64, PF, PF, PF, PF]),
    "attn_layer_bwd": (ctypes.c_int, [c_p, PF, PF, PF, PF]),
    "attn_layer_get_dsinks": (ctypes.c_int, [c_p, PF]),
    "attn_flops_fwd": (ctypes.c_double, [PS, c_i64, c_i64, c_i64]),
}
for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args


def check(func, status):
    """Raises AttnError for a status other than ATTN_OK (0)."""
    if status != 0:
        raise AttnError(func, status, lib.attn_status_string(status).decode(),
                        lib.attn_last_error().decode())


def invalid(func, message):
    """The binding's own check of an argument, reported like the library's."""
    return AttnError(func, 1, "invalid argument", message)
