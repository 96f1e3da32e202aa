/* bwd_f32.cu — the float32 flash backward (SIMT: FFMA, no tensor cores) and its launcher:
 * FlashAttention-2 with P recomputed from the final LSE, head dims read at run time, the
 * same block API and accumulators as the bf16/f16 backward (bwd_body.cuh).
 *
 * flash_dkdv_f32: a CTA owns F32_ROWS keys of one (batch, KV head) and walks the query rows
 * that can see them, for every query head of the GQA group, F32_BN rows at a time. The
 * FA_F32_TPR threads of a key compute its P^T and dS^T row, leave them in shared memory and
 * accumulate dV += P^T dO, dK += dS^T Q on their column pairs; dK and dV are added once.
 * With fuse_dq the CTA then re-partitions by query row and adds dQ += dS K with float32
 * atomics. flash_dq_f32: the deterministic dQ (fuse_dq off), query-major like the forward. */
#include "f32_common.cuh"
#define FA_COMMON_LAUNCH_ONLY
#include "common.cuh" /* FA_LAUNCH_SMEM */

#define B32_KEYS F32_ROWS /* keys per dK/dV CTA */
#define B32_BM F32_BN     /* query rows per step */
#define B32_LD (B32_BM + 1) /* row stride of the P^T / dS^T tiles */

/* dst[c] += acc[k] on the thread's column pairs below D (dst: one float32 row). */
FA_DEV void f32_add_row(float *dst, const float (&acc)[F32_NP][2], int l, int D) {
  FA_UNROLL
  for (int k = 0; k < F32_NP; k++) {
    const int c = 16 * k + 2 * l;
    if (c < D) {
      dst[c] += acc[k][0];
      dst[c + 1] += acc[k][1];
    }
  }
}

FA_KERNEL(F32_THREADS) flash_dkdv_f32(const fa_params p) {
  FA_SMEM(smem);
  const int Dq = p.hd_qk, Dv = p.hd_v;
  float *sK = (float *)smem;               /* [B32_KEYS][Dq + 1] */
  float *sV = sK + B32_KEYS * (Dq + 1);    /* [B32_KEYS][Dv + 1] */
  float *sQ = sV + B32_KEYS * (Dv + 1);    /* [B32_BM][Dq + 1] */
  float *sO = sQ + B32_BM * (Dq + 1);      /* [B32_BM][Dv + 1] dO */
  float *sP = sO + B32_BM * (Dv + 1);      /* [B32_KEYS][B32_LD] P^T */
  float *sS = sP + B32_KEYS * B32_LD;      /* [B32_KEYS][B32_LD] dS^T */
  float *sL = sS + B32_KEYS * B32_LD;      /* [B32_BM] lse, log2 units */
  float *sD = sL + B32_BM;                 /* [B32_BM] delta */
  const int tid = (int)threadIdx.x, kr = tid / FA_F32_TPR, l = tid % FA_F32_TPR;
  const int b = (int)blockIdx.z, hk = (int)blockIdx.y, group = (int)p.group;

  fa_tile tile;
  if (!fa_get_tile(p, (int)blockIdx.x, B32_KEYS, (int)p.skv, tile)) return;
  const fa_seg s = fa_make_seg(p, tile.seg);
  const int K0 = tile.r0, nk = tile.rows;
  /* Query rows that may see any of the keys (monotone in the key), within the segment. */
  int qlo, qhi, x0, x1;
  fa_key_rows(p, p.causal, s, K0, qlo, x0);
  fa_key_rows(p, p.causal, s, K0 + nk - 1, x1, qhi);
  qlo = fa_max(qlo, s.r0);
  qhi = fa_min(qhi, s.r1 - 1);
  if (qlo > qhi) return; /* no query sees these keys: their gradients stay as they are */
  const int nsteps = (qhi - qlo + B32_BM) / B32_BM, total = nsteps * group;

  /* The thread's key: the query rows that see it, its block-mask block, ALiBi origin. */
  int klo = (int)p.sq, khi = -1;
  if (kr < nk) fa_key_rows(p, p.causal, s, K0 + kr, klo, khi);
  const int kblk = p.bm ? (K0 + kr + s.kpos_col0) / p.bk : 0;
  const int kdist0 = s.qpos_row0 + s.off - s.kpos_col0 - (K0 + kr);

  F32_LOAD_ROWS(sK, f32_at(p.k, b, K0, hk), p.k.ss, Dq, B32_KEYS, tid,
                r_ < nk && fa_key_seen(p, p.causal, s, K0 + r_, qlo, qhi));
  F32_LOAD_ROWS(sV, f32_at(p.v, b, K0, hk), p.v.ss, Dv, B32_KEYS, tid,
                r_ < nk && fa_key_seen(p, p.causal, s, K0 + r_, qlo, qhi));

  float dK[F32_NP][2], dV[F32_NP][2];
  FA_UNROLL
  for (int k = 0; k < F32_NP; k++) dK[k][0] = dK[k][1] = dV[k][0] = dV[k][1] = 0.0f;

  /* Step it: query head h = hk*group + it/nsteps, rows [qa, qa + qn); steps the block mask
   * excludes for the whole key tile are skipped. */
  for (int it = 0; it < total; it++) {
    const int qa = qlo + (it % nsteps) * B32_BM, qn = fa_min(B32_BM, qhi + 1 - qa);
    if (fa_bm_verdict(p, s, qa, qa + qn - 1, K0, K0 + nk - 1) == 0) continue;
    const int h = hk * group + it / nsteps;
    FA_SYNC(); /* the previous step's readers are done */
    F32_LOAD_ROWS(sQ, f32_at(p.q, b, qa, h), p.q.ss, Dq, B32_BM, tid, r_ < qn);
    F32_LOAD_ROWS(sO, f32_at(p.dout, b, qa, h), p.dout.ss, Dv, B32_BM, tid, r_ < qn);
    const int64_t row0 = (b * p.Hq + h) * p.lse_rows + p.q_row0 + qa;
    if (tid < B32_BM) {
      sL[tid] = tid < qn ? p.lse_in[row0 + tid] * FA_LOG2E : 0.0f;
      sD[tid] = tid < qn ? p.delta[row0 + tid] : 0.0f;
    }
    FA_SYNC();
    const float alibi2 = p.alibi ? p.alibi[h] * FA_LOG2E : 0.0f;
    FA_UNROLL
    for (int n = 0; n < F32_NS; n++) {
      const int i = l + FA_F32_TPR * n, row = qa + i;
      int vis = i < qn && row >= klo && row <= khi;
      if (vis && p.bm) vis = fa_bm_at(p, (row + s.qpos_row0) / p.bq, kblk);
      float pr = 0.0f, ds = 0.0f;
      if (vis) {
        float dcap;
        const float x = fa_score_grad(p, f32_dot(sK + kr * (Dq + 1), sQ + i * (Dq + 1), Dq),
                                       alibi2, fabsf((float)(kdist0 + row)), dcap);
        const float dp = f32_dot(sV + kr * (Dv + 1), sO + i * (Dv + 1), Dv);
        pr = exp2f(x - sL[i]);
        ds = pr != 0.0f ? pr * (dp - sD[i]) * p.dscale * dcap : 0.0f;
      }
      sP[kr * B32_LD + i] = pr;
      sS[kr * B32_LD + i] = ds;
    }
    FA_SYNC(); /* P^T, dS^T complete (the fused dQ reads every key's row) */
    for (int i = 0; i < qn; i++) {
      f32_axpy(dV, sP[kr * B32_LD + i], sO + i * (Dv + 1), l, Dv);
      f32_axpy(dK, sS[kr * B32_LD + i], sQ + i * (Dq + 1), l, Dq);
    }
    if (p.fuse_dq) {
      /* dQ of query row i = kr (the same thread layout, rows for keys): sum over keys. */
      const int i = kr;
      float dQ[F32_NP][2];
      FA_UNROLL
      for (int k = 0; k < F32_NP; k++) dQ[k][0] = dQ[k][1] = 0.0f;
      for (int j = 0; j < nk; j++) f32_axpy(dQ, sS[j * B32_LD + i], sK + j * (Dq + 1), l, Dq);
      if (i < qn) {
        float *dq = (float *)p.dq.p + b * p.dq.sb + (qa + i) * p.dq.ss + h * p.dq.sh; /* [Dq] */
        FA_UNROLL
        for (int k = 0; k < F32_NP; k++) {
          const int c = 16 * k + 2 * l;
          if (c < Dq) fa_atomic_add2(dq + c, dQ[k][0], dQ[k][1]);
        }
      }
    }
  }
  if (kr >= nk) return;
  f32_add_row((float *)p.dk.p + b * p.dk.sb + (K0 + kr) * p.dk.ss + hk * p.dk.sh, dK, l, Dq);
  f32_add_row((float *)p.dv.p + b * p.dv.sb + (K0 + kr) * p.dv.ss + hk * p.dv.sh, dV, l, Dv);
}

FA_KERNEL(F32_THREADS) flash_dq_f32(const fa_params p) {
  FA_SMEM(smem);
  const int Dq = p.hd_qk, Dv = p.hd_v;
  float *sQ = (float *)smem;            /* [F32_ROWS][Dq + 1] */
  float *sO = sQ + F32_ROWS * (Dq + 1); /* [F32_ROWS][Dv + 1] dO */
  float *sK = sO + F32_ROWS * (Dv + 1); /* [F32_BN][Dq + 1] */
  float *sV = sK + F32_BN * (Dq + 1);   /* [F32_BN][Dv + 1] */
  float *sS = sV + F32_BN * (Dv + 1);   /* [F32_ROWS][F32_BN] dS */
  const int tid = (int)threadIdx.x, r = tid / FA_F32_TPR, l = tid % FA_F32_TPR;
  const int b = (int)blockIdx.z, h = (int)blockIdx.y, hk = h / (int)p.group;

  fa_tile tile;
  if (!fa_get_tile(p, (int)blockIdx.x, F32_ROWS, (int)p.sq, tile)) return;
  const fa_seg s = fa_make_seg(p, tile.seg);
  const int R0 = tile.r0, rows = tile.rows;
  int lo_first, hi_first, lo_last, hi_last;
  fa_row_keys(p, p.causal, s, R0, lo_first, hi_first);
  fa_row_keys(p, p.causal, s, R0 + rows - 1, lo_last, hi_last);
  const int kc0 = fa_max(lo_first, s.c0), kc1 = fa_min(hi_last + 1, s.c1);
  const f32_qrow q = f32_qrow_make(p, s, R0 + r, r < rows);
  const float alibi2 = p.alibi ? p.alibi[h] * FA_LOG2E : 0.0f;
  const int64_t row = (b * p.Hq + h) * p.lse_rows + p.q_row0 + R0 + (r < rows ? r : 0);
  const float lse2 = p.lse_in[row] * FA_LOG2E, dlt = p.delta[row];
  const float *gK = f32_at(p.k, b, 0, hk), *gV = f32_at(p.v, b, 0, hk);
  F32_LOAD_ROWS(sQ, f32_at(p.q, b, R0, h), p.q.ss, Dq, F32_ROWS, tid, r_ < rows);
  F32_LOAD_ROWS(sO, f32_at(p.dout, b, R0, h), p.dout.ss, Dv, F32_ROWS, tid, r_ < rows);

  float dQ[F32_NP][2];
  FA_UNROLL
  for (int k = 0; k < F32_NP; k++) dQ[k][0] = dQ[k][1] = 0.0f;
  fa_ktile cur = {0, 0, 0, 0, 0};
  cur.kt = kc0 / F32_BN - 1;
  int have = kc0 < kc1 &&
             fa_next_ktile(p, s, R0, rows, F32_ROWS, F32_BN, lo_last, hi_first, kc0, kc1, cur);
  while (have) {
    const int ca = cur.ca, cb = cur.cb;
    FA_SYNC(); /* the previous tile's readers are done with sK, sV */
    F32_LOAD_KV_TILE(p, s, cur, ca, cb, gK, gV, sK, sV, Dq, Dv, R0, rows, tid);
    FA_SYNC();
    FA_UNROLL
    for (int n = 0; n < F32_NS; n++) {
      const int j = l + FA_F32_TPR * n, key = ca + j;
      float ds = 0.0f;
      if (f32_visible(p, s, q, key, cb)) {
        float dcap;
        const float x = fa_score_grad(p, f32_dot(sQ + r * (Dq + 1), sK + j * (Dq + 1), Dq),
                                       alibi2, fabsf((float)(q.ipos - key)), dcap);
        const float dp = f32_dot(sO + r * (Dv + 1), sV + j * (Dv + 1), Dv);
        const float pr = exp2f(x - lse2);
        ds = pr != 0.0f ? pr * (dp - dlt) * p.dscale * dcap : 0.0f;
      }
      sS[r * F32_BN + j] = ds;
    }
    fa_syncwarp(); /* the row's dS is written (a row's threads share one warp) */
    for (int j = 0; j < cb - ca; j++) f32_axpy(dQ, sS[r * F32_BN + j], sK + j * (Dq + 1), l, Dq);
    have = fa_next_ktile(p, s, R0, rows, F32_ROWS, F32_BN, lo_last, hi_first, kc0, kc1, cur);
  }
  if (r >= rows) return;
  f32_add_row((float *)p.dq.p + b * p.dq.sb + (R0 + r) * p.dq.ss + h * p.dq.sh, dQ, l, Dq);
}

extern "C" int attn_cuda__bwd_f32(const fa_call *c) {
  const attn_cuda_problem *pb = c->pb;
  fa_params p = fa_bwd_params(c);
  const int Dq = p.hd_qk, Dv = p.hd_v;
  int64_t grid_k = 0, grid_q = 0;
  int e = fa_key_grid(&p, c, B32_KEYS, &grid_k);
  if (e) return e;
  const size_t smem_kv = (size_t)((B32_KEYS + B32_BM) * (Dq + 1 + Dv + 1) +
                                  2 * B32_KEYS * B32_LD + 2 * B32_BM) * 4;
  FA_LAUNCH_SMEM(e, flash_dkdv_f32, dim3((unsigned)grid_k, (unsigned)pb->Hkv, (unsigned)pb->B),
                 dim3(F32_THREADS), smem_kv, c->stream, p);
  if (e || !c->deterministic) return e;

  e = fa_query_grid(&p, c, F32_ROWS, &grid_q);
  if (e) return e;
  const size_t smem_q = (size_t)((F32_ROWS + F32_BN) * (Dq + 1 + Dv + 1) + F32_ROWS * F32_BN) * 4;
  FA_LAUNCH_SMEM(e, flash_dq_f32, dim3((unsigned)grid_q, (unsigned)pb->Hq, (unsigned)pb->B),
                 dim3(F32_THREADS), smem_q, c->stream, p);
  return e;
}
