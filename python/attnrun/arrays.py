"""arrays.py — how the binding sees the caller's arrays: NumPy arrays (host memory) and
PyTorch tensors (host or CUDA memory) as attn_tensor views with their strides, new outputs
of the same kind, and host arrays staged through a CUDA context's memory.

A 4-D argument keeps its strides (BSHD and BHSD callers both work) as long as its last
dimension is contiguous; 1-D arguments (lse, sinks, slopes, cu_seqlens, masks) must be
contiguous. Nothing here copies a tensor that already lives where the context computes."""
import ctypes

from . import _capi as C

try:
    import numpy as np
except ImportError:  # the binding still loads; NumPy arrays are then simply not accepted
    np = None

_NP_DTYPES = {"float32": C.F32, "float16": C.F16}
_TORCH_DTYPES = {"torch.float32": C.F32, "torch.bfloat16": C.BF16, "torch.float16": C.F16}


def is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def is_numpy(x):
    return np is not None and isinstance(x, np.ndarray)


def describe(x, func, name):
    """(data pointer, attn_dtype, attn_device, shape, strides in elements) of an array."""
    if is_numpy(x):
        dt = _NP_DTYPES.get(str(x.dtype))
        if dt is None:
            raise C.invalid(func, f"{name}: NumPy dtype {x.dtype} is not float32 or float16")
        if any(s % x.itemsize for s in x.strides):
            raise C.invalid(func, f"{name}: strides {x.strides} are not whole elements")
        return (x.ctypes.data, dt, C.DEVICE_HOST, tuple(x.shape),
                tuple(s // x.itemsize for s in x.strides))
    if is_torch(x):
        dt = _TORCH_DTYPES.get(str(x.dtype))
        if dt is None:
            raise C.invalid(func, f"{name}: torch dtype {x.dtype} is not float32, bfloat16 or float16")
        dev = C.DEVICE_CUDA if x.device.type == "cuda" else C.DEVICE_HOST
        return x.data_ptr(), dt, dev, tuple(x.shape), tuple(x.stride())
    raise C.invalid(func, f"{name}: expected a NumPy array or a torch tensor, got {type(x).__name__}")


def tensor4(x, func, name):
    """attn_tensor of a 4-D array (the library checks shapes against each other)."""
    ptr, dt, dev, shape, stride = describe(x, func, name)
    if len(shape) != 4:
        raise C.invalid(func, f"{name}: expected 4 dimensions, got shape {shape}")
    t = C.Tensor()
    t.data, t.dtype, t.device = ptr, dt, dev
    t.shape[:], t.stride[:] = shape, stride
    return t


def new_like(x, shape, float32=False):
    """A new array of x's kind (NumPy, or torch on x's device): x's dtype, or float32.
    NumPy outputs start as NaN, so an element the library failed to write shows."""
    if is_numpy(x):
        return np.full(shape, np.nan, np.float32 if float32 else x.dtype)
    import torch
    return torch.empty(shape, dtype=torch.float32 if float32 else x.dtype, device=x.device)


def raw(x, func, name):
    """(data pointer, attn_device, bytes) of an array of any dtype."""
    if is_numpy(x):
        return x.ctypes.data, C.DEVICE_HOST, x.nbytes
    if is_torch(x):
        dev = C.DEVICE_CUDA if x.device.type == "cuda" else C.DEVICE_HOST
        return x.data_ptr(), dev, x.numel() * x.element_size()
    raise C.invalid(func, f"{name}: expected a NumPy array or a torch tensor, got {type(x).__name__}")


def vector(x, dtype, func, name):
    """A contiguous 1-D (or flat) array of dtype ("float32", "int32", "uint8"): NumPy
    arrays and lists are converted (copied when needed); torch tensors must match."""
    if x is None:
        return None
    if is_torch(x):
        if str(x.dtype) != "torch." + dtype or not x.is_contiguous():
            raise C.invalid(func, f"{name}: expected a contiguous torch.{dtype} tensor, got {x.dtype}")
        return x
    if np is None:
        raise C.invalid(func, f"{name}: NumPy is needed for a {type(x).__name__}")
    return np.ascontiguousarray(x, dtype=dtype)


class Staging:
    """Moves host (NumPy) arrays through a CUDA context's memory for one call: `ptr`
    copies an input in (or reserves an output) and returns the context pointer; `finish`
    copies outputs back and frees everything. On a host context, or for arrays already in
    device memory, it hands out the array's own pointer."""

    def __init__(self, ctx_handle, ctx_device):
        self.ctx, self.device, self.bufs, self.back = ctx_handle, ctx_device, [], []
        self.keep = []  # converted arrays whose pointers the call uses

    def ptr(self, x, func, name, out=False, inout=False):
        """out: the call writes x (copied back by finish); inout: it also reads it."""
        if x is None:
            return None
        ptr, dev, nbytes = raw(x, func, name)
        if dev == self.device:
            return ptr
        if dev == C.DEVICE_CUDA:
            raise C.invalid(func, f"{name}: a CUDA tensor, but the context computes on the host")
        if not (x.flags.c_contiguous if is_numpy(x) else x.is_contiguous()):
            raise C.invalid(func, f"{name}: a host array staged to the device must be C-contiguous")
        p = ctypes.c_void_p()
        C.check("attn_ctx_alloc", C.lib.attn_ctx_alloc(self.ctx, nbytes, ctypes.byref(p)))
        self.bufs.append(p)
        if out or inout:
            self.back.append((ptr, p, nbytes))
        if not out:
            C.check("attn_ctx_copy", C.lib.attn_ctx_copy(self.ctx, p, ptr, nbytes, C.COPY_HOST_TO_CTX))
        return p.value

    def tensor(self, x, func, name, out=False, inout=False):
        """The attn_tensor of a 4-D argument in context memory. A strided host input that
        must travel is copied contiguous first (it arrives with plain strides)."""
        contiguous = x.flags.c_contiguous if is_numpy(x) else getattr(x, "is_contiguous", lambda: True)()
        if not (out or inout or contiguous) and raw(x, func, name)[1] != self.device:
            x = np.ascontiguousarray(x) if is_numpy(x) else x.contiguous()
            self.keep.append(x)
        t = tensor4(x, func, name)
        t.data, t.device = self.ptr(x, func, name, out, inout), self.device
        return t

    def finish(self, ok):
        """Copies the outputs back (when the call succeeded) and frees the staging memory."""
        try:
            for host, p, nbytes in self.back if ok else []:
                C.check("attn_ctx_copy", C.lib.attn_ctx_copy(self.ctx, host, p, nbytes,
                                                             C.COPY_CTX_TO_HOST))
        finally:
            for p in self.bufs:
                C.lib.attn_ctx_free(self.ctx, p)
            self.bufs, self.back, self.keep = [], [], []
