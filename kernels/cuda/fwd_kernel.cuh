/* fwd_kernel.cuh — the body of the mma.sync flash forward kernel (see fwd_body.cuh, which
 * includes it once per CTA shape): F_WARPS warps of 16 query rows each, F_BN keys a tile,
 * Q's fragments in registers iff F_Q_IN_REGS, the decode forms (p.pack, p.nsplit) compiled
 * in iff F_DECODE, full key tiles loaded unpredicated iff F_LOAD_ALL, the ablation switches
 * (p.ablate, instance.h FA_AB_*) compiled in iff F_ABLATE, named F_NAME, declared by
 * F_KERNEL_DECL (all undefined again at the end). */
#define F_THREADS (32 * F_WARPS)
#define F_BM (16 * F_WARPS)
F_KERNEL_DECL F_NAME(const fa_params p) {
  FA_SMEM(smem);
  fa_elem *sQ = (fa_elem *)smem;     /* [F_BM][SQK] */
  fa_elem *sK = sQ + F_BM * SQK;     /* [2][F_BN][SQK] */
  fa_elem *sV = sK + 2 * F_BN * SQK; /* [2][F_BN][SV] */
  float *sAlibi = (float *)(sV + 2 * F_BN * SV); /* [F_BM] ALiBi slopes of the rows' heads, log2 units */
  const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tg = lane % 4;
  /* the CTA's query heads h0 .. h0 + pack - 1 (one KV head's, hk) */
  const int b = (int)blockIdx.z, pack = F_DECODE ? p.pack : 1, h0 = (int)blockIdx.y * pack,
            hk = h0 / (int)p.group;
  const int nsplit = F_DECODE ? p.nsplit : 1; /* the launcher gives the others 1 and 1 */
  const int ab = F_ABLATE ? p.ablate : 0;       /* stages left out: 0 but in a timing run */

  int t = (int)blockIdx.x, split = 0;
  if (nsplit > 1) {
    split = t % nsplit;
    t /= nsplit;
  }
  if (FA_CAUSAL && !p.table) t = (int)p.ntiles - 1 - t; /* longest rows first */
  fa_tile tile;
  if (!fa_get_tile(p, t, F_BM / pack, (int)p.sq, tile)) return;
  const fa_seg s = fa_fwd_seg(p, tile.seg, b);
  /* positions R0 .. rlast, rows of pack heads each */
  const int R0 = tile.r0, npos = tile.rows, rlast = R0 + npos - 1;
  const int rows = npos * pack, wr0 = 16 * warp;
  fa_qrows q;
  fa_qrows_init(p, FA_CAUSAL, s, R0, npos, pack, wr0, lane, q);
  if (nsplit > 1) fa_split_keys(nsplit, split, F_BN, q.kc0, q.kc1);
  /* read per tile (the first one's barrier orders it): registers are what O is short of */
  if (tid < F_BM) sAlibi[tid] = p.alibi ? p.alibi[h0 + tid % pack] * FA_LOG2E : 0.0f;

  const fa_elem *gQ = fa_at(p.q, b, R0, h0);
  /* K/V rows of the batch (paged: page 0's, the zero fills' source; rows come through
   * the table) */
  const fa_elem *gK = fa_at(p.k, p.pages ? 0 : b, 0, hk);
  const fa_elem *gV = fa_at(p.v, p.pages ? 0 : b, 0, hk);
  FA_LOAD_ROWS_AT(sQ, SQK, gQ, gQ + (int64_t)(r_ / pack) * p.q.ss + (int64_t)(r_ % pack) * p.q.sh,
                  DQK, F_BM, F_THREADS, tid, r_ < rows);

  /* K/V rows of keys outside the tile or seen by none of the CTA's rows are zero-filled. */
#define F_LOAD_KV(T, BUF) FA_LOAD_KV_TILE(T, BUF, F_BN, F_THREADS, p.pages != NULL, F_LOAD_ALL)
  fa_ktile cur = {0, 0, 0, 0, 0};
  cur.kt = q.kc0 / F_BN - 1;
  int have = q.kc0 < q.kc1 && fa_next_ktile(p, s, R0, npos, F_BM / pack, F_BN, q.lo_last,
                                            q.hi_first, q.kc0, q.kc1, cur);
  if (have) F_LOAD_KV(cur, 0);
  fa_cp_commit();

  /* Online-softmax state of rows g and g + 8, log2 units; l is this thread's share. */
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float acc[DV / 8][4];
  FA_UNROLL
  for (int n = 0; n < DV / 8; n++)
    FA_UNROLL
    for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
  if (p.block_mode && nsplit == 1) { /* a split starts empty: the combine adds the state */
    FA_UNROLL
    for (int i = 0; i < 2; i++) {
      const int r = wr0 + g + 8 * i;
      if (r >= rows) continue;
      fa_state_load(p, (b * p.Hq + h0 + r % pack) * p.st_rows + p.q_row0 + R0 + r / pack, i,
                    tg, &acc[0][0], m, l);
    }
  }

  /* Q's A fragments of chunk kk (16 columns), from shared memory. */
#define F_LOAD_Q(frag, kk) fa_ldsm_x4(frag, sQ + (wr0 + (lane & 15)) * SQK + (kk) * 16 + (lane >> 4) * 8)
#if F_Q_IN_REGS
  uint32_t qf[DQK / 16][4];
#endif
  for (int it = 0;; it++) {
    if (!(ab & FA_AB_BAR) || it < 2) { /* (ablated: tiles 0 and 1 stay in the buffers) */
      fa_cp_wait_all();
      FA_SYNC(); /* tile `it` landed everywhere; buffer (it+1)&1 is free */
    }
#if F_Q_IN_REGS
    if (it == 0) {
      FA_UNROLL
      for (int kk = 0; kk < DQK / 16; kk++) F_LOAD_Q(qf[kk], kk);
    }
#endif
    if (!have) break;
    fa_ktile nxt = cur;
    const int have_next = fa_next_ktile(p, s, R0, npos, F_BM / pack, F_BN, q.lo_last,
                                        q.hi_first, q.kc0, q.kc1, nxt);
    if (have_next && !((ab & FA_AB_LOAD) && it >= 1)) F_LOAD_KV(nxt, (it + 1) & 1);
    fa_cp_commit();

    const int mode = fa_qwarp_mode(p, s, q, R0, pack, wr0, cur, F_BN);
    if (mode) {
      const int ca = cur.ca, cb = cur.cb;
      const fa_elem *kb = sK + (it & 1) * F_BN * SQK, *vb = sV + (it & 1) * F_BN * SV;
      float S[F_BN / 8][4];
      FA_UNROLL
      for (int n = 0; n < F_BN / 8; n++)
        FA_UNROLL
        for (int e = 0; e < 4; e++) S[n][e] = 0.0f;
      if (!(ab & FA_AB_QK)) { /* S = Q K^T */
        FA_UNROLL
        for (int kk = 0; kk < DQK / 16; kk++) {
#if F_Q_IN_REGS
          const uint32_t *qa = qf[kk];
#else
          uint32_t qa[4];
          F_LOAD_Q(qa, kk);
#endif
          FA_MMA_ABT(S, qa, F_BN, kb, SQK, kk);
        }
      }
      /* Scores to log2 units (softcap / ALiBi only where set: otherwise the scale goes
       * into the exp2's FMA), masked by select in a partial tile, then P and the online
       * step; S[n][e] is Sf[4n + e], the fragment order of those passes. */
      float *Sf = &S[0][0], sc = p.sc, alpha[2];
      if (!(ab & FA_AB_SOFTMAX)) {
        if (p.cap2 > 0.0f || p.alibi) {
          const float alibi2[2] = {sAlibi[wr0 + g], sAlibi[wr0 + g + 8]};
          const int base[2] = {q.ipos[0] - ca, q.ipos[1] - ca};
          fa_score_tile<F_BN / 2>(p, Sf, alibi2, base, tg);
          sc = 1.0f;
        }
        if (mode == 2) fa_mask_tile<F_BN / 2>(p, s, q, ca, cb, tg, Sf);
        fa_exp_rows<F_BN / 2, 1>(Sf, sc, m, l, alpha);
        FA_UNROLL
        for (int n = 0; n < DV / 8; n++)
          FA_UNROLL
          for (int e = 0; e < 4; e++) acc[n][e] *= alpha[e >> 1];
      }
      /* O += P V: P from the score registers (C layout == A layout), V by ldmatrix.trans. */
      if (!(ab & FA_AB_PV)) FA_MMA_SCORES_SMEM(acc, S, F_BN, DV, vb, SV);
    }
    cur = nxt;
    have = have_next;
  }
#undef F_LOAD_KV
#undef F_LOAD_Q

  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    l[i] += fa_shfl_xor(l[i], 1);
    l[i] += fa_shfl_xor(l[i], 2);
  }
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    const int r = wr0 + g + 8 * i, pos = R0 + r / pack, h = h0 + r % pack;
    if (r >= rows) continue;
    if (nsplit > 1) {
      const int split_ = (int)blockIdx.x % nsplit; /* again: no register held for it */
      const int64_t prow = (int64_t)split_ * (p.B * p.Hq * p.sq) + (b * p.Hq + h) * p.sq + pos;
      fa_state_put(p.part_m, p.part_l, p.part_acc, prow, i, tg, &acc[0][0], m, l);
      continue;
    }
    if (p.block_mode) {
      fa_state_store(p, (b * p.Hq + h) * p.st_rows + p.q_row0 + pos, i, tg, &acc[0][0], m, l);
      continue;
    }
    const float sink2 = p.sinks ? p.sinks[h] * FA_LOG2E : -INFINITY;
    float inv, lse2;
    fa_row_finish(m[i], l[i], sink2, &inv, &lse2);
    fa_elem *o = (fa_elem *)p.o.p + b * p.o.sb + pos * p.o.ss + h * p.o.sh;
    FA_UNROLL
    for (int n = 0; n < DV / 8; n++)
      *(uint32_t *)(o + n * 8 + 2 * tg) = fa_pack(acc[n][2 * i] * inv, acc[n][2 * i + 1] * inv);
    if (tg == 0 && p.lse) p.lse[(b * p.Hq + h) * p.lse_rows + p.q_row0 + pos] = lse2 / FA_LOG2E;
  }
}

#undef F_THREADS
#undef F_BM
#undef F_WARPS
#undef F_BN
#undef F_Q_IN_REGS
#undef F_DECODE
#undef F_LOAD_ALL
#undef F_ABLATE
#undef F_NAME
#undef F_KERNEL_DECL
