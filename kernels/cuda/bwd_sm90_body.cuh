/* bwd_sm90_body.cuh — the Hopper (sm_90a) flash backward, head dims 64, 128, 256 and
 * (Dqk, Dv) = (192, 128) (dK, dV and dQ, added by float32 atomics or TMA reduce-adds, in
 * one kernel) and its launcher; instantiated by
 * bwd_hd{64,128,256,192x128}_{bf16,f16}[_causal]_sm90.cu.
 *
 * Past d = 128 (G_CSPLIT) the CTA owns 64 keys and both consumers work on all of them,
 * rows split for the score GEMMs and columns for the gradient GEMMs, P^T and dS^T
 * exchanged through shared memory (bwd_sm90_csplit.cuh: the producer below is the same);
 * the (Q, dO) ring has 2 stages at 256 (about 226 KB of shared memory) and 3 at 192 x 128
 * (about 195 KB), and dQ is added by atomics (no room, or no code, for mode 1's staging).
 * What follows describes d = 64 and 128.
 *
 * The mma.sync dK/dV kernel's split (bwd_body.cuh), on wgmma: a CTA of three warpgroups
 * owns 128 keys of one (batch, KV head) and walks the query rows that can see them, for
 * every query head of the GQA group, 64 rows a step. Warpgroup 0 is the producer: one
 * thread loads K and V once and the (Q, dO) tiles of each step into a ring (2 stages at
 * d = 128; 4 at d = 64, where the tiles take half the room and a step half the time) with
 * TMA (128-byte swizzle, "full" mbarriers with transaction counts); its second warp
 * zero-fills the K/V rows of keys that no query of the CTA sees (so NaN/Inf there cannot
 * reach a product), then fills each stage's LSE (log2 units) and delta rows and arrives on
 * the stage's "full" barrier too. Warpgroups 1 and 2 are the consumers, 64 keys each:
 *   S^T = K Q^T and dP^T = V dO^T  (wgmma m64n64k16, both operands K-major in smem, d/16
 *                                    k-steps over d/64 128-byte column blocks),
 *   P^T = 2^(S^T - LSE), dS^T = P^T (dP^T - delta) scale dcap  (registers, masked; P^T
 *                                    of a plain tile while dP^T is still in flight),
 *   dS^T -> shared memory (two buffers), dV += P^T dO issued, a named barrier over both
 *   consumers, then dQ = dS K over the 128 keys (m64n64k16, A = dS^T MN-major, B = K
 *   MN-major) and dK += dS^T Q issued (m64n<d>k16, A = the D fragment reused as A, B
 *   MN-major); dQ, as soon as it lands (dK still in flight), is
 * added to the float32 dQ (deterministic = 1 orders those adds: "the deterministic dQ"
 * below). At d = 128 consumer w computes dQ's column block w every step; at d = 64 there
 * is one column block, and consumer (step & 1) computes it, so the two take turns (the
 * other starts the next step) and each dQ element gets one add a step. Two dQ modes, per
 * launch (ATTN_SM90_DQ, a kernel parameter, warp-uniform branches): 0, float2 atomics
 * from the consumers' registers; 1, as FlashAttention-3, the consumer writes its
 * 64 x 64 float32 tile to a swizzled staging buffer of its own, fences (async proxy),
 * meets its warpgroup at a named barrier, and one thread adds the tile with two TMA
 * reduce-adds (cp.reduce.async.bulk.tensor .add, 32-column boxes, rows past sq clipped)
 * and commits; it waits (wait_group.read) before the next step's dS barrier, after which
 * the buffer is rewritten. That frees the consumers' issue slots and LSU of 16 atomics a
 * thread a step, for 32 KB more shared memory. Mode 1 is the default: on the H200 it ran
 * 1.09-1.12x as fast as the atomics (2026-12-04). The CTA is the only
 * writer of its dK/dV rows. What this kernel does not do goes to the
 * mma.sync backward (dispatch.c): a deterministic dQ without the workspace's semaphores,
 * varlen, block masks, head dims other
 * than 64, 128 and 256, views TMA cannot describe. */
#include "common.cuh"
#include "device_sm90.cuh"
#include "tmap_sm90.cuh"
extern "C" {
#include "../../runtime/internal.h" /* ATTN_PARAM */
}

#if !((DQK == DV && (DQK == 64 || DQK == 128 || DQK == 256)) || (DQK == 192 && DV == 128))
#error "the sm90 backward is written for head dims 64, 128, 256 and (192, 128)"
#endif

/* Past d = 128 the consumers split the columns (bwd_sm90_csplit.cuh): dK + dV of 64 keys
 * would take 256 (256) or 160 (192 x 128) floats a thread as whole rows. */
#define G_CSPLIT (DQK > 128)
#define G_BN (G_CSPLIT ? 64 : 128) /* keys per CTA: two consumers of 64, or both on 64 */
#define G_BM 64                    /* query rows per step: a dQ tile of FA_DQ_TILES */
#define G_NSBUF (G_CSPLIT ? 4 : 2) /* [dS^T, P^T at 256] x 2 steps: buffers of G_SBYTES */
/* (Q, dO) ring: the room d = 64 frees buys latency cover (registers, not shared memory,
 * hold the SM to one CTA) */
#define G_STAGES (DQK == 64 ? 4 : DQK == 192 ? 3 : 2)
#define G_THREADS 384
#define G_CB FA_TMAP_CB /* elements in a 128-byte swizzled column block (a TMA box row) */
#define G_NCB (DQK / G_CB) /* column blocks of a Q / K row: 2 at d = 128, 1 at d = 64 */
#define G_NCBV (DV / G_CB) /* of a V / dO row */
#define G_KBYTES (G_BN * DQK * 2)
#define G_VBYTES (G_BN * DV * 2)
#define G_QBYTES (G_BM * DQK * 2)
#define G_OBYTES (G_BM * DV * 2)
#define G_SBYTES (G_BN * G_BM * 2) /* one dS^T buffer */
#define G_NBAR (3 + 2 * G_STAGES) /* the mbarriers, then the deterministic dQ's ticket */
/* tiles, LSE / delta, then the mbarriers; + 1024 to align the tiles to the swizzle pattern */
#define G_TILE_BYTES                                                                         \
  (G_KBYTES + G_VBYTES + G_STAGES * (G_QBYTES + G_OBYTES) + G_NSBUF * G_SBYTES +             \
   G_STAGES * 2 * G_BM * 4 + G_STAGES * 8 + 8 * G_NBAR)
#define G_SMEM_BYTES (1024 + G_TILE_BYTES)
/* the dQ mode "tma" (ATTN_SM90_DQ=1) adds, 1024-aligned after the rest, one float32
 * staging buffer a consumer: [2 halves of 32 columns][G_BM rows][32], 128-byte swizzle */
#define G_DQ_OFF ((G_TILE_BYTES + 1023) / 1024 * 1024)
#define G_DQ_HALF (G_BM * 32 * 4) /* one 32-column half: a TMA box */
#define G_DQ_BYTES (2 * 2 * G_DQ_HALF)
#define G_SMEM_TMA_BYTES (1024 + G_DQ_OFF + G_DQ_BYTES)
#if G_SMEM_BYTES > 227 * 1024 || (!G_CSPLIT && G_SMEM_TMA_BYTES > 227 * 1024)
#error "the sm90 backward's shared memory exceeds the 227 KB a block may have"
#endif
#define G_PRODUCER_REGS 40
#define G_CONSUMER_REGS 232 /* 128 x 40 + 256 x 232 = 64512 = 384 x 168, what the launch holds */
#define G_BAR_DS 1          /* named barrier: both consumers' dS^T are in shared memory */
#define G_BAR_DQ 2          /* + consumer: its dQ staging buffer is written (dQ mode tma) */

/* Ablation (ATTN_SM90_ABLATE, read by the launcher; d <= 128 only): each bit leaves one
 * stage of a step out, so that a GPU session can time the stages by difference (the
 * device's notes: "time variants that leave one stage out"). The results are then wrong;
 * bench_cuda labels such rows and does not judge them. Warp-uniform branches on a kernel
 * parameter: 0 runs the kernel as it is. */
#define G_AB_DQ_ADD 1 /* no dQ adds (atomics, or staging + TMA reduce-adds) */
#define G_AB_DQ 2     /* no dQ GEMM, nor its adds */
#define G_AB_BAR 4    /* no dS^T barrier (safe only with G_AB_DQ: nothing reads the other's) */
#define G_AB_DKV 8    /* no dV, dK GEMMs */
#define G_AB_SOFT 16  /* no P^T / dS^T arithmetic: the raw S^T, dP^T are packed */
#define G_AB_LOAD 32  /* Q, dO, LSE, delta loaded for the first G_STAGES steps only, reused */
/* (The S^T, dP^T GEMMs have no bit: skipping them, zeroing or shortening them made ptxas
 * spill, serialize the wgmmas or inject warpgroup.arrives in the real path too.) */

/* g_wgmma_rs_t: dV / dK += A B with N = d (m64n128k16 or m64n64k16, d/2 accumulators) */
#if FA_BF16
#define g_wgmma_ss64 fa_wgmma_ss64_bf16
#define g_wgmma_ss64_tt fa_wgmma_ss64_tt_bf16
#define g_wgmma_rs_t_128 fa_wgmma_rs_t_bf16
#define g_wgmma_rs_t_64 fa_wgmma_rs64_t_bf16
#define g_wgmma_ss32 fa_wgmma_ss32_bf16
#define g_wgmma_ss_t fa_wgmma_ss_t_bf16
#define g_wgmma_ss_t192 fa_wgmma_ss_t192_bf16
#else
#define g_wgmma_ss64 fa_wgmma_ss64_f16
#define g_wgmma_ss64_tt fa_wgmma_ss64_tt_f16
#define g_wgmma_rs_t_128 fa_wgmma_rs_t_f16
#define g_wgmma_rs_t_64 fa_wgmma_rs64_t_f16
#define g_wgmma_ss32 fa_wgmma_ss32_f16
#define g_wgmma_ss_t fa_wgmma_ss_t_f16
#define g_wgmma_ss_t192 fa_wgmma_ss_t192_f16
#endif
#if !G_CSPLIT
#define g_wgmma_rs_t FA_PASTE(g_wgmma_rs_t_, DQK)
#endif

#if FA_SM90_DEVICE
/* d[N / 2] (+)= A B, m64nNk16, A and B K-major from shared memory: N = 64 or 32 */
template <int N> FA_DEV void g_wgmma_ss_kk(float *d, uint64_t da, uint64_t db, int scale_d) {
  static_assert(N == 64 || N == 32, "m64n64k16 or m64n32k16");
  if constexpr (N == 64)
    g_wgmma_ss64(d, da, db, scale_d);
  else
    g_wgmma_ss32(d, da, db, scale_d);
}
#endif

#ifndef FA_BWD90_MAPS_DEFINED
#define FA_BWD90_MAPS_DEFINED
/* TMA descriptors (d, s, h, b) of Q [B,sq,Hq,d], dO [B,sq,Hq,d] (boxes 64 x 64 rows),
 * K, V [B,skv,Hkv,d] (boxes 64 x 128 rows), 128-byte swizzle; the float32 dQ
 * [B,sq,Hq,d] (boxes 32 x 64 rows) and the dQ mode: dq_tma 0 adds dQ with float2 atomics
 * from the consumers' registers, 1 stages it in shared memory and one thread a consumer
 * adds it with TMA reduce-adds (dq is then valid). */
struct fa_bwd90_maps {
  fa_tmap q, o, k, v, dq;
  int dq_tma;
  int ablate; /* G_AB_* bits (a timing experiment; 0 in every real call) */
};

#endif

/* two floats, one 8-byte shared-memory store */
struct alignas(8) g_f2 {
  float x, y;
};

/* Step IT of a CTA: query head H of the group, first row QA. */
#define G_STEP(IT, H, QA)                   \
  const int H = hk * group + (IT) / nsteps; \
  const int QA = qlo + ((IT) % nsteps) * G_BM

/* The keys of consumer warpgroup w: wn valid of its 64, and the query rows [lo_f, hi_f]
 * and [lo_l, hi_l] that its first and last keys see. */
struct g_keys {
  int wn, lo_f, hi_f, lo_l, hi_l;
};

FA_DEV g_keys g_wg_keys(const fa_params &p, const fa_seg &s, int K0, int nk, int w) {
  g_keys k;
  k.wn = fa_min(fa_max(nk - 64 * w, 0), 64);
  k.lo_f = k.lo_l = 0;
  k.hi_f = k.hi_l = -1;
  if (k.wn > 0) {
    fa_key_rows(p, FA_CAUSAL, s, K0 + 64 * w, k.lo_f, k.hi_f);
    fa_key_rows(p, FA_CAUSAL, s, K0 + 64 * w + k.wn - 1, k.lo_l, k.hi_l);
  }
  return k;
}

/* A consumer warpgroup's share of a step (rows [qa, qa + qn) of a share of ROWS): 0
 * nothing visible, 1 every pair visible, 2 mask each element. Warpgroup-uniform. */
FA_DEV int g_mode(const g_keys &k, int qa, int qn, int rows) {
  if (k.wn == 0 || qn <= 0 || k.hi_l < qa || k.lo_f > qa + qn - 1) return 0;
  return k.wn == 64 && qn == rows && k.lo_l <= qa && k.hi_f >= qa + rows - 1 ? 1 : 2;
}

/* S^T, dP^T (m64n<8 NB> D fragments: the thread's keys i = 0, 1 x query rows qa + c0 + c)
 * -> P^T = 2^(S^T - LSE) and dS^T = P^T (dP^T - delta) scale dcap, in place, masked
 * (mode 2) by the keys' row ranges [klo, khi]; lb, db: the step's LSE, delta by row. */
template <int NB>
FA_DEV void g_probs(float *ST, float *DP, const fa_params &p, int mode, int h, int qa, int c0,
                    const float *lb, const float *db, const int klo[2], const int khi[2],
                    const int kdist[2], int tg) {
  const float alibi2 = p.alibi ? p.alibi[h] * FA_LOG2E : 0.0f, slope[2] = {alibi2, alibi2};
  const int base[2] = {-(kdist[0] + qa + c0), -(kdist[1] + qa + c0)};
  fa_probs_tile<4 * NB, 1>(p, ST, DP, lb + c0, db + c0, 1.0f, slope, base, tg, mode == 1,
                           [&](int i, int c) {
                             return qa + c0 + c >= klo[i] && qa + c0 + c <= khi[i];
                           });
}

#if FA_SM90_DEVICE
/* S^T = K Q^T and dP^T = V dO^T (m64nNk16, N query rows: both operands K-major in shared
 * memory, Dqk/16 and Dv/16 k-steps over 128-byte column blocks; k / v / q / o: the
 * operands' first rows in column block 0), then P^T and dS^T (g_probs, rows c0..) packed
 * as the A fragments PA, DA of N/16 k16 chunks of rows. */
template <int N>
FA_DEV void g_scores_t(uint32_t *PA, uint32_t *DA, const fa_params &p, int mode, int h, int qa, int c0,
                       uint32_t k, uint32_t v, uint32_t q, uint32_t o, const float *lb, const float *db,
                       const int klo[2], const int khi[2], const int kdist[2], int tg, int ab = 0) {
  float ST[N / 2], DP[N / 2]; /* m64nN D fragments: keys x query rows */
  fa_wgmma_fence();
  FA_UNROLL
  for (int kk = 0; kk < DQK / 16; kk++) {
    /* 16 columns of d: column block kk/4, 32 bytes into the row; 8-row groups 1024 bytes
     * apart (SBO); LBO is unused by K-major swizzled layouts */
    const uint32_t in_row = (uint32_t)(kk % 4) * 32, blk = (uint32_t)(kk / 4) * 128;
    g_wgmma_ss_kk<N>(ST, fa_wgmma_desc(k + blk * G_BN + in_row, 16, 1024),
                     fa_wgmma_desc(q + blk * G_BM + in_row, 16, 1024), kk > 0);
  }
  fa_wgmma_commit();
  FA_UNROLL
  for (int kk = 0; kk < DV / 16; kk++) {
    const uint32_t in_row = (uint32_t)(kk % 4) * 32, blk = (uint32_t)(kk / 4) * 128;
    g_wgmma_ss_kk<N>(DP, fa_wgmma_desc(v + blk * G_BN + in_row, 16, 1024),
                     fa_wgmma_desc(o + blk * G_BM + in_row, 16, 1024), kk > 0);
  }
  fa_wgmma_commit();
  if (ab & G_AB_SOFT) {
    fa_wgmma_wait<0>();
    FA_UNROLL
    for (int x = 0; x < N / 2; x++) {
      fa_reg_fence(ST[x]);
      fa_reg_fence(DP[x]);
    }
  } else if (fa_probs_plain(p, mode == 1)) { /* P while dP is in flight (FlashAttention-3's order) */
    fa_wgmma_wait<1>();
    FA_UNROLL
    for (int x = 0; x < N / 2; x++) fa_reg_fence(ST[x]);
    fa_probs_p<N / 2, 1>(p, ST, lb + c0, 1.0f, tg);
    fa_wgmma_wait<0>();
    FA_UNROLL
    for (int x = 0; x < N / 2; x++) fa_reg_fence(DP[x]);
    fa_probs_ds<N / 2, 1>(p, ST, DP, db + c0, tg);
  } else {
    fa_wgmma_wait<0>();
    FA_UNROLL
    for (int x = 0; x < N / 2; x++) {
      fa_reg_fence(ST[x]);
      fa_reg_fence(DP[x]);
    }
    g_probs<N / 8>(ST, DP, p, mode, h, qa, c0, lb, db, klo, khi, kdist, tg);
  }
  FA_UNROLL
  for (int x = 0; x < N / 4; x++) {
    PA[x] = fa_pack(ST[2 * x], ST[2 * x + 1]);
    DA[x] = fa_pack(DP[2 * x], DP[2 * x + 1]);
  }
}
#endif

/* Packed pairs A[2 n + i] (the thread's key rows r0 + 8 i, query rows 8 (n0 + n) + 2 tg,
 * + 1) into a [keys][64 rows] tile: element (key r, row c) at 128 r + 16 ((c / 8) ^ (r % 8))
 * + 2 (c % 8), the TMA 128-byte swizzle. */
template <int NB>
FA_DEV void g_put_t(unsigned char *buf, const uint32_t *A, int r0, int n0, int tg) {
  FA_UNROLL
  for (int n = 0; n < NB; n++)
    FA_UNROLL
    for (int i = 0; i < 2; i++) {
      const int r = r0 + 8 * i;
      *(uint32_t *)(buf + r * 128 + (((n0 + n) ^ (r & 7)) * 16) + tg * 4) = A[2 * n + i];
    }
}

/* dQ[rows qa + 16 wq + g (+8), columns c0 + 0..63] += the m64n64 D fragment (float2
 * atomics; rows past qhi have no visible pair and are skipped). */
FA_DEV void g_dq_atomics(const fa_params &p, const float dQ[32], int b, int h, int qa, int qhi,
                         int c0, int wq, int g, int tg) {
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    const int q = qa + 16 * wq + g + 8 * i;
    if (q > qhi) continue;
    float *dq = (float *)p.dq.p + b * p.dq.sb + q * p.dq.ss + h * p.dq.sh + c0;
    FA_UNROLL
    for (int n = 0; n < 8; n++) fa_atomic_add2(dq + n * 8 + 2 * tg, dQ[4 * n + 2 * i], dQ[4 * n + 2 * i + 1]);
  }
}

/* ---- the deterministic dQ (p.dq_sem) -------------------------------------------------------
 * Every CTA's steps are the same 64-row tiles of dQ (qlo is rounded down to a multiple of
 * 64), and for one tile, per consumer part, the key CTAs add their dQ in key-block order:
 * the semaphore of (b, h, tile, part) counts the CTAs that have added, and the CTA of key
 * block kb waits for it to reach the number of CTAs before it that have the tile among
 * their steps. Query ranges are monotone in the key, so those are the key blocks
 * [g_first_block, kb): the first whose last key a row of the tile sees, and every block
 * up to kb (none of them is empty). Each visiting CTA posts once per (tile, part), also at
 * a step with nothing to add. */
FA_DEV int64_t g_sem_count(const fa_params &p) { return FA_DQ_SEM_WORDS(p.B, p.Hq, p.sq); }

FA_DEV int g_first_block(const fa_params &p, const fa_seg &s, int kb, int qa) {
  int lo = 0, hi = kb;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    int a, z;
    fa_key_rows(p, FA_CAUSAL, s, fa_min((mid + 1) * G_BN, (int)p.skv) - 1, a, z);
    if (z >= qa)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

FA_DEV int32_t *g_dq_sem(const fa_params &p, int b, int h, int qa, int part) {
  return p.dq_sem + (((int64_t)b * p.Hq + h) * FA_DQ_TILES(p.sq) + qa / 64) * 2 + part;
}

/* consumer cw's warpgroup at its own named barrier (constant ids: ptxas reserves those) */
FA_DEV void g_wg_bar(int cw) {
  if (cw)
    fa_named_bar_sync(G_BAR_DQ + 1, 128);
  else
    fa_named_bar_sync(G_BAR_DQ, 128);
}

/* Waits, in the deterministic mode, for consumer cw's turn to add part `part` of tile qa
 * of head h: `want` CTAs before it (the producer's count for the step, sW). Every thread
 * of the warpgroup waits (acquires) itself: one waiting thread and a barrier made ptxas
 * spill 116 bytes at d = 128 (a divergent loop among the live accumulators). Then
 * g_dq_done, after its adds, passes the turn on. */
FA_DEV void g_dq_turn(const fa_params &p, int b, int h, int qa, int part, int want) {
  if (!p.dq_sem) return;
  fa_sem_wait(g_dq_sem(p, b, h, qa, part), want, p.dq_sem + g_sem_count(p) + 1);
}
FA_DEV void g_dq_done(const fa_params &p, int b, int h, int qa, int part, int cw, int tid) {
  if (!p.dq_sem) return;
  fa_fence_gpu();
  g_wg_bar(cw);
  if ((tid & 127) == 0) fa_sem_post(g_dq_sem(p, b, h, qa, part));
}

#if G_CSPLIT && FA_SM90_DEVICE
#include "bwd_sm90_csplit.cuh"
#endif

FA_KERNEL(G_THREADS) FA_FN(flash_bwd_)(const fa_params p, const FA_GRID_CONST fa_bwd90_maps maps) {
#if FA_SM90_DEVICE
  FA_SMEM(smem_raw);
  unsigned char *smem = smem_raw + ((1024 - (fa_smem_addr(smem_raw) & 1023)) & 1023);
  fa_elem *sK = (fa_elem *)smem;            /* [G_NCB column blocks][G_BN][64], swizzled */
  fa_elem *sV = sK + G_BN * DQK;            /* [G_NCBV][G_BN][64] */
  fa_elem *sQ = sV + G_BN * DV;             /* [G_STAGES][G_NCB][G_BM][64] */
  fa_elem *sO = sQ + G_STAGES * G_BM * DQK; /* [G_STAGES][G_NCBV][G_BM][64] dO */
  fa_elem *sS = sO + G_STAGES * G_BM * DV;  /* [G_NSBUF][G_BN keys][64 rows] dS^T (+ P^T), swizzled */
  float *sL = (float *)(sS + G_NSBUF * G_BN * G_BM); /* [G_STAGES][G_BM] LSE, log2 units */
  float *sD = sL + G_STAGES * G_BM;            /* [G_STAGES][G_BM] delta */
  /* [G_STAGES][2] the deterministic dQ's turn of each stage's step, in [st][0] (two ints
   * a stage keep the mbarriers after it 8-byte aligned) */
  int *sW = (int *)(sD + G_STAGES * G_BM);
  uint64_t *bar_kv = (uint64_t *)(sW + 2 * G_STAGES);
  uint64_t *kv_ok = bar_kv + 1, *full = kv_ok + 1, *empty = full + G_STAGES;
  const int tid = (int)threadIdx.x, wg = fa_warp_uniform(tid / 128), warp = tid / 32, lane = tid % 32;
  const int group = (int)p.group;
  /* The CTA's key block kb of KV head hk, batch b: the block index, or under a
   * deterministic dQ a ticket, so that every key block a CTA waits for (g_dq_turn) has
   * started before it, whatever order the hardware starts CTAs in. */
  int kb = (int)blockIdx.x, hk = (int)blockIdx.y, b = (int)blockIdx.z;
  if (p.dq_sem) {
    int *ticket = (int *)(empty + G_STAGES);
    if (tid == 0) *ticket = fa_ticket(p.dq_sem + g_sem_count(p));
    FA_SYNC();
    const int t = *ticket, nx = (int)gridDim.x, ny = (int)gridDim.y;
    kb = t % nx;
    hk = t / nx % ny;
    b = t / nx / ny;
  }
  const fa_seg s = fa_make_seg(p, 0);
  const int K0 = kb * G_BN, nk = fa_min(G_BN, (int)p.skv - K0);
  /* query rows that may see any of the keys (monotone in the key); the steps start at
   * a multiple of 64, so that every CTA's steps are the same 64-row tiles of dQ */
  int qlo, qhi, x0, x1;
  fa_key_rows(p, FA_CAUSAL, s, K0, qlo, x0);
  fa_key_rows(p, FA_CAUSAL, s, K0 + nk - 1, x1, qhi);
  if (qlo > qhi) return; /* no query sees these keys: their gradients stay as they are */
  qlo -= qlo % G_BM;
  const int nsteps = (qhi - qlo + G_BM) / G_BM, total = nsteps * group;

  if (tid == 0) {
    fa_mbar_init(bar_kv, 1);
    fa_mbar_init(kv_ok, 1);
    for (int i = 0; i < G_STAGES; i++) {
      fa_mbar_init(&full[i], 2);  /* the TMA thread (with the bytes) and the LSE warp */
      fa_mbar_init(&empty[i], 8); /* one arrival per consumer warp */
    }
    fa_mbar_init_fence();
  }
  FA_SYNC();

  if (wg == 0) { /* ---- producer warpgroup ---------------------------------------------- */
    fa_setmaxnreg_dec<G_PRODUCER_REGS>();
    if (warp == 0 && lane == 0) {
      fa_tmap_prefetch(&maps.q);
      fa_tmap_prefetch(&maps.o);
      fa_tmap_prefetch(&maps.k);
      fa_tmap_prefetch(&maps.v);
      fa_mbar_arrive_expect_tx(bar_kv, G_KBYTES + G_VBYTES);
      FA_UNROLL
      for (int cb = 0; cb < G_NCB; cb++)
        fa_tma_load_4d(sK + cb * G_BN * G_CB, &maps.k, cb * G_CB, K0, hk, b, bar_kv);
      FA_UNROLL
      for (int cb = 0; cb < G_NCBV; cb++)
        fa_tma_load_4d(sV + cb * G_BN * G_CB, &maps.v, cb * G_CB, K0, hk, b, bar_kv);
      const int nload = (maps.ablate & G_AB_LOAD) ? fa_min(total, G_STAGES) : total;
      for (int it = 0; it < nload; it++) {
        const int st = it % G_STAGES, ph = (it / G_STAGES) & 1;
        G_STEP(it, h, qa);
        fa_elem *q = sQ + st * G_BM * DQK, *o = sO + st * G_BM * DV;
        fa_mbar_wait(&empty[st], ph ^ 1); /* the first use of a stage passes at once */
        fa_mbar_arrive_expect_tx(&full[st], G_QBYTES + G_OBYTES);
        FA_UNROLL
        for (int cb = 0; cb < G_NCB; cb++)
          fa_tma_load_4d(q + cb * G_BM * G_CB, &maps.q, cb * G_CB, qa, h, b, &full[st]);
        FA_UNROLL
        for (int cb = 0; cb < G_NCBV; cb++)
          fa_tma_load_4d(o + cb * G_BM * G_CB, &maps.o, cb * G_CB, qa, h, b, &full[st]);
      }
    } else if (warp == 1) {
      /* K/V rows of keys in [0, skv) that no row of the CTA sees -> 0 (outside, TMA read 0) */
      fa_mbar_wait(bar_kv, 0);
      for (int r = lane; r < G_BN; r += 32) {
        const int key = K0 + r;
        if (key >= (int)p.skv || fa_key_seen(p, FA_CAUSAL, s, key, qlo, qhi)) continue;
        FA_UNROLL
        for (int cb = 0; cb < G_NCB; cb++) fa_zero_row128(sK + cb * G_BN * G_CB + r * G_CB);
        FA_UNROLL
        for (int cb = 0; cb < G_NCBV; cb++) fa_zero_row128(sV + cb * G_BN * G_CB + r * G_CB);
      }
      fa_fence_proxy_async(); /* these stores are read by wgmma (the async proxy) */
      fa_syncwarp();
      if (lane == 0) fa_mbar_arrive(kv_ok);
      const int nload = (maps.ablate & G_AB_LOAD) ? fa_min(total, G_STAGES) : total;
      for (int it = 0; it < nload; it++) {
        const int st = it % G_STAGES, ph = (it / G_STAGES) & 1;
        G_STEP(it, h, qa);
        fa_mbar_wait(&empty[st], ph ^ 1);
        const int64_t row0 = (b * p.Hq + h) * p.lse_rows + p.q_row0;
        for (int r = lane; r < G_BM; r += 32) {
          const int ok = qa + r <= qhi; /* later rows are masked: any finite value */
          sL[st * G_BM + r] = ok ? p.lse_in[row0 + qa + r] * FA_LOG2E : 0.0f;
          sD[st * G_BM + r] = ok ? p.delta[row0 + qa + r] : 0.0f;
        }
        /* a deterministic dQ: the key CTAs that add to this step's tile before this one
         * (worked out here, where registers are free, for the consumers' g_dq_turn) */
        if (lane == 0 && p.dq_sem) sW[2 * st] = kb - g_first_block(p, s, kb, qa);
        fa_syncwarp();
        if (lane == 0) fa_mbar_arrive(&full[st]);
      }
    }
    return;
  }

  /* ---- consumer warpgroups ------------------------------------------------------------ */
  fa_setmaxnreg_inc<G_CONSUMER_REGS>();
  const int cw = wg - 1, wq = warp % 4, g = lane / 4, tg = lane % 4;
#if G_CSPLIT
  const g_ctx cx = {&p, s, sK, sV, sQ, sO, sS, sL, sD, sW, bar_kv, kv_ok, full, empty, b, hk,
                    group, K0, nk, qlo, qhi, nsteps, total, tid, wq, g, tg, lane};
  if (cw == 0)
    g_csplit_consumer<0>(cx);
  else
    g_csplit_consumer<1>(cx);
#else
  const int dq_tma = maps.dq_tma; /* a kernel parameter: the branches on it are uniform */
  const int ab = maps.ablate; /* 0 but in a timing experiment (G_AB_*) */
  /* both consumers' key ranges (a step's dQ needs to know whether either has work) */
  const g_keys mine = g_wg_keys(p, s, K0, nk, cw), other = g_wg_keys(p, s, K0, nk, 1 - cw);
  /* the thread's two keys (rows g, g + 8 of its warp's 16 in the D fragment) */
  const int kr0 = 64 * cw + 16 * wq + g;
  int klo[2], khi[2], kdist[2];
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    klo[i] = (int)p.sq;
    khi[i] = -1;
    if (kr0 + 8 * i < nk) fa_key_rows(p, FA_CAUSAL, s, K0 + kr0 + 8 * i, klo[i], khi[i]);
    /* ALiBi: distance of (query r, key) = |r + qpos_row0 + off - kpos_col0 - key| */
    kdist[i] = s.qpos_row0 + s.off - s.kpos_col0 - (K0 + kr0 + 8 * i);
  }
  const uint32_t k_addr = fa_smem_addr(sK), v_addr = fa_smem_addr(sV);
  /* m64n<d> D fragments: keys 64 cw + 16 wq + g (+8), columns 8n + 2tg */
  float dK[DQK / 2], dV[DV / 2];
  FA_UNROLL
  for (int x = 0; x < DQK / 2; x++) dK[x] = dV[x] = 0.0f;
  fa_mbar_wait(bar_kv, 0);
  fa_mbar_wait(kv_ok, 0);

  for (int it = 0; it < total; it++) {
    const int st = it % G_STAGES, ph = (it / G_STAGES) & 1;
    G_STEP(it, h, qa);
    const int qn = fa_min(G_BM, qhi + 1 - qa);
    const int mode = g_mode(mine, qa, qn, G_BM), any = mode || g_mode(other, qa, qn, G_BM);
    const uint32_t q_addr = fa_smem_addr(sQ + st * G_BM * DQK);
    const uint32_t o_addr = fa_smem_addr(sO + st * G_BM * DV);
    const float *lb = sL + st * G_BM, *db = sD + st * G_BM;
    unsigned char *sbuf = (unsigned char *)(sS + (it & 1) * G_BN * G_BM);
    uint32_t PA[16], DA[16]; /* P^T, dS^T packed: the A fragments of 4 k16 chunks of rows */
    if (!(ab & G_AB_LOAD) || it < G_STAGES) fa_mbar_wait(&full[st], ph);
    if (mode) {
      g_scores_t<64>(PA, DA, p, mode, h, qa, 0, k_addr + 64 * cw * 128, v_addr + 64 * cw * 128, q_addr,
                     o_addr, lb, db, klo, khi, kdist, tg, ab);
    } else {
      FA_UNROLL
      for (int x = 0; x < 16; x++) PA[x] = DA[x] = 0u;
    }
    if (any) {
      /* dS^T rows (keys) of this warpgroup into buffer it & 1; zeros from an idle one */
      g_put_t<G_BM / 8>(sbuf, DA, kr0, 0, tg);
      fa_fence_proxy_async(); /* read by the dQ wgmma (the async proxy) */
    }
    /* The gradient GEMMs, in FlashAttention-3's order: dV += P^T dO is issued before the
     * dS barrier, so the tensor cores run it while this warpgroup waits for the other's
     * dS^T; dQ = dS K, then dK += dS^T Q after the barrier; the dQ adds (wait<1>: dV and
     * dQ done, groups retire in order) overlap dK. A from the registers (P^T, dS^T), dO /
     * Q MN-major (d contiguous): d blocks of 64 G_BM * 128 bytes apart (LBO; one block at
     * d = 64), 8-row groups 1024 (SBO). PA / DA stay live until retire() (a wgmma's A
     * registers), and the stage is released there (Q, dO, LSE, delta, the turn: done). */
    const int dkv = mode && !(ab & G_AB_DKV); /* this warpgroup's dV, dK GEMMs run */
    if (dkv) {
      FA_UNROLL
      for (int x = 0; x < DQK / 2; x++) {
        fa_reg_fence(dK[x]);
        fa_reg_fence(dV[x]);
      }
      /* the A fragments' last writes (the packs above) stay before the wgmma.fence */
      FA_UNROLL
      for (int x = 0; x < 16; x++) {
        fa_reg_fence_u32(PA[x]);
        fa_reg_fence_u32(DA[x]);
      }
      fa_wgmma_fence();
      FA_UNROLL
      for (int kc = 0; kc < G_BM / 16; kc++)
        g_wgmma_rs_t(dV, PA + 4 * kc, fa_wgmma_desc(o_addr + (uint32_t)kc * 16 * 128, G_BM * 128, 1024));
      fa_wgmma_commit();
    }
    const int want = sW[2 * st]; /* read before the stage is released (deterministic dQ) */
    auto issue_dk = [&]() { /* dK += dS^T Q (a fence of its own: ptxas wants one per block) */
      if (!dkv) return;
      fa_wgmma_fence();
      FA_UNROLL
      for (int kc = 0; kc < G_BM / 16; kc++)
        g_wgmma_rs_t(dK, DA + 4 * kc, fa_wgmma_desc(q_addr + (uint32_t)kc * 16 * 128, G_BM * 128, 1024));
      fa_wgmma_commit();
    };
    auto retire = [&]() {
      fa_wgmma_wait<0>();
      FA_UNROLL
      for (int x = 0; x < DQK / 2; x++) {
        fa_reg_fence(dK[x]);
        fa_reg_fence(dV[x]);
      }
      FA_UNROLL
      for (int x = 0; x < 16; x++) {
        fa_reg_fence_u32(PA[x]);
        fa_reg_fence_u32(DA[x]);
      }
      fa_syncwarp();
      if (lane == 0) fa_mbar_arrive(&empty[st]);
    };
    /* Both consumers' dS^T are in buffer it & 1; and each has waited for its dQ GEMM of
     * step it - 1, so buffer (it + 1) & 1 may be rewritten at step it + 1. Every step syncs,
     * also one without dQ work: otherwise a consumer could write the buffer at step it + 2
     * while the other's dQ wgmma of step it still reads it (the wait of that wgmma is the
     * only thing that ends its reads, PTX ISA wgmma.wait_group). At d = 64 only consumer
     * (it & 1) reads buffer it & 1, and it too waits before the barrier of step it + 1.
     * dQ mode tma: the issuing thread waits here for its reduces of earlier steps to have
     * read the staging buffer, which its warpgroup rewrites after the barrier (a step
     * later than the issue, so the wait is rarely a stall). */
    if (dq_tma && (tid & 127) == 0) fa_bulk_wait_read<0>();
    if (!(ab & G_AB_BAR)) fa_named_bar_sync(G_BAR_DS, 256);
    /* the same for both consumers: at d = 128 each has a column block, at d = 64 they
     * take turns */
    if (G_NCB == 1 && (it & 1) != cw) {
      issue_dk();
      retire();
      continue;
    }
    /* dQ[:, 64 qb + 0..63] = dS K over the 128 keys: A = dS^T, MN-major (rows contiguous,
     * one 128-byte span), 8-key groups 1024 bytes apart (SBO); B = K's column block qb,
     * MN-major the same way. A deterministic dQ waits for the turn of column block qb
     * (the consumer's part), and passes it on also when it has nothing to add. */
    const int qb = G_NCB == 2 ? cw : 0;
    if (!any || (ab & G_AB_DQ)) {
      g_dq_turn(p, b, h, qa, qb, want);
      retire();
      g_dq_done(p, b, h, qa, qb, cw, tid);
      continue;
    }
    float dQ[32];
    const uint32_t s_addr = fa_smem_addr(sbuf);
    fa_wgmma_fence();
    FA_UNROLL
    for (int kc = 0; kc < G_BN / 16; kc++)
      g_wgmma_ss64_tt(dQ, fa_wgmma_desc(s_addr + (uint32_t)kc * 16 * 128, G_BN * 128, 1024),
                      fa_wgmma_desc(k_addr + (uint32_t)qb * G_BN * 128 + (uint32_t)kc * 16 * 128,
                                    G_BN * 128, 1024),
                      kc > 0);
    fa_wgmma_commit();
    if (dkv) {
      issue_dk();
      fa_wgmma_wait<1>(); /* dV, dQ */
    } else {
      fa_wgmma_wait<0>();
    }
    FA_UNROLL
    for (int x = 0; x < 32; x++) fa_reg_fence(dQ[x]);
    g_dq_turn(p, b, h, qa, qb, want);
    if (ab & G_AB_DQ_ADD) {
      /* ablation: no adds */
    } else if (dq_tma) {
      /* the 64 x 64 tile into the staging buffer, as the dQ map's two 32-column boxes land
       * (row r of a half: 128 bytes, 16-byte chunk c at c ^ (r % 8): a warp's float2
       * stores hit each bank once per half-warp); TMA adds them, rows past sq clipped.
       * Rows in (qhi, sq) get zeros: dS is 0 for rows no key of the CTA sees. */
      unsigned char *stage = smem + G_DQ_OFF + cw * 2 * G_DQ_HALF;
      FA_UNROLL
      for (int n = 0; n < 8; n++)
        FA_UNROLL
        for (int i = 0; i < 2; i++) {
          const int r = 16 * wq + g + 8 * i, chunk = (2 * (n & 3) + (tg >> 1)) ^ (r & 7);
          *(g_f2 *)(stage + (n >> 2) * G_DQ_HALF + r * 128 + chunk * 16 + (tg & 1) * 8) =
              g_f2{dQ[4 * n + 2 * i], dQ[4 * n + 2 * i + 1]};
        }
      fa_fence_proxy_async(); /* read by TMA (the async proxy) */
      g_wg_bar(cw);
      if ((tid & 127) == 0) {
        fa_tma_reduce_add_4d(&maps.dq, stage, 64 * qb, qa, h, b);
        fa_tma_reduce_add_4d(&maps.dq, stage + G_DQ_HALF, 64 * qb + 32, qa, h, b);
        fa_bulk_commit();
      }
    } else {
      g_dq_atomics(p, dQ, b, h, qa, qhi, 64 * qb, wq, g, tg);
    }
    g_dq_done(p, b, h, qa, qb, cw, tid);
    retire();
  }
  /* the staging buffer must outlive the reduces' reads of it */
  if (dq_tma && (tid & 127) == 0) fa_bulk_wait_read<0>();

  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    const int kr = kr0 + 8 * i;
    if (kr >= nk) continue;
    float *dk = (float *)p.dk.p + b * p.dk.sb + (K0 + kr) * p.dk.ss + hk * p.dk.sh;
    float *dv = (float *)p.dv.p + b * p.dv.sb + (K0 + kr) * p.dv.ss + hk * p.dv.sh;
    FA_UNROLL
    for (int n = 0; n < DQK / 8; n++) {
      dk[n * 8 + 2 * tg] += dK[4 * n + 2 * i];
      dk[n * 8 + 2 * tg + 1] += dK[4 * n + 2 * i + 1];
      dv[n * 8 + 2 * tg] += dV[4 * n + 2 * i];
      dv[n * 8 + 2 * tg + 1] += dV[4 * n + 2 * i + 1];
    }
  }
#endif /* G_CSPLIT */
#endif /* FA_SM90_DEVICE */
}

extern "C" int FA_FN(attn_cuda__bwd_)(const fa_call *c) {
  const attn_cuda_problem *pb = c->pb;
  if (pb->num_seqs || pb->block_mask) return FA_ERR_FALLBACK;
  if (c->deterministic && !c->dq_sems) return FA_ERR_FALLBACK; /* the dispatcher sends it to mma */
  static int have_image = -1; /* this build's fatbin has sm_90a code for the device */
  if (!fa_sm90_has_image(&have_image, (const void *)FA_FN(flash_bwd_))) return FA_ERR_FALLBACK;
  fa_params p = fa_bwd_params(c);
  fa_bwd90_maps maps;
  if (fa_sm90_tmap(&maps.q, pb->q, DQK, pb->sq, pb->Hq, pb->B, G_BM, FA_BF16) ||
      fa_sm90_tmap(&maps.o, c->dout, DV, pb->sq, pb->Hq, pb->B, G_BM, FA_BF16) ||
      fa_sm90_tmap(&maps.k, pb->k, DQK, pb->skv, pb->Hkv, pb->B, G_BN, FA_BF16) ||
      fa_sm90_tmap(&maps.v, pb->v, DV, pb->skv, pb->Hkv, pb->B, G_BN, FA_BF16))
    return FA_ERR_FALLBACK;
  /* The dQ mode, ATTN_SM90_DQ: 1 (default) TMA reduce-adds, 0 float2 atomics. On the H200
   * (2026-12-04, bench_cuda, d = 64 and 128, N = 8K and 16K, causal or not) mode 1 ran
   * 1.09-1.12x as fast as the atomics in all eight shapes. A dQ view TMA cannot describe
   * takes the atomics. */
  memset(&maps.dq, 0, sizeof maps.dq);
  maps.dq_tma = ATTN_PARAM("SM90_DQ", 1) == 1;
  maps.ablate = G_CSPLIT || c->deterministic ? 0 : (int)ATTN_PARAM("SM90_ABLATE", 0) & 63;
  if (maps.ablate & G_AB_BAR) maps.ablate |= G_AB_DQ; /* the barrier guards dQ's reads */
  if (maps.ablate)
    attn__log(ATTN_LOG_WARN, "sm90 backward: ATTN_SM90_ABLATE=%d leaves stages out: the gradients are wrong",
              maps.ablate);
  if (c->deterministic) { /* dQ by atomics in key-block order: semaphores zeroed on the stream */
    maps.dq_tma = 0;
    p.dq_sem = c->dq_sems;
    const int e0 = attn_cuda__zero(c->dq_sems, (int64_t)(c->dq_sem_bytes / 4), c->stream);
    if (e0) return e0;
  }
  if (maps.dq_tma && G_CSPLIT) { /* the column-split kernel has no staging buffers */
    attn__log(ATTN_LOG_INFO, "sm90 backward: dQ mode 1 is not built past head dim 128, dQ by atomics");
    maps.dq_tma = 0;
  }
  if (maps.dq_tma && fa_sm90_tmap(&maps.dq, c->dq, DQK, pb->sq, pb->Hq, pb->B, G_BM, FA_TMAP_F32)) {
    attn__log(ATTN_LOG_INFO, "sm90 backward: dQ view not TMA-describable, dQ by atomics");
    maps.dq_tma = 0;
  }
  const int64_t grid_k = (pb->skv + G_BN - 1) / G_BN;
  p.ntiles = grid_k;
  int e;
  FA_LAUNCH_SMEM(e, FA_FN(flash_bwd_), dim3((unsigned)grid_k, (unsigned)pb->Hkv, (unsigned)pb->B),
                 dim3(G_THREADS), maps.dq_tma ? G_SMEM_TMA_BYTES : G_SMEM_BYTES, c->stream, p, maps);
  return e;
}
