/* bwd_sm90_csplit.cuh — the consumers of the Hopper backward when whole key rows of dK and
 * dV do not fit in registers (head dims 256 and (Dqk, Dv) = (192, 128); included by
 * bwd_sm90_body.cuh under G_CSPLIT, which has defined the tile macros and helpers).
 *
 * The CTA owns 64 keys and both consumer warpgroups work on all of them, split so that no
 * product is computed twice:
 *   rows    — consumer w computes S^T = K Q^T and dP^T = V dO^T for query rows 32 w.. of
 *             the step (m64n32k16), turns them into P^T and dS^T (g_probs) and writes its
 *             half of each to a shared-memory tile (double-buffered over steps); a named
 *             barrier over both consumers then makes the whole tiles readable;
 *   columns — each consumer accumulates the dK and dV columns g_cols<w> gives it
 *             (dK += dS^T Q, dV += P^T dO: m64nNk16, A = dS^T / P^T K-major from shared
 *             memory, B = Q / dO column blocks MN-major) and adds its dQ column blocks
 *             (dQ = dS K: m64n64k16 each, A = dS^T MN-major, B = a K column block).
 * At 256 the columns split in halves (dK, dV 128 each and 2 dQ blocks a consumer: 128
 * accumulators a thread); at 192 x 128 consumer 0 takes all of dK (192) and dQ block 0,
 * consumer 1 all of dV (128) and dQ blocks 1, 2: the same work each (S and dP halves plus
 * 256 gradient columns), 96 and 64 accumulators a thread. The gradient groups are
 * committed separately: the (Q, dO) stage is released after the first, and each dQ
 * block's atomics overlap the next block's product. */

/* dK columns [KC0, KC0 + KN), dV columns [VC0, VC0 + VN), dQ column blocks [QB0, QB0 + QN)
 * of consumer W. */
template <int W> struct g_cols;
#if DQK == 256
template <> struct g_cols<0> { enum { KC0 = 0, KN = 128, VC0 = 0, VN = 128, QB0 = 0, QN = 2 }; };
template <> struct g_cols<1> { enum { KC0 = 128, KN = 128, VC0 = 128, VN = 128, QB0 = 2, QN = 2 }; };
#elif DQK == 192 && DV == 128
template <> struct g_cols<0> { enum { KC0 = 0, KN = 192, VC0 = 0, VN = 0, QB0 = 0, QN = 1 }; };
template <> struct g_cols<1> { enum { KC0 = 0, KN = 0, VC0 = 0, VN = 128, QB0 = 1, QN = 2 }; };
#else
#error "no column split for these head dims"
#endif

/* d[N / 2] += A B, m64nNk16, A K-major and B MN-major from shared memory: N = 128 or 192 */
template <int N> FA_DEV void g_wgmma_ss_tn(float *d, uint64_t da, uint64_t db) {
  static_assert(N == 128 || N == 192, "m64n128k16 or m64n192k16");
  if constexpr (N == 128)
    g_wgmma_ss_t(d, da, db);
  else
    g_wgmma_ss_t192(d, da, db);
}

/* d += A B over the step's 64 rows: A = dS^T / P^T (keys x rows, K-major, 32 bytes a k16
 * chunk into the 128-byte row), B = Q / dO from column block b (MN-major: LBO G_BM * 128
 * to the next block, SBO 1024 between 8-row groups). */
template <int N> FA_DEV void g_grad_t(float *d, uint32_t a, uint32_t b) {
  FA_UNROLL
  for (int kc = 0; kc < G_BM / 16; kc++)
    g_wgmma_ss_tn<N>(d, fa_wgmma_desc(a + (uint32_t)kc * 32, 16, 1024),
                     fa_wgmma_desc(b + (uint32_t)kc * 16 * 128, G_BM * 128, 1024));
}

/* What the consumers share with the kernel: the problem, the shared-memory tiles and
 * barriers (bwd_sm90_body.cuh's layout), the CTA's keys and steps, and the thread's place. */
struct g_ctx {
  const fa_params *p;
  fa_seg s;
  fa_elem *sK, *sV, *sQ, *sO, *sS;
  float *sL, *sD;
  int *sW; /* [G_STAGES][2]: the deterministic dQ's turn of each stage's step */
  uint64_t *bar_kv, *kv_ok, *full, *empty;
  int b, hk, group, K0, nk, qlo, qhi, nsteps, total, tid, wq, g, tg, lane;
};

template <int W> FA_DEV void g_csplit_consumer(const g_ctx &cx) {
  typedef g_cols<W> C;
  const fa_params &p = *cx.p;
  const int hk = cx.hk, group = cx.group, qlo = cx.qlo, nsteps = cx.nsteps; /* for G_STEP */
  const int b = cx.b, K0 = cx.K0, nk = cx.nk, qhi = cx.qhi, wq = cx.wq, g = cx.g, tg = cx.tg;
  const int tid = cx.tid;
  const g_keys all = g_wg_keys(p, cx.s, K0, nk, 0);
  const int kr0 = 16 * wq + g; /* the thread's two keys: kr0, kr0 + 8 */
  int klo[2], khi[2], kdist[2];
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    klo[i] = (int)p.sq;
    khi[i] = -1;
    if (kr0 + 8 * i < nk) fa_key_rows(p, FA_CAUSAL, cx.s, K0 + kr0 + 8 * i, klo[i], khi[i]);
    /* ALiBi: distance of (query r, key) = |r + qpos_row0 + off - kpos_col0 - key| */
    kdist[i] = cx.s.qpos_row0 + cx.s.off - cx.s.kpos_col0 - (K0 + kr0 + 8 * i);
  }
  const uint32_t k_addr = fa_smem_addr(cx.sK), v_addr = fa_smem_addr(cx.sV);
  /* m64nN D fragments: keys kr0 (+8), columns KC0 / VC0 + 8n + 2tg (+1) */
  float dK[C::KN != 0 ? C::KN / 2 : 1], dV[C::VN != 0 ? C::VN / 2 : 1];
  FA_UNROLL
  for (int x = 0; x < C::KN / 2; x++) dK[x] = 0.0f;
  FA_UNROLL
  for (int x = 0; x < C::VN / 2; x++) dV[x] = 0.0f;
  fa_mbar_wait(cx.bar_kv, 0);
  fa_mbar_wait(cx.kv_ok, 0);

  for (int it = 0; it < cx.total; it++) {
    const int st = it % G_STAGES, ph = (it / G_STAGES) & 1;
    G_STEP(it, h, qa);
    const int qn = fa_min(G_BM, qhi + 1 - qa);
    const int mode = g_mode(all, qa + 32 * W, qn - 32 * W, 32), any = g_mode(all, qa, qn, G_BM);
    const uint32_t q_addr = fa_smem_addr(cx.sQ + st * G_BM * DQK);
    const uint32_t o_addr = fa_smem_addr(cx.sO + st * G_BM * DV);
    unsigned char *dsbuf = (unsigned char *)(cx.sS + (it & 1) * G_BN * G_BM);
    unsigned char *pbuf = (unsigned char *)(cx.sS + (2 + (it & 1)) * G_BN * G_BM);
    fa_mbar_wait(&cx.full[st], ph);
    if (any) {
      uint32_t PA[8], DA[8]; /* P^T, dS^T of the thread's keys x its 32 rows, packed */
      if (mode) {
        /* Q's and dO's rows 32 W.. are 4096 bytes into each column block (a whole number of
         * 1024-byte swizzle patterns) */
        g_scores_t<32>(PA, DA, p, mode, h, qa, 32 * W, k_addr, v_addr, q_addr + 32 * W * 128,
                       o_addr + 32 * W * 128, cx.sL + st * G_BM, cx.sD + st * G_BM, klo, khi, kdist, tg);
      } else {
        FA_UNROLL
        for (int x = 0; x < 8; x++) PA[x] = DA[x] = 0u;
      }
      /* the warpgroup's 32 rows (16-byte chunks 4 W..) of P^T and dS^T */
      g_put_t<4>(pbuf, PA, kr0, 4 * W, tg);
      g_put_t<4>(dsbuf, DA, kr0, 4 * W, tg);
      fa_fence_proxy_async(); /* read by the gradient wgmma (the async proxy) */
    }
    /* Both halves of P^T and dS^T are in buffers it & 1. Every step syncs, and each
     * consumer has waited for its wgmma of step it - 1 before it gets here, so buffers
     * (it + 1) & 1 may be rewritten at step it + 1 (the argument of the d = 128 kernel). */
    fa_named_bar_sync(G_BAR_DS, 256);
    if (!any) {
      const int want = cx.sW[2 * st];
      fa_syncwarp();
      if (cx.lane == 0) fa_mbar_arrive(&cx.empty[st]);
      /* a deterministic dQ's turn is passed on also with nothing to add */
      g_dq_turn(p, b, h, qa, W, want);
      g_dq_done(p, b, h, qa, W, W, tid);
      continue;
    }
    /* dK += dS^T Q, dV += P^T dO on the consumer's columns: A K-major (keys x rows, 32
     * bytes a k16 chunk into the row), B MN-major from the first column block (LBO G_BM *
     * 128 to the next, SBO 1024 between 8-row groups); then dQ[:, 64 qb..] = dS K for its
     * blocks qb: A = dS^T MN-major, B = K's column block qb, MN-major */
    const uint32_t p_addr = fa_smem_addr(pbuf), ds_addr = fa_smem_addr(dsbuf);
    FA_UNROLL
    for (int x = 0; x < C::KN / 2; x++) fa_reg_fence(dK[x]);
    FA_UNROLL
    for (int x = 0; x < C::VN / 2; x++) fa_reg_fence(dV[x]);
    float dQ[C::QN][32];
    fa_wgmma_fence();
    if constexpr (C::KN != 0)
      g_grad_t<C::KN>(dK, ds_addr, q_addr + (uint32_t)(C::KC0 / 64) * G_BM * 128);
    if constexpr (C::VN != 0)
      g_grad_t<C::VN>(dV, p_addr, o_addr + (uint32_t)(C::VC0 / 64) * G_BM * 128);
    fa_wgmma_commit();
    FA_UNROLL
    for (int j = 0; j < C::QN; j++) {
      const uint32_t kb = k_addr + (uint32_t)(C::QB0 + j) * G_BN * 128;
      FA_UNROLL
      for (int kc = 0; kc < G_BN / 16; kc++)
        g_wgmma_ss64_tt(dQ[j], fa_wgmma_desc(ds_addr + (uint32_t)kc * 16 * 128, G_BN * 128, 1024),
                        fa_wgmma_desc(kb + (uint32_t)kc * 16 * 128, G_BN * 128, 1024), kc > 0);
      fa_wgmma_commit();
    }
    fa_wgmma_wait<C::QN>(); /* dK / dV: the stage's Q and dO are read */
    FA_UNROLL
    for (int x = 0; x < C::KN / 2; x++) fa_reg_fence(dK[x]);
    FA_UNROLL
    for (int x = 0; x < C::VN / 2; x++) fa_reg_fence(dV[x]);
    const int want = cx.sW[2 * st]; /* read before the stage is released */
    fa_syncwarp();
    if (cx.lane == 0) fa_mbar_arrive(&cx.empty[st]);
    g_dq_turn(p, b, h, qa, W, want); /* a deterministic dQ: this part's turn */
    fa_wgmma_wait<C::QN - 1>();
    FA_UNROLL
    for (int x = 0; x < 32; x++) fa_reg_fence(dQ[0][x]);
    g_dq_atomics(p, dQ[0], b, h, qa, qhi, 64 * C::QB0, wq, g, tg);
    if constexpr (C::QN == 2) {
      fa_wgmma_wait<0>();
      FA_UNROLL
      for (int x = 0; x < 32; x++) fa_reg_fence(dQ[1][x]);
      g_dq_atomics(p, dQ[1], b, h, qa, qhi, 64 * (C::QB0 + 1), wq, g, tg);
    }
    g_dq_done(p, b, h, qa, W, W, tid);
  }

  /* the CTA is the only writer of its dK / dV rows */
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    const int kr = kr0 + 8 * i;
    if (kr >= nk) continue;
    float *dk = (float *)p.dk.p + b * p.dk.sb + (K0 + kr) * p.dk.ss + hk * p.dk.sh + C::KC0;
    float *dv = (float *)p.dv.p + b * p.dv.sb + (K0 + kr) * p.dv.ss + hk * p.dv.sh + C::VC0;
    FA_UNROLL
    for (int n = 0; n < C::KN / 8; n++) {
      dk[n * 8 + 2 * tg] += dK[4 * n + 2 * i];
      dk[n * 8 + 2 * tg + 1] += dK[4 * n + 2 * i + 1];
    }
    FA_UNROLL
    for (int n = 0; n < C::VN / 8; n++) {
      dv[n * 8 + 2 * tg] += dV[4 * n + 2 * i];
      dv[n * 8 + 2 * tg + 1] += dV[4 * n + 2 * i + 1];
    }
  }
}
