/* bwd_body.cuh — the flash backward kernels (FlashAttention-2 with P recomputed from the
 * final LSE) and their launcher, instantiated once per (head dims, dtype, causal) by the
 * bwd_*.cu files.
 *
 * flash_dkdv_*: a CTA owns FA_BWD_BN keys of one (batch, KV head) and walks the query rows
 * that can see them, for every query head of the GQA group, FA_BWD_BM rows at a time. Each
 * warp owns 16 keys and keeps their dK, dV in registers (S^T = K Q^T, so P^T and dS^T come
 * out in the A-operand layout of dV += P^T dO and dK += dS^T Q); the CTA is the only
 * writer of its dK/dV rows, so they are added once, deterministically. Past 256 dK+dV
 * columns (FA_BWD_CSPLIT) two warps share a key group, each with half of the columns;
 * both compute the group's S^T and dP^T (about 1.4x the tensor-core work at d = 256, the
 * price of no extra shared-memory round trip). With fuse_dq, dS^T goes through shared
 * memory and dQ += dS K is added with float32 atomics.
 * flash_dq_*: the deterministic dQ (fuse_dq off): a CTA owns FA_DQ_BM query rows, walks
 * their key tiles like the forward, recomputes S and dP, and adds its dQ rows once. */
#include "common.cuh"

#define B_WARPS FA_BWD_WARPS
#define B_THREADS (32 * FA_BWD_WARPS)
#define B_CSPLIT FA_BWD_CSPLIT(DQK, DV) /* warps per 16-key group */
#define B_KG (B_WARPS / B_CSPLIT)       /* 16-key groups per CTA */
#define B_BN FA_BWD_BN(DQK, DV)         /* keys per CTA */
#define B_DKC (DQK / B_CSPLIT)          /* dK columns per warp */
#define B_DVC (DV / B_CSPLIT)           /* dV columns per warp */
#define B_BM FA_BWD_BM(DQK, DV)         /* query rows per step */
#define SDS (B_BM + FA_PAD)          /* row stride of the dS^T tile */
#define B_RG (B_BM / 16)             /* dQ tile: warps per column of 16-row groups */
#define B_CW (DQK * B_RG / B_WARPS)  /* dQ columns per warp */
/* shared memory of the dK/dV kernel with NB (Q, dO, LSE, delta) buffers */
#define B_SMEM_BYTES_ST(NB)                                                                 \
  ((B_BN * SQK + B_BN * SV + (NB) * B_BM * SQK + (NB) * B_BM * SV + B_BN * SDS) * 2 +       \
   2 * (NB) * B_BM * 4)
#define B_SMEM_BYTES B_SMEM_BYTES_ST(2)

#if B_CW % 16 != 0 || B_WARPS % B_RG != 0
#error "dQ tile split: each warp needs a multiple of 16 columns"
#endif
#if B_DKC % 16 != 0 || B_DVC % 16 != 0 || B_BN != 16 * B_KG
#error "dK/dV column split: each warp needs a multiple of 16 columns"
#endif

#define Q_WARPS FA_DQ_WARPS
#define Q_THREADS (32 * FA_DQ_WARPS)
#define Q_BM FA_DQ_BM
#define Q_BN FA_DQ_BN(DQK, DV)
#define Q_SMEM_BYTES ((Q_BM * SQK + Q_BM * SV + 2 * Q_BN * SQK + 2 * Q_BN * SV) * 2)

/* The dK/dV kernel's body, NB step buffers (a ring: NB - 1 steps' Q, dO, LSE and delta in
 * flight while one is computed; 2 in flash_dkdv_, 4 in flash_dkdv4s_,
 * ATTN_CUDA_BWD_STAGES=4). A step's rows follow from its index, and the next step from the
 * last, so past 2 only the last step issued is kept besides the current one. */
template <int NB> FA_DEV void fa_dkdv(const fa_params &p, unsigned char *smem) {
  fa_elem *sK = (fa_elem *)smem;       /* [B_BN][SQK] */
  fa_elem *sV = sK + B_BN * SQK;       /* [B_BN][SV] */
  fa_elem *sQ = sV + B_BN * SV;        /* [NB][B_BM][SQK] */
  fa_elem *sO = sQ + NB * B_BM * SQK;  /* [NB][B_BM][SV] dO */
  fa_elem *sS = sO + NB * B_BM * SV;   /* [B_BN][SDS] dS^T (fuse_dq) */
  float *sL = (float *)(sS + B_BN * SDS); /* [NB][B_BM] lse */
  float *sD = sL + NB * B_BM;             /* [NB][B_BM] delta */
  const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tg = lane % 4;
  const int b = (int)blockIdx.z, hk = (int)blockIdx.y, group = (int)p.group;

  fa_tile tile;
  if (!fa_get_tile(p, (int)blockIdx.x, B_BN, (int)p.skv, tile)) return;
  const fa_seg s = fa_make_seg(p, tile.seg);
  const int K0 = tile.r0; /* first local key */
  const int nk = tile.rows;
  /* Query rows that may see any of the keys (monotone in the key), within the segment. */
  int qlo, qhi, x0, x1;
  fa_key_rows(p, FA_CAUSAL, s, K0, qlo, x0);
  fa_key_rows(p, FA_CAUSAL, s, K0 + nk - 1, x1, qhi);
  qlo = fa_max(qlo, s.r0);
  qhi = fa_min(qhi, s.r1 - 1);
  if (qlo > qhi) return; /* no query sees these keys: their gradients stay as they are */
  const int nsteps = (qhi - qlo + B_BM) / B_BM, total = nsteps * group;

  /* Key ranges (inverse: the query rows that see a key) of the warp's keys; its dK/dV
   * columns start at kc_dk / kc_dv. */
  const int wk0 = 16 * (warp % B_KG), kc_dk = (warp / B_KG) * B_DKC, kc_dv = (warp / B_KG) * B_DVC;
  const int wn = nk - wk0 < 0 ? 0 : nk - wk0 > 16 ? 16 : nk - wk0;
  int klo[2], khi[2], vlo = 1, vhi = 0, wlo_last = 0, whi_first = -1, y;
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    klo[i] = (int)p.sq;
    khi[i] = -1;
    if (wk0 + g + 8 * i < nk) fa_key_rows(p, FA_CAUSAL, s, K0 + wk0 + g + 8 * i, klo[i], khi[i]);
  }
  if (wn > 0) {
    fa_key_rows(p, FA_CAUSAL, s, K0 + wk0 + wn - 1, wlo_last, y);
    fa_key_rows(p, FA_CAUSAL, s, K0 + wk0, y, whi_first);
    if ((lane & 15) < wn) fa_key_rows(p, FA_CAUSAL, s, K0 + wk0 + (lane & 15), vlo, vhi);
  }
  const int kblk[2] = {p.bm ? (K0 + wk0 + g + s.kpos_col0) / p.bk : 0,
                       p.bm ? (K0 + wk0 + g + 8 + s.kpos_col0) / p.bk : 0};
  /* ALiBi: distance of (query r, key) = |r + qpos_row0 + off - kpos_col0 - key|. */
  const int kdist0[2] = {s.qpos_row0 + s.off - s.kpos_col0 - (K0 + wk0 + g),
                         s.qpos_row0 + s.off - s.kpos_col0 - (K0 + wk0 + g + 8)};

  /* K, V once; keys no query of the block sees are zero-filled. */
  {
    const fa_elem *k_ = fa_at(p.k, b, K0, hk), *v_ = fa_at(p.v, b, K0, hk);
    FA_LOAD_ROWS(sK, SQK, k_, p.k.ss, DQK, B_BN, B_THREADS, tid,
                 r_ < nk && fa_key_seen(p, FA_CAUSAL, s, K0 + r_, qlo, qhi));
    FA_LOAD_ROWS(sV, SV, v_, p.v.ss, DV, B_BN, B_THREADS, tid,
                 r_ < nk && fa_key_seen(p, FA_CAUSAL, s, K0 + r_, qlo, qhi));
  }
  /* Step it: query head h = hk*group + it/nsteps, rows [qa, qa + qn). Steps that the block
   * mask excludes for the whole key tile are skipped (for every head alike). */
#define B_STEP_ROWS(IT, QA, QN)                           \
  const int QA = qlo + ((IT) % nsteps) * B_BM;            \
  const int QN = fa_min(B_BM, qhi + 1 - QA)
#define B_NEXT(IT)                                                                          \
  do {                                                                                      \
    for (; (IT) < total; (IT)++) {                                                          \
      B_STEP_ROWS(IT, qa_, qn_);                                                            \
      if (fa_bm_verdict(p, s, qa_, qa_ + qn_ - 1, K0, K0 + nk - 1) != 0) break;             \
    }                                                                                       \
  } while (0)
#define B_LOAD_STEP(IT, BUF)                                                                \
  do {                                                                                      \
    B_STEP_ROWS(IT, qa_, qn_);                                                              \
    const int h_ = hk * group + (IT) / nsteps;                                              \
    const fa_elem *q_ = fa_at(p.q, b, qa_, h_), *o_ = fa_at(p.dout, b, qa_, h_);           \
    if (qn_ == B_BM) { /* a whole step: no row test */                                      \
      FA_LOAD_ROWS_ALL(sQ + (BUF) * B_BM * SQK, SQK, q_, p.q.ss, DQK, B_BM, B_THREADS, tid);  \
      FA_LOAD_ROWS_ALL(sO + (BUF) * B_BM * SV, SV, o_, p.dout.ss, DV, B_BM, B_THREADS, tid);  \
    } else {                                                                                \
      FA_LOAD_ROWS(sQ + (BUF) * B_BM * SQK, SQK, q_, p.q.ss, DQK, B_BM, B_THREADS, tid,       \
                   r_ < qn_);                                                               \
      FA_LOAD_ROWS(sO + (BUF) * B_BM * SV, SV, o_, p.dout.ss, DV, B_BM, B_THREADS, tid,       \
                   r_ < qn_);                                                               \
    }                                                                                       \
    const int64_t row_ = (b * p.Hq + h_) * p.lse_rows + p.q_row0 + qa_;                      \
    if (tid < B_BM) {                                                                       \
      fa_cp_async4(sL + (BUF) * B_BM + tid, p.lse_in + row_ + (tid < qn_ ? tid : 0), tid < qn_); \
      fa_cp_async4(sD + (BUF) * B_BM + tid, p.delta + row_ + (tid < qn_ ? tid : 0), tid < qn_); \
    }                                                                                       \
  } while (0)

  int it = 0;
  B_NEXT(it);
  if (it < total) B_LOAD_STEP(it, 0);
  fa_cp_commit();
  int ahead = it; /* the last step issued (NB > 2) */
  FA_UNROLL
  for (int j = 1; j < NB - 1; j++) {
    if (ahead < total) {
      ahead++;
      B_NEXT(ahead);
    }
    if (ahead < total) B_LOAD_STEP(ahead, j);
    fa_cp_commit();
  }

  float dK[B_DKC / 8][4], dV[B_DVC / 8][4];
  FA_UNROLL
  for (int n = 0; n < B_DKC / 8; n++)
    FA_UNROLL
    for (int e = 0; e < 4; e++) dK[n][e] = 0.0f;
  FA_UNROLL
  for (int n = 0; n < B_DVC / 8; n++)
    FA_UNROLL
    for (int e = 0; e < 4; e++) dV[n][e] = 0.0f;

  for (int step = 0; it < total; step++) {
    fa_cp_wait_group<NB - 2>();
    FA_SYNC(); /* step `it` landed; buffer (step-1) % NB and sS are free */
    const int buf = NB == 2 ? step & 1 : (int)((unsigned)step % NB);
    int nxt = (NB == 2 ? it : ahead) + 1;
    if (NB == 2 || ahead < total) B_NEXT(nxt);
    if (nxt < total) B_LOAD_STEP(nxt, NB == 2 ? buf ^ 1 : (int)((unsigned)(step + NB - 1) % NB));
    fa_cp_commit();
    if (NB > 2) {
      ahead = ahead < total ? nxt : total;
      nxt = it + 1; /* the step computed next */
      B_NEXT(nxt);
    }

    B_STEP_ROWS(it, qa, qn);
    const int h = hk * group + it / nsteps;
    const fa_elem *qb = sQ + buf * B_BM * SQK, *ob = sO + buf * B_BM * SV;
    const float *lb = sL + buf * B_BM, *db = sD + buf * B_BM;

    /* This warp's share: 0 idle, 1 full, 2 partial (as fa_qwarp_mode, keys for rows). */
    int mode = 0;
    if (wn > 0 && fa_any(vlo <= vhi && vhi >= qa && vlo <= qa + qn - 1)) {
      const int wbm = fa_bm_verdict(p, s, qa, qa + qn - 1, K0 + wk0, K0 + wk0 + wn - 1);
      if (wbm != 0)
        mode = (wn == 16 && qn == B_BM && wlo_last <= qa && whi_first >= qa + qn - 1 && wbm == 1) ? 1 : 2;
    }
    float ST[B_BM / 8][4], DP[B_BM / 8][4]; /* S^T, then P^T; dP^T, then dS^T */
    FA_UNROLL
    for (int n = 0; n < B_BM / 8; n++)
      FA_UNROLL
      for (int e = 0; e < 4; e++) ST[n][e] = DP[n][e] = 0.0f;
    if (mode) {
      FA_UNROLL
      for (int kk = 0; kk < DQK / 16; kk++) {
        uint32_t ka[4];
        fa_ldsm_x4(ka, sK + (wk0 + (lane & 15)) * SQK + kk * 16 + (lane >> 4) * 8);
        FA_MMA_ABT(ST, ka, B_BM, qb, SQK, kk);
      }
      FA_UNROLL
      for (int kk = 0; kk < DV / 16; kk++) {
        uint32_t va[4];
        fa_ldsm_x4(va, sV + (wk0 + (lane & 15)) * SV + kk * 16 + (lane >> 4) * 8);
        FA_MMA_ABT(DP, va, B_BM, ob, SV, kk);
      }
      /* P^T and dS^T (keys x query columns c: LSE and delta by column) */
      {
        const float alibi2 = p.alibi ? p.alibi[h] * FA_LOG2E : 0.0f, slope[2] = {alibi2, alibi2};
        const int base[2] = {-(kdist0[0] + qa), -(kdist0[1] + qa)};
        fa_probs_tile<B_BM / 2, 1>(p, &ST[0][0], &DP[0][0], lb, db, FA_LOG2E, slope, base, tg,
                                   mode == 1, [&](int i, int c) {
                                     int vis = qa + c >= klo[i] && qa + c <= khi[i];
                                     if (vis && p.bm) vis = fa_bm_at(p, (qa + c + s.qpos_row0) / p.bq, kblk[i]);
                                     return vis;
                                   });
      }
      /* dV += P^T dO, dK += dS^T Q: A from the registers, B by ldmatrix.trans. */
      FA_UNROLL
      for (int kc = 0; kc < B_BM / 16; kc++) {
        uint32_t pa[4], da[4];
        pa[0] = fa_pack(ST[2 * kc][0], ST[2 * kc][1]);
        pa[1] = fa_pack(ST[2 * kc][2], ST[2 * kc][3]);
        pa[2] = fa_pack(ST[2 * kc + 1][0], ST[2 * kc + 1][1]);
        pa[3] = fa_pack(ST[2 * kc + 1][2], ST[2 * kc + 1][3]);
        da[0] = fa_pack(DP[2 * kc][0], DP[2 * kc][1]);
        da[1] = fa_pack(DP[2 * kc][2], DP[2 * kc][3]);
        da[2] = fa_pack(DP[2 * kc + 1][0], DP[2 * kc + 1][1]);
        da[3] = fa_pack(DP[2 * kc + 1][2], DP[2 * kc + 1][3]);
        const int trow = kc * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), tcol = (lane >> 4) * 8;
        FA_UNROLL
        for (int n = 0; n < B_DVC / 8; n += 2) {
          uint32_t bf[4];
          fa_ldsm_x4_t(bf, ob + trow * SV + kc_dv + n * 8 + tcol);
          fa_mma(dV[n], pa, bf[0], bf[1]);
          fa_mma(dV[n + 1], pa, bf[2], bf[3]);
        }
        FA_UNROLL
        for (int n = 0; n < B_DKC / 8; n += 2) {
          uint32_t bf[4];
          fa_ldsm_x4_t(bf, qb + trow * SQK + kc_dk + n * 8 + tcol);
          fa_mma(dK[n], da, bf[0], bf[1]);
          fa_mma(dK[n + 1], da, bf[2], bf[3]);
        }
      }
    }
    if (p.fuse_dq) {
      /* dS^T to shared memory (zeros from idle warps; one warp of each key group), then
       * dQ = dS K by row/column groups of warps, added to global dq with atomics. */
      if (warp < B_KG) {
        FA_UNROLL
        for (int n = 0; n < B_BM / 8; n++)
          FA_UNROLL
          for (int i = 0; i < 2; i++)
            *(uint32_t *)(sS + (wk0 + g + 8 * i) * SDS + n * 8 + 2 * tg) = fa_pack(DP[n][2 * i], DP[n][2 * i + 1]);
      }
      FA_SYNC();
      const int rg = warp % B_RG, cg = warp / B_RG;
      float dQ[B_CW / 8][4];
      FA_UNROLL
      for (int n = 0; n < B_CW / 8; n++)
        FA_UNROLL
        for (int e = 0; e < 4; e++) dQ[n][e] = 0.0f;
      FA_UNROLL
      for (int kk = 0; kk < B_BN / 16; kk++) {
        uint32_t a[4];
        fa_ldsm_x4_t(a, sS + (kk * 16 + (lane >> 4) * 8 + (lane & 7)) * SDS + rg * 16 + ((lane >> 3) & 1) * 8);
        FA_UNROLL
        for (int n = 0; n < B_CW / 8; n += 2) {
          uint32_t bf[4];
          fa_ldsm_x4_t(bf, sK + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * SQK + cg * B_CW + n * 8 + (lane >> 4) * 8);
          fa_mma(dQ[n], a, bf[0], bf[1]);
          fa_mma(dQ[n + 1], a, bf[2], bf[3]);
        }
      }
      FA_UNROLL
      for (int i = 0; i < 2; i++) {
        const int r = rg * 16 + g + 8 * i;
        if (r >= qn) continue;
        float *dq = (float *)p.dq.p + b * p.dq.sb + (qa + r) * p.dq.ss + h * p.dq.sh + cg * B_CW;
        FA_UNROLL
        for (int n = 0; n < B_CW / 8; n++) {
          fa_atomic_add2(dq + n * 8 + 2 * tg, dQ[n][2 * i], dQ[n][2 * i + 1]);
        }
      }
    }
    it = nxt;
  }
#undef B_LOAD_STEP
#undef B_NEXT
#undef B_STEP_ROWS
  fa_cp_wait_all();

  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    const int kr = wk0 + g + 8 * i;
    if (kr >= nk) continue;
    float *dk = (float *)p.dk.p + b * p.dk.sb + (K0 + kr) * p.dk.ss + hk * p.dk.sh;
    float *dv = (float *)p.dv.p + b * p.dv.sb + (K0 + kr) * p.dv.ss + hk * p.dv.sh;
    FA_UNROLL
    for (int n = 0; n < B_DKC / 8; n++) {
      dk[kc_dk + n * 8 + 2 * tg] += dK[n][2 * i];
      dk[kc_dk + n * 8 + 2 * tg + 1] += dK[n][2 * i + 1];
    }
    FA_UNROLL
    for (int n = 0; n < B_DVC / 8; n++) {
      dv[kc_dv + n * 8 + 2 * tg] += dV[n][2 * i];
      dv[kc_dv + n * 8 + 2 * tg + 1] += dV[n][2 * i + 1];
    }
  }
}
FA_KERNEL(B_THREADS) FA_FN(flash_dkdv_)(const fa_params p) {
  FA_SMEM(smem);
  fa_dkdv<2>(p, smem);
}
#if FA_BWD_4S(DQK, DV)
FA_KERNEL(B_THREADS) FA_FN(flash_dkdv4s_)(const fa_params p) {
  FA_SMEM(smem);
  fa_dkdv<FA_BWD_4S_STAGES>(p, smem);
}
#endif

FA_KERNEL(Q_THREADS) FA_FN(flash_dq_)(const fa_params p) {
  FA_SMEM(smem);
  fa_elem *sQ = (fa_elem *)smem;     /* [Q_BM][SQK] */
  fa_elem *sO = sQ + Q_BM * SQK;     /* [Q_BM][SV] dO */
  fa_elem *sK = sO + Q_BM * SV;      /* [2][Q_BN][SQK] */
  fa_elem *sV = sK + 2 * Q_BN * SQK; /* [2][Q_BN][SV] */
  const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tg = lane % 4;
  const int b = (int)blockIdx.z, h = (int)blockIdx.y, hk = h / (int)p.group;

  fa_tile tile;
  if (!fa_get_tile(p, (int)blockIdx.x, Q_BM, (int)p.sq, tile)) return;
  const fa_seg s = fa_make_seg(p, tile.seg);
  const int R0 = tile.r0;
  const int rows = tile.rows, wr0 = 16 * warp, rlast = R0 + rows - 1;
  fa_qrows q;
  fa_qrows_init(p, FA_CAUSAL, s, R0, rows, 1, wr0, lane, q);
  const float alibi2 = p.alibi ? p.alibi[h] * FA_LOG2E : 0.0f;
  float lse2[2], dlt[2];
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    const int r = wr0 + g + 8 * i;
    const int64_t row = (b * p.Hq + h) * p.lse_rows + p.q_row0 + R0 + (r < rows ? r : 0);
    lse2[i] = p.lse_in[row] * FA_LOG2E;
    dlt[i] = p.delta[row];
  }

  const fa_elem *gK = fa_at(p.k, b, 0, hk), *gV = fa_at(p.v, b, 0, hk);
  FA_LOAD_ROWS(sQ, SQK, fa_at(p.q, b, R0, h), p.q.ss, DQK, Q_BM, Q_THREADS, tid, r_ < rows);
  FA_LOAD_ROWS(sO, SV, fa_at(p.dout, b, R0, h), p.dout.ss, DV, Q_BM, Q_THREADS, tid, r_ < rows);
#define Q_LOAD_KV(T, BUF) FA_LOAD_KV_TILE(T, BUF, Q_BN, Q_THREADS, 0, 1)
  fa_ktile cur = {0, 0, 0, 0, 0};
  cur.kt = q.kc0 / Q_BN - 1;
  int have = q.kc0 < q.kc1 &&
             fa_next_ktile(p, s, R0, rows, Q_BM, Q_BN, q.lo_last, q.hi_first, q.kc0, q.kc1, cur);
  if (have) Q_LOAD_KV(cur, 0);
  fa_cp_commit();

  float dQ[DQK / 8][4];
  FA_UNROLL
  for (int n = 0; n < DQK / 8; n++)
    FA_UNROLL
    for (int e = 0; e < 4; e++) dQ[n][e] = 0.0f;
  for (int it = 0;; it++) {
    fa_cp_wait_all();
    FA_SYNC();
    if (!have) break;
    fa_ktile nxt = cur;
    const int have_next =
        fa_next_ktile(p, s, R0, rows, Q_BM, Q_BN, q.lo_last, q.hi_first, q.kc0, q.kc1, nxt);
    if (have_next) Q_LOAD_KV(nxt, (it + 1) & 1);
    fa_cp_commit();

    const int mode = fa_qwarp_mode(p, s, q, R0, 1, wr0, cur, Q_BN);
    if (mode) {
      const int ca = cur.ca, cb = cur.cb;
      const fa_elem *kb = sK + (it & 1) * Q_BN * SQK, *vb = sV + (it & 1) * Q_BN * SV;
      float S[Q_BN / 8][4], P[Q_BN / 8][4];
      FA_UNROLL
      for (int n = 0; n < Q_BN / 8; n++)
        FA_UNROLL
        for (int e = 0; e < 4; e++) S[n][e] = P[n][e] = 0.0f;
      FA_UNROLL
      for (int kk = 0; kk < DQK / 16; kk++) { /* S = Q K^T, Q fragments from shared memory */
        uint32_t qa[4];
        fa_ldsm_x4(qa, sQ + (wr0 + (lane & 15)) * SQK + kk * 16 + (lane >> 4) * 8);
        FA_MMA_ABT(S, qa, Q_BN, kb, SQK, kk);
      }
      FA_UNROLL
      for (int kk = 0; kk < DV / 16; kk++) { /* dP = dO V^T */
        uint32_t oa[4];
        fa_ldsm_x4(oa, sO + (wr0 + (lane & 15)) * SV + kk * 16 + (lane >> 4) * 8);
        FA_MMA_ABT(P, oa, Q_BN, vb, SV, kk);
      }
      /* P (into S, unused after) and dS (into P, which held dP): query rows, so LSE and
       * delta by row */
      {
        const int base[2] = {q.ipos[0] - ca, q.ipos[1] - ca};
        const float slope[2] = {alibi2, alibi2};
        fa_probs_tile<Q_BN / 2, 0>(p, &S[0][0], &P[0][0], lse2, dlt, 1.0f, slope, base, tg,
                                   mode == 1, [&](int i, int j) {
                                     const int key = ca + j;
                                     int vis = key >= q.lo_r[i] && key <= q.hi_r[i] && key < cb;
                                     if (vis && p.bm) vis = fa_bm_at(p, q.qblk[i], (key + s.kpos_col0) / p.bk);
                                     return vis;
                                   });
      }
      /* dQ += dS K: dS from the registers, K by ldmatrix.trans. */
      FA_MMA_SCORES_SMEM(dQ, P, Q_BN, DQK, kb, SQK);
    }
    cur = nxt;
    have = have_next;
  }
#undef Q_LOAD_KV
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    const int r = wr0 + g + 8 * i;
    if (r >= rows) continue;
    float *dq = (float *)p.dq.p + b * p.dq.sb + (R0 + r) * p.dq.ss + h * p.dq.sh;
    FA_UNROLL
    for (int n = 0; n < DQK / 8; n++) {
      dq[n * 8 + 2 * tg] += dQ[n][2 * i];
      dq[n * 8 + 2 * tg + 1] += dQ[n][2 * i + 1];
    }
  }
}

extern "C" int FA_FN(attn_cuda__bwd_)(const fa_call *c) {
  const attn_cuda_problem *pb = c->pb;
  fa_params p = fa_bwd_params(c);
  int64_t grid_k = 0, grid_q = 0;
  int e = fa_key_grid(&p, c, B_BN, &grid_k);
  if (e) return e;
  const dim3 grid((unsigned)grid_k, (unsigned)pb->Hkv, (unsigned)pb->B);
  const int ring = FA_BWD_4S(DQK, DV) && c->bwd_stages == FA_BWD_4S_STAGES;
  *c->bwd_stages_ran = ring ? FA_BWD_4S_STAGES : 2;
#if FA_BWD_4S(DQK, DV)
  if (ring)
    FA_LAUNCH_SMEM(e, FA_FN(flash_dkdv4s_), grid, dim3(B_THREADS), B_SMEM_BYTES_ST(FA_BWD_4S_STAGES),
                   c->stream, p);
  else
#endif
    FA_LAUNCH_SMEM(e, FA_FN(flash_dkdv_), grid, dim3(B_THREADS), B_SMEM_BYTES, c->stream, p);
  if (e || !c->deterministic) return e;

  e = fa_query_grid(&p, c, Q_BM, &grid_q);
  if (e) return e;
  FA_LAUNCH_SMEM(e, FA_FN(flash_dq_), dim3((unsigned)grid_q, (unsigned)pb->Hq, (unsigned)pb->B),
                 dim3(Q_THREADS), Q_SMEM_BYTES, c->stream, p);
  return e;
}
