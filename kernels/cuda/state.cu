/* state.cu — the CUDA kernels that do not depend on the head dim: varlen tile tables,
 * state init / merge / finalize (sinks applied here, once), and the backward's
 * delta = rowsum(dO*O) with d(sinks) summed in a fixed order. */
#include <math.h>
#include <string.h>

#include "device.cuh"
#include "instance.h"
#include "traits.h"

#define TABLE_THREADS 256

/* One CTA: per chunk of 256 sequences, tiles per sequence, an inclusive scan, then each
 * thread writes its sequence's entries. */
FA_KERNEL_GENERIC fa_build_tiles_kernel(const int32_t *cu, int32_t nseq, int64_t pos0,
                                        int64_t count, const int32_t *cu_o, int64_t opos0,
                                        int64_t ocount, int require_other, int32_t tile,
                                        int32_t *table) {
  FA_SMEM(smem);
  int32_t *scan = (int32_t *)smem; /* [TABLE_THREADS] */
  const int tid = (int)threadIdx.x;
  int64_t base = 0;
  for (int32_t chunk = 0; chunk < nseq; chunk += TABLE_THREADS) {
    const int32_t s = chunk + tid;
    int64_t a = 0, e = 0, n = 0;
    if (s < nseq) {
      a = (cu[s] > pos0 ? cu[s] : pos0) - pos0;
      e = (cu[s + 1] < pos0 + count ? cu[s + 1] : pos0 + count) - pos0;
      int other = 1;
      if (require_other) {
        int64_t oa = cu_o[s] > opos0 ? cu_o[s] : opos0;
        int64_t oe = cu_o[s + 1] < opos0 + ocount ? cu_o[s + 1] : opos0 + ocount;
        other = oa < oe;
      }
      if (e > a && other) n = (e - a + tile - 1) / tile;
    }
    scan[tid] = (int32_t)n;
    FA_SYNC();
    for (int d = 1; d < TABLE_THREADS; d *= 2) {
      int32_t add = tid >= d ? scan[tid - d] : 0;
      FA_SYNC();
      scan[tid] += add;
      FA_SYNC();
    }
    const int64_t first = base + scan[tid] - n;
    for (int64_t k = 0; k < n; k++) {
      int32_t *ent = table + 4 * (first + k + 1);
      ent[0] = s;
      ent[1] = (int32_t)(a + k * tile);
      ent[2] = (int32_t)(e - a - k * tile < tile ? e - a - k * tile : tile);
      ent[3] = 0;
    }
    base += scan[TABLE_THREADS - 1];
    FA_SYNC();
  }
  if (tid == 0) {
    table[0] = (int32_t)base;
    table[1] = table[2] = table[3] = 0;
  }
}

#ifndef ATTN_CUDA_EMULATE
#define LAUNCH_STATUS() ((int)cudaGetLastError())
#else
#define LAUNCH_STATUS() 0
#endif

extern "C" int64_t attn_cuda__table_entries(int64_t count, int32_t num_seqs, int32_t min_tile) {
  return (count + min_tile - 1) / min_tile + num_seqs + 1;
}

extern "C" int attn_cuda__build_tiles(const int32_t *cu, int32_t num_seqs, int64_t pos0,
                                      int64_t count, const int32_t *cu_other,
                                      int64_t other_pos0, int64_t other_count,
                                      int require_other, int32_t tile, int32_t *table,
                                      void *stream) {
  FA_LAUNCH(fa_build_tiles_kernel, dim3(1), dim3(TABLE_THREADS), TABLE_THREADS * 4, stream, cu,
            num_seqs, pos0, count, cu_other, other_pos0, other_count, require_other, tile, table);
  return LAUNCH_STATUS();
}

/* ---- state ------------------------------------------------------------------------------ */
FA_KERNEL_GENERIC fa_fill_kernel(float *x, int64_t n, float v) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = v;
}

static unsigned grid_for(int64_t n, int threads) {
  int64_t g = (n + threads - 1) / threads;
  return (unsigned)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

extern "C" int attn_cuda__state_init(attn_state *st, void *stream) {
  const int64_t rows = st->batch * st->heads * st->rows;
  FA_LAUNCH(fa_fill_kernel, dim3(grid_for(rows, 256)), dim3(256), 0, stream, st->m, rows,
            -INFINITY);
  FA_LAUNCH(fa_fill_kernel, dim3(grid_for(rows, 256)), dim3(256), 0, stream, st->l, rows, 0.0f);
  FA_LAUNCH(fa_fill_kernel, dim3(grid_for(rows * st->head_dim_v, 256)), dim3(256), 0, stream,
            st->acc, rows * st->head_dim_v, 0.0f);
  return LAUNCH_STATUS();
}

/* words 32-bit words at p set to 0 on the stream (float 0.0f is all zero bits). */
extern "C" int attn_cuda__zero(void *p, int64_t words, void *stream) {
  if (words <= 0) return 0;
  FA_LAUNCH(fa_fill_kernel, dim3(grid_for(words, 256)), dim3(256), 0, stream, (float *)p, words, 0.0f);
  return LAUNCH_STATUS();
}

/* One warp per row (rows are warp-uniform, so the early return keeps warps whole). */
FA_KERNEL_GENERIC fa_merge_kernel(float *dm, float *dl, float *dacc, const float *sm,
                                  const float *sl, const float *sacc, int64_t rows, int64_t D) {
  const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = (int)threadIdx.x % 32;
  if (r >= rows) return;
  const float ma = dm[r], mb = sm[r], m = fmaxf(ma, mb);
  if (m == -INFINITY) return; /* both empty */
  const float a = expf(ma - m), bb = expf(mb - m);
  for (int64_t d = lane; d < D; d += 32) dacc[r * D + d] = dacc[r * D + d] * a + sacc[r * D + d] * bb;
  fa_syncwarp(); /* every lane has read dm[r], dl[r] */
  if (lane == 0) {
    dm[r] = m;
    dl[r] = dl[r] * a + sl[r] * bb;
  }
}

extern "C" int attn_cuda__state_merge(attn_state *dst, const attn_state *src, void *stream) {
  const int64_t rows = dst->batch * dst->heads * dst->rows;
  FA_LAUNCH(fa_merge_kernel, dim3((unsigned)((rows + 7) / 8)), dim3(256), 0, stream, dst->m,
            dst->l, dst->acc, src->m, src->l, src->acc, rows, dst->head_dim_v);
  return LAUNCH_STATUS();
}

/* Element i of a tensor in attn_dtype `dtype` (0 f32, 1 bf16, 2 f16), as float. */
FA_DEV float fa_load(const void *p, int64_t i, int dtype) {
  if (dtype == 0) return ((const float *)p)[i];
  const uint16_t h = ((const uint16_t *)p)[i];
  return dtype == 1 ? fa_bf16_to_float(h) : fa_f16_to_float(h);
}
FA_DEV void fa_store(void *p, int64_t i, float v, int dtype) {
  if (dtype == 0) {
    ((float *)p)[i] = v;
    return;
  }
  uint32_t two = dtype == 1 ? fa_pack_bf16(v, 0.0f) : fa_pack_f16(v, 0.0f);
  ((uint16_t *)p)[i] = (uint16_t)(two & 0xFFFFu);
}

/* A finished row (natural units): max mm, sum l and the sink logit give the factor that
 * turns the accumulator into O, and the LSE; the sink enters here, once. */
FA_DEV void fa_finish_row(float mm, float l, float sink, float *inv, float *lse) {
  const float top = fmaxf(mm, sink);
  *inv = 0.0f;
  *lse = -INFINITY;
  if (top == -INFINITY) return;
  const float sm = expf(mm - top), z = l * sm + expf(sink - top);
  *inv = sm / z;
  *lse = top + logf(z);
}

/* One warp per (b, h, row): O = acc / (l + e^(sink - m)) rescaled, LSE = m + log(...). */
FA_KERNEL_GENERIC fa_finalize_kernel(const float *m, const float *l, const float *acc,
                                     int64_t B, int64_t H, int64_t rows, int64_t D,
                                     const float *sinks, attn_cuda_view o, float *lse, int dtype) {
  const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = (int)threadIdx.x % 32;
  if (r >= B * H * rows) return;
  const int64_t i = r % rows, h = r / rows % H, b = r / (rows * H);
  float inv, out;
  fa_finish_row(m[r], l[r], sinks ? sinks[h] : -INFINITY, &inv, &out);
  const int64_t orow = b * o.sb + i * o.ss + h * o.sh; /* element of o[b, i, h, 0] */
  for (int64_t d = lane; d < D; d += 32) fa_store(o.p, orow + d, acc[r * D + d] * inv, dtype);
  if (lane == 0 && lse) lse[r] = out;
}

/* Split-KV, step two: one warp per row (b, h, i) of the call folds the nsplit partial
 * states (instance.h's layout, R rows each) in split order, so the result does not depend
 * on the schedule; with st_m set, the carried state of row q_row0 + i comes first and the
 * sum goes back there, else O and LSE are written (sinks once, as finalize). Each split's
 * weight e^(m_s - max) is taken once; a lane holds D / 32 columns (D <= FA_COMBINE_DMAX,
 * which dispatch.c's plan keeps to). */
FA_KERNEL_GENERIC fa_split_combine_kernel(const float *pm, const float *pl, const float *pacc,
                                          int nsplit, int64_t B, int64_t H, int64_t sq,
                                          int64_t D, float *st_m, float *st_l, float *st_acc,
                                          int64_t st_rows, int64_t q_row0, const float *sinks,
                                          attn_cuda_view o, float *lse, int64_t lse_rows,
                                          int dtype) {
  const int64_t R = B * H * sq, r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = (int)threadIdx.x % 32;
  if (r >= R) return;
  const int64_t i = r % sq, bh = r / sq, h = bh % H, b = bh / H;
  const int64_t srow = bh * st_rows + q_row0 + i; /* the carried state's row */
  float mx = st_m ? st_m[srow] : -INFINITY;
  for (int s = 0; s < nsplit; s++) mx = fmaxf(mx, pm[s * R + r]);
  if (mx == -INFINITY && st_m) return; /* nothing seen anywhere: the state stays as it is */
  const float mu = mx == -INFINITY ? 0.0f : mx;
  float l = 0.0f, a[FA_COMBINE_DMAX / 32]; /* a[k]: column lane + 32 k */
  const float wc = st_m ? expf(st_m[srow] - mu) : 0.0f;
  if (st_m) l = st_l[srow] * wc;
  FA_UNROLL
  for (int k = 0; k < FA_COMBINE_DMAX / 32; k++) {
    const int64_t d = lane + 32 * k;
    a[k] = st_m && d < D ? st_acc[srow * D + d] * wc : 0.0f;
  }
  for (int s = 0; s < nsplit; s++) {
    const float w = expf(pm[s * R + r] - mu);
    l += pl[s * R + r] * w;
    const float *ps = pacc + (s * R + r) * D;
    FA_UNROLL
    for (int k = 0; k < FA_COMBINE_DMAX / 32; k++)
      if (lane + 32 * k < D) a[k] += ps[lane + 32 * k] * w;
  }
  float inv = 1.0f, out = 0.0f;
  if (!st_m) fa_finish_row(mx, l, sinks ? sinks[h] : -INFINITY, &inv, &out);
  const int64_t orow = b * o.sb + i * o.ss + h * o.sh; /* element of o[b, i, h, 0] */
  FA_UNROLL
  for (int k = 0; k < FA_COMBINE_DMAX / 32; k++) {
    const int64_t d = lane + 32 * k;
    if (d >= D) continue;
    if (st_m) st_acc[srow * D + d] = a[k];
    else fa_store(o.p, orow + d, a[k] * inv, dtype);
  }
  fa_syncwarp(); /* every lane has read st_m[srow] */
  if (lane != 0) return;
  if (st_m) {
    st_m[srow] = mx;
    st_l[srow] = l;
  } else if (lse) {
    lse[bh * lse_rows + q_row0 + i] = out;
  }
}

extern "C" int attn_cuda__split_combine(const fa_call *c) {
  const attn_cuda_problem *p = c->pb;
  const int64_t R = FA_PART_ROWS(p);
  const float *pm = c->part, *pl = c->part + c->nsplit * R, *pacc = c->part + 2 * c->nsplit * R;
  const attn_state *st = c->st;
  FA_LAUNCH(fa_split_combine_kernel, dim3((unsigned)((R + 7) / 8)), dim3(256), 0, c->stream, pm,
            pl, pacc, c->nsplit, p->B, p->Hq, p->sq, p->Dv, st ? st->m : NULL, st ? st->l : NULL,
            st ? st->acc : NULL, st ? st->rows : 0, p->q_row0, p->sinks, c->o, c->lse,
            c->lse_rows, p->dtype);
  return LAUNCH_STATUS();
}

extern "C" int attn_cuda__finalize(const attn_cuda_problem *p, const attn_state *st,
                                   attn_cuda_view o, float *lse, void *stream) {
  const int64_t rows = st->batch * st->heads * st->rows;
  FA_LAUNCH(fa_finalize_kernel, dim3((unsigned)((rows + 7) / 8)), dim3(256), 0, stream, st->m,
            st->l, st->acc, st->batch, st->heads, st->rows, st->head_dim_v, p->sinks, o, lse,
            p->dtype);
  return LAUNCH_STATUS();
}

/* ---- backward prepare ------------------------------------------------------------------ */
/* One warp per (b, h, i): delta = dO . O. */
FA_KERNEL_GENERIC fa_delta_kernel(attn_cuda_view o, attn_cuda_view dout, int64_t B, int64_t H,
                                  int64_t S, int64_t D, float *delta, int dtype) {
  const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = (int)threadIdx.x % 32;
  if (r >= B * H * S) return;
  const int64_t i = r % S, h = r / S % H, b = r / (S * H);
  const int64_t x = b * o.sb + i * o.ss + h * o.sh, y = b * dout.sb + i * dout.ss + h * dout.sh;
  float acc = 0.0f;
  for (int64_t d = lane; d < D; d += 32) acc += fa_load(o.p, x + d, dtype) * fa_load(dout.p, y + d, dtype);
  for (int s = 16; s > 0; s /= 2) acc += fa_shfl_xor(acc, s);
  if (lane == 0) delta[r] = acc;
}

/* One CTA per head: dsinks[h] += -sum_{b,i} e^(sink - lse) * delta, in a fixed order
 * (strided per thread, then a fixed tree), so the result is bitwise repeatable. */
FA_KERNEL_GENERIC fa_dsinks_kernel(const float *lse, const float *delta, const float *sinks,
                                   int64_t B, int64_t H, int64_t S, float *dsinks) {
  FA_SMEM(smem);
  float *red = (float *)smem; /* [256] */
  const int tid = (int)threadIdx.x;
  const int64_t h = blockIdx.x;
  const float sink = sinks[h];
  float acc = 0.0f;
  for (int64_t n = tid; n < B * S; n += 256) {
    const int64_t r = (n / S * H + h) * S + n % S;
    if (lse[r] != -INFINITY) acc += expf(sink - lse[r]) * delta[r];
  }
  red[tid] = acc;
  FA_SYNC();
  for (int d = 128; d > 0; d /= 2) {
    if (tid < d) red[tid] += red[tid + d];
    FA_SYNC();
  }
  if (tid == 0) dsinks[h] -= red[0];
}

extern "C" int attn_cuda__bwd_prepare(const attn_cuda_problem *p, attn_cuda_view o,
                                      attn_cuda_view dout, const float *lse, float *delta,
                                      float *dsinks, void *stream) {
  const int64_t rows = p->B * p->Hq * p->sq;
  FA_LAUNCH(fa_delta_kernel, dim3((unsigned)((rows + 7) / 8)), dim3(256), 0, stream, o, dout,
            p->B, p->Hq, p->sq, p->Dv, delta, p->dtype);
  if (dsinks && p->sinks)
    FA_LAUNCH(fa_dsinks_kernel, dim3((unsigned)p->Hq), dim3(256), 256 * 4, stream, lse, delta,
              p->sinks, p->B, p->Hq, p->sq, dsinks);
  return LAUNCH_STATUS();
}

extern "C" const char *attn_cuda__error_string(int err) {
#ifndef ATTN_CUDA_EMULATE
  return cudaGetErrorString((cudaError_t)err);
#else
  return err ? "emulated launch error" : "no error";
#endif
}

extern "C" int attn_cuda__device_cc(void) {
#ifndef ATTN_CUDA_EMULATE
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return 0;
  return 10 * major + minor;
#else
  return 90;
#endif
}

extern "C" int attn_cuda__hopper_default(void) {
#ifndef ATTN_CUDA_EMULATE
  return 1;
#else
  return 0;
#endif
}

/* The emulator's "device" has 16 SMs: enough that small test shapes split their keys. */
extern "C" int attn_cuda__device_sms(void) {
#ifndef ATTN_CUDA_EMULATE
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 0;
  return n;
#else
  return 16;
#endif
}
