/* fwd_f32.cu — the float32 flash forward (SIMT: FFMA, no tensor cores) and its launcher:
 * float32 q/k/v/o, every DESIGN.md §2 feature, head dims read at run time (multiples of 8
 * up to FA_F32_DMAX), the same online-softmax state and block API as the bf16/f16 kernels.
 *
 * A CTA owns F32_ROWS query rows of one (batch, head) — one sequence's rows under varlen —
 * and walks the key tiles of their visible range (tiles the block mask excludes are never
 * loaded; keys no row of the CTA sees are zero-filled, so NaN/Inf in them stays out). The
 * FA_F32_TPR threads of a row compute its scores (one key in FA_F32_TPR each), reduce the
 * row maximum by shuffles, leave P in shared memory and accumulate O += P V on their
 * column pairs. One shot: O and LSE (sink in the denominator); block mode: the state. */
#include "f32_common.cuh"
#define FA_COMMON_LAUNCH_ONLY
#include "common.cuh" /* FA_LAUNCH_SMEM */

FA_KERNEL(F32_THREADS) flash_fwd_f32(const fa_params p) {
  FA_SMEM(smem);
  const int Dq = p.hd_qk, Dv = p.hd_v;
  float *sQ = (float *)smem;         /* [F32_ROWS][Dq + 1] */
  float *sK = sQ + F32_ROWS * (Dq + 1); /* [F32_BN][Dq + 1] */
  float *sV = sK + F32_BN * (Dq + 1);   /* [F32_BN][Dv + 1] */
  float *sP = sV + F32_BN * (Dv + 1);   /* [F32_ROWS][F32_BN] probabilities */
  const int tid = (int)threadIdx.x, r = tid / FA_F32_TPR, l = tid % FA_F32_TPR;
  const int b = (int)blockIdx.z, h = (int)blockIdx.y, hk = h / (int)p.group;

  int t = (int)blockIdx.x;
  if (p.causal && !p.table) t = (int)p.ntiles - 1 - t; /* longest rows first */
  fa_tile tile;
  if (!fa_get_tile(p, t, F32_ROWS, (int)p.sq, tile)) return;
  const fa_seg s = fa_fwd_seg(p, tile.seg, b);
  const int R0 = tile.r0, rows = tile.rows;
  int lo_first, hi_first, lo_last, hi_last;
  fa_row_keys(p, p.causal, s, R0, lo_first, hi_first);
  fa_row_keys(p, p.causal, s, R0 + rows - 1, lo_last, hi_last);
  const int kc0 = fa_max(lo_first, s.c0), kc1 = fa_min(hi_last + 1, s.c1);
  const f32_qrow q = f32_qrow_make(p, s, R0 + r, r < rows);
  const float alibi2 = p.alibi ? p.alibi[h] * FA_LOG2E : 0.0f;
  const float *gK = f32_at(p.k, p.pages ? 0 : b, 0, hk), *gV = f32_at(p.v, p.pages ? 0 : b, 0, hk);
  F32_LOAD_ROWS(sQ, f32_at(p.q, b, R0, h), p.q.ss, Dq, F32_ROWS, tid, r_ < rows);

  /* Online-softmax state of row r, log2 units; l_part is this thread's share of l. */
  const int64_t srow = (b * p.Hq + h) * p.st_rows + p.q_row0 + R0 + r;
  float m = -INFINITY, l_part = 0.0f, acc[F32_NP][2];
  FA_UNROLL
  for (int k = 0; k < F32_NP; k++) acc[k][0] = acc[k][1] = 0.0f;
  if (p.block_mode && r < rows) {
    m = p.st_m[srow] * FA_LOG2E;
    l_part = l == 0 ? p.st_l[srow] : 0.0f;
    FA_UNROLL
    for (int k = 0; k < F32_NP; k++) {
      const int c = 16 * k + 2 * l;
      if (c < Dv) {
        acc[k][0] = p.st_acc[srow * Dv + c];
        acc[k][1] = p.st_acc[srow * Dv + c + 1];
      }
    }
  }

  fa_ktile cur = {0, 0, 0, 0, 0};
  cur.kt = kc0 / F32_BN - 1;
  int have = kc0 < kc1 &&
             fa_next_ktile(p, s, R0, rows, F32_ROWS, F32_BN, lo_last, hi_first, kc0, kc1, cur);
  while (have) {
    const int ca = cur.ca, cb = cur.cb;
    FA_SYNC(); /* the previous tile's readers are done with sK, sV */
    if (p.pages)
      F32_LOAD_PAGED_KV_TILE(p, s, cur, ca, cb, b, hk, sK, sV, Dq, Dv, R0, rows, tid);
    else
      F32_LOAD_KV_TILE(p, s, cur, ca, cb, gK, gV, sK, sV, Dq, Dv, R0, rows, tid);
    FA_SYNC();
    float x[F32_NS], mx = m;
    FA_UNROLL
    for (int n = 0; n < F32_NS; n++) {
      const int j = l + FA_F32_TPR * n, key = ca + j;
      const float dot = f32_dot(sQ + r * (Dq + 1), sK + j * (Dq + 1), Dq);
      x[n] = f32_visible(p, s, q, key, cb) ? fa_score(p, dot, alibi2, fabsf((float)(q.ipos - key)))
                                           : -INFINITY;
      mx = fmaxf(mx, x[n]);
    }
    for (int o = 1; o < FA_F32_TPR; o *= 2) mx = fmaxf(mx, fa_shfl_xor(mx, o));
    const float mu = mx == -INFINITY ? 0.0f : mx; /* nothing visible yet: P = 0, not NaN */
    const float alpha = exp2f(m - mu);
    m = mx;
    l_part *= alpha;
    FA_UNROLL
    for (int k = 0; k < F32_NP; k++) {
      acc[k][0] *= alpha;
      acc[k][1] *= alpha;
    }
    FA_UNROLL
    for (int n = 0; n < F32_NS; n++) {
      const float pv = exp2f(x[n] - mu);
      l_part += pv;
      sP[r * F32_BN + l + FA_F32_TPR * n] = pv;
    }
    fa_syncwarp(); /* the row's P is written (a row's threads share one warp) */
    for (int j = 0; j < cb - ca; j++) f32_axpy(acc, sP[r * F32_BN + j], sV + j * (Dv + 1), l, Dv);
    have = fa_next_ktile(p, s, R0, rows, F32_ROWS, F32_BN, lo_last, hi_first, kc0, kc1, cur);
  }

  for (int o = 1; o < FA_F32_TPR; o *= 2) l_part += fa_shfl_xor(l_part, o);
  if (r >= rows) return;
  if (p.block_mode) {
    if (l == 0) {
      p.st_m[srow] = m / FA_LOG2E;
      p.st_l[srow] = l_part;
    }
    FA_UNROLL
    for (int k = 0; k < F32_NP; k++) {
      const int c = 16 * k + 2 * l;
      if (c < Dv) {
        p.st_acc[srow * Dv + c] = acc[k][0];
        p.st_acc[srow * Dv + c + 1] = acc[k][1];
      }
    }
    return;
  }
  const float sink2 = p.sinks ? p.sinks[h] * FA_LOG2E : -INFINITY;
  float inv, lse2;
  fa_row_finish(m, l_part, sink2, &inv, &lse2);
  float *o = (float *)p.o.p + b * p.o.sb + (R0 + r) * p.o.ss + h * p.o.sh; /* [Dv] */
  FA_UNROLL
  for (int k = 0; k < F32_NP; k++) {
    const int c = 16 * k + 2 * l;
    if (c < Dv) {
      o[c] = acc[k][0] * inv;
      o[c + 1] = acc[k][1] * inv;
    }
  }
  if (l == 0 && p.lse) p.lse[(b * p.Hq + h) * p.lse_rows + p.q_row0 + R0 + r] = lse2 / FA_LOG2E;
}

extern "C" int attn_cuda__fwd_f32(const fa_call *c) {
  const attn_cuda_problem *pb = c->pb;
  fa_params p = fa_fwd_params(c);
  int64_t grid_x = 0;
  int e = fa_query_grid(&p, c, F32_ROWS, &grid_x);
  if (e) return e;
  const size_t smem = (size_t)(F32_ROWS * (p.hd_qk + 1) + F32_BN * (p.hd_qk + 1) +
                               F32_BN * (p.hd_v + 1) + F32_ROWS * F32_BN) * 4;
  FA_LAUNCH_SMEM(e, flash_fwd_f32, dim3((unsigned)grid_x, (unsigned)pb->Hq, (unsigned)pb->B),
                 dim3(F32_THREADS), smem, c->stream, p);
  return e;
}
