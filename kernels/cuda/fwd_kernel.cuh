/* fwd_kernel.cuh — the body of the mma.sync flash forward kernel (see fwd_body.cuh, which
 * includes it once per CTA shape): F_WARPS warps of F_MS 16-row m-tiles each (every K/V
 * fragment loaded once for a warp's m-tiles), F_BN keys a tile,
 * Q's fragments in registers iff F_Q_IN_REGS, the decode forms (p.pack, p.nsplit) compiled
 * in iff F_DECODE, full key tiles loaded unpredicated iff F_LOAD_ALL, the ablation switches
 * (p.ablate, instance.h FA_AB_*) compiled in iff F_ABLATE, the m-tiles' row bounds read
 * from a table in shared memory where a tile needs them iff F_ROW_TABLE (else they stay in
 * registers: two m-tiles' 26 would not fit beside O), F_STAGES K/V buffers (a ring: tile it
 * in buffer it % F_STAGES, F_STAGES - 1 tiles in flight while one is computed; past 2 the
 * buffers' tile descriptors wait in shared memory), the warps splitting each key tile iff
 * F_KSPLIT (the decode kernel: one 16-row m-tile a CTA, warp w computing keys
 * [w F_KW, (w + 1) F_KW) of every tile with an online-softmax state of its own, the states
 * merged across the warps after the last tile; 0 where not defined), named F_NAME, declared
 * by F_KERNEL_DECL (all undefined again at the end). */
#ifndef F_KSPLIT
#define F_KSPLIT 0
#endif
#define F_THREADS (32 * F_WARPS)
#define F_BM (F_KSPLIT ? 16 : 16 * F_WARPS * F_MS)
#define F_KW (F_KSPLIT ? F_BN / F_WARPS : F_BN) /* keys of a tile one warp computes */
static_assert(!F_KSPLIT || (F_MS == 1 && F_KW == 16 && F_BN == 16 * F_WARPS),
              "the key-split kernel: one m-tile, 16 keys a warp");
F_KERNEL_DECL F_NAME(const fa_params p) {
  FA_SMEM(smem);
  fa_elem *sQ = (fa_elem *)smem;     /* [F_BM][SQK] */
  fa_elem *sK = sQ + F_BM * SQK;            /* [F_STAGES][F_BN][SQK] */
  fa_elem *sV = sK + F_STAGES * F_BN * SQK; /* [F_STAGES][F_BN][SV] */
  float *sAlibi = (float *)(sV + F_STAGES * F_BN * SV); /* [F_BM] ALiBi slopes of the rows' heads, log2 units */
  fa_qrow *sRow = (fa_qrow *)(sAlibi + F_BM);    /* [F_BM] iff F_ROW_TABLE: fa_qrow_at of each row */
  /* [F_STAGES] iff F_STAGES > 2: buffer i's tile (kt < 0: none), written by thread 0 as it
   * issues the loads, read after the barrier that says they landed */
  fa_ktile *sTile = (fa_ktile *)(sRow + (F_ROW_TABLE ? F_BM : 0));
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
  const int rows = npos * pack;
  /* the warp's m-tiles: rows wr0[ms] .. + 15 (q[0] also holds the CTA's key range) */
  int wr0[F_MS];
  fa_qrows q[F_MS];
  FA_UNROLL
  for (int ms = 0; ms < F_MS; ms++) {
    wr0[ms] = F_KSPLIT ? 0 : 16 * (warp * F_MS + ms); /* key split: every warp all 16 rows */
    fa_qrows_init(p, FA_CAUSAL, s, R0, npos, pack, wr0[ms], lane, q[ms]);
  }
  if (nsplit > 1) fa_split_keys(nsplit, split, F_BN, q[0].kc0, q[0].kc1);
  /* read per tile (the first one's barrier orders them): registers are what O is short of */
  if (tid < F_BM) sAlibi[tid] = p.alibi ? p.alibi[h0 + tid % pack] * FA_LOG2E : 0.0f;
  if (F_ROW_TABLE)
    for (int r = tid; r < F_BM; r += F_THREADS) sRow[r] = fa_qrow_at(p, FA_CAUSAL, s, R0, npos, pack, r);
/* m-tile ms's row bounds: q[ms], or read from the table into tmp (q[0] gives the CTA's) */
#define F_QROWS(ms, tmp) (F_ROW_TABLE ? fa_qrows_tab(sRow, q[0], rows, wr0[ms], lane, tmp) : q[ms])

  const fa_elem *gQ = fa_at(p.q, b, R0, h0);
  /* K/V rows of the batch (paged: page 0's, the zero fills' source; rows come through
   * the table) */
  const fa_elem *gK = fa_at(p.k, p.pages ? 0 : b, 0, hk);
  const fa_elem *gV = fa_at(p.v, p.pages ? 0 : b, 0, hk);
  FA_LOAD_ROWS_AT(sQ, SQK, gQ, gQ + (int64_t)(r_ / pack) * p.q.ss + (int64_t)(r_ % pack) * p.q.sh,
                  DQK, F_BM, F_THREADS, tid, r_ < rows);

  /* K/V rows of keys outside the tile or seen by none of the CTA's rows are zero-filled. */
/* the ring buffer of tile i (i >= 0) */
#define F_BUF(i) (F_STAGES == 2 ? (i) & 1 : (int)((unsigned)(i) % F_STAGES))
#define F_LOAD_KV(T, BUF) FA_LOAD_KV_TILE(T, BUF, F_BN, F_THREADS, p.pages != NULL, F_LOAD_ALL)
  fa_ktile cur = {0, 0, 0, 0, 0};
  cur.kt = q[0].kc0 / F_BN - 1;
  int have = q[0].kc0 < q[0].kc1 && fa_next_ktile(p, s, R0, npos, F_BM / pack, F_BN, q[0].lo_last,
                                                  q[0].hi_first, q[0].kc0, q[0].kc1, cur);
  if (have) F_LOAD_KV(cur, 0);
  fa_cp_commit();
  /* F_STAGES > 2: the next F_STAGES - 2 tiles too; ahead is the last tile issued, and more
   * says that it is one (so tiles may follow it) */
  fa_ktile ahead = cur;
  int more = have;
  FA_UNROLL
  for (int j = 1; j < F_STAGES - 1; j++) {
    more = more && fa_next_ktile(p, s, R0, npos, F_BM / pack, F_BN, q[0].lo_last, q[0].hi_first,
                                 q[0].kc0, q[0].kc1, ahead);
    if (more) F_LOAD_KV(ahead, j);
    fa_cp_commit();
    if (tid == 0) {
      sTile[j] = ahead;
      sTile[j].kt = more ? ahead.kt : -1;
    }
  }

  /* Online-softmax state of each m-tile's rows g and g + 8, log2 units; l is this
   * thread's share. */
  float m[F_MS][2], l[F_MS][2];
  float acc[F_MS][DV / 8][4];
  FA_UNROLL
  for (int ms = 0; ms < F_MS; ms++) {
    FA_UNROLL
    for (int i = 0; i < 2; i++) {
      m[ms][i] = -INFINITY;
      l[ms][i] = 0.0f;
    }
    FA_UNROLL
    for (int n = 0; n < DV / 8; n++)
      FA_UNROLL
      for (int e = 0; e < 4; e++) acc[ms][n][e] = 0.0f;
  }
  /* a split starts empty: the combine adds the state; split keys: warp 0 carries it */
  if (p.block_mode && nsplit == 1 && (!F_KSPLIT || warp == 0)) {
    FA_UNROLL
    for (int ms = 0; ms < F_MS; ms++)
      FA_UNROLL
      for (int i = 0; i < 2; i++) {
        const int r = wr0[ms] + g + 8 * i;
        if (r >= rows) continue;
        fa_state_load(p, (b * p.Hq + h0 + r % pack) * p.st_rows + p.q_row0 + R0 + r / pack, i,
                      tg, &acc[ms][0][0], m[ms], l[ms]);
      }
  }

  /* Q's A fragments of chunk kk (16 columns) of m-tile ms, from shared memory. */
#define F_LOAD_Q(frag, kk, ms) \
  fa_ldsm_x4(frag, sQ + (wr0[ms] + (lane & 15)) * SQK + (kk) * 16 + (lane >> 4) * 8)
#if F_Q_IN_REGS
  uint32_t qf[F_MS][DQK / 16][4];
#endif
  for (int it = 0;; it++) {
    if (!(ab & FA_AB_BAR) || it < 2) { /* (ablated: tiles 0 and 1 stay in the buffers) */
      fa_cp_wait_group<F_STAGES - 2>();
      FA_SYNC(); /* tile `it` landed everywhere; buffer (it-1) % F_STAGES is free */
    }
    if (F_STAGES > 2 && it > 0) {
      cur = sTile[F_BUF(it)];
      have = cur.kt >= 0;
    }
#if F_Q_IN_REGS
    if (it == 0) {
      FA_UNROLL
      for (int ms = 0; ms < F_MS; ms++)
        FA_UNROLL
        for (int kk = 0; kk < DQK / 16; kk++) F_LOAD_Q(qf[ms][kk], kk, ms);
    }
#endif
    if (!have) break;
    /* the tile after the last one issued, into the buffer computed last */
    fa_ktile nxt = F_STAGES > 2 ? ahead : cur;
    int have_next = 0;
    if (F_STAGES == 2 || more)
      have_next = fa_next_ktile(p, s, R0, npos, F_BM / pack, F_BN, q[0].lo_last, q[0].hi_first,
                                q[0].kc0, q[0].kc1, nxt);
    if (have_next && !((ab & FA_AB_LOAD) && it >= 1)) F_LOAD_KV(nxt, F_BUF(it + F_STAGES - 1));
    fa_cp_commit();
    if (F_STAGES > 2) {
      if (tid == 0) {
        sTile[F_BUF(it + F_STAGES - 1)] = nxt;
        sTile[F_BUF(it + F_STAGES - 1)].kt = have_next ? nxt.kt : -1;
      }
      ahead = nxt;
      more = have_next;
    }

    /* each m-tile's share of the tile (fa_qwarp_mode); the warp computes if any has one,
     * and an idle m-tile beside a busy one is masked whole (every row's range excludes the
     * tile, or the block mask does) */
    /* the warp's keys of the tile, [wt.ca, wt.cb): all of them, or (F_KSPLIT) its F_KW,
     * rows warp * F_KW.. of the buffers (none past the tile's end) */
    fa_ktile wt = cur;
    if (F_KSPLIT) {
      wt.ca = cur.ca + warp * F_KW;
      wt.cb = fa_min(cur.cb, wt.ca + F_KW);
    }
    int mode[F_MS], any = 0;
    FA_UNROLL
    for (int ms = 0; ms < F_MS; ms++) { /* a tile full for the CTA is for every m-tile */
      fa_qrows qt;
      mode[ms] = F_MS > 1 && cur.full ? 1
                 : F_KSPLIT && wt.ca >= wt.cb
                     ? 0
                     : fa_qwarp_mode(p, s, F_QROWS(ms, qt), R0, pack, wr0[ms], wt, F_KW);
      any |= mode[ms];
    }
    if (any) {
      const int ca = wt.ca, cb = wt.cb;
      const int buf = F_BUF(it);
      const fa_elem *kb = sK + buf * F_BN * SQK + (F_KSPLIT ? warp * F_KW * SQK : 0),
                    *vb = sV + buf * F_BN * SV + (F_KSPLIT ? warp * F_KW * SV : 0);
      float S[F_MS][F_KW / 8][4];
      FA_UNROLL
      for (int ms = 0; ms < F_MS; ms++)
        FA_UNROLL
        for (int n = 0; n < F_KW / 8; n++)
          FA_UNROLL
          for (int e = 0; e < 4; e++) S[ms][n][e] = 0.0f;
      if (!(ab & FA_AB_QK)) { /* S = Q K^T */
        FA_UNROLL
        for (int kk = 0; kk < DQK / 16; kk++) {
#if F_Q_IN_REGS
          const uint32_t *qa[F_MS];
          FA_UNROLL
          for (int ms = 0; ms < F_MS; ms++) qa[ms] = qf[ms][kk];
#else
          uint32_t qa[F_MS][4];
          FA_UNROLL
          for (int ms = 0; ms < F_MS; ms++) F_LOAD_Q(qa[ms], kk, ms);
#endif
          FA_MMA_ABT_M(S, qa, F_MS, FA_EACH, F_KW, kb, SQK, kk);
        }
      }
      /* Scores to log2 units (softcap / ALiBi only where set: otherwise the scale goes
       * into the exp2's FMA), masked by select in a partial tile, then P and the online
       * step; S[n][e] is Sf[4n + e], the fragment order of those passes. */
      if (!(ab & FA_AB_SOFTMAX)) {
        FA_UNROLL
        for (int ms = 0; ms < F_MS; ms++) {
          float *Sf = &S[ms][0][0], sc = p.sc, alpha[2];
          if (p.cap2 > 0.0f || p.alibi) {
            fa_qrows qt;
            const fa_qrows &qs = F_QROWS(ms, qt);
            const float alibi2[2] = {sAlibi[wr0[ms] + g], sAlibi[wr0[ms] + g + 8]};
            const int base[2] = {qs.ipos[0] - ca, qs.ipos[1] - ca};
            fa_score_tile<F_KW / 2>(p, Sf, alibi2, base, tg);
            sc = 1.0f;
          }
          if (F_MS == 1 ? mode[ms] == 2 : mode[ms] != 1) {
            fa_qrows qt;
            fa_mask_tile<F_KW / 2>(p, s, F_QROWS(ms, qt), ca, cb, tg, Sf);
          }
          fa_exp_rows<F_KW / 2, 1>(Sf, sc, m[ms], l[ms], alpha);
          FA_UNROLL
          for (int n = 0; n < DV / 8; n++)
            FA_UNROLL
            for (int e = 0; e < 4; e++) acc[ms][n][e] *= alpha[e >> 1];
        }
      }
      /* O += P V: P from the score registers (C layout == A layout), V by ldmatrix.trans. */
      if (!(ab & FA_AB_PV)) FA_MMA_SCORES_SMEM_M(acc, S, F_MS, FA_EACH, F_KW, DV, vb, SV);
    }
    if (F_STAGES == 2) {
      cur = nxt;
      have = have_next;
    }
  }
#undef F_LOAD_KV
#undef F_BUF
#undef F_LOAD_Q
#undef F_QROWS
#if F_KSPLIT
  /* The warps' states merged into warp 0's, in warp order (repeatable): M = max m_w, and
   * l, acc = sum over w of 2^(m_w - M) (l_w, acc_w) (0 for a warp that saw nothing of the
   * row). Every warp is past the last tile (the loop ends after a barrier) and no load is
   * in flight, so the K/V buffers hold the exchange: sMax [F_WARPS][16] the warps' row
   * maxima; sPart [F_WARPS - 1][2 + DV / 2][32] warps 1..'s l shares and O fragments, one
   * float a lane (lane-contiguous: no bank conflicts). */
  fa_cp_wait_all();
  float *sMax = (float *)sK, *sPart = sMax + F_WARPS * 16;
  if (tg == 0) {
    sMax[warp * 16 + g] = m[0][0];
    sMax[warp * 16 + g + 8] = m[0][1];
  }
  if (warp > 0) {
    float *w_ = sPart + (warp - 1) * (2 + DV / 2) * 32 + lane;
    w_[0] = l[0][0];
    w_[32] = l[0][1];
    FA_UNROLL
    for (int n = 0; n < DV / 8; n++)
      FA_UNROLL
      for (int e = 0; e < 4; e++) w_[(2 + 4 * n + e) * 32] = acc[0][n][e];
  }
  FA_SYNC();
  if (warp > 0) return; /* warp 0 writes the rows (no barrier follows) */
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    float top = -INFINITY;
    FA_UNROLL
    for (int w = 0; w < F_WARPS; w++) top = fmaxf(top, sMax[w * 16 + g + 8 * i]);
    const float f0 = top == -INFINITY ? 0.0f : exp2f(m[0][i] - top);
    l[0][i] *= f0;
    FA_UNROLL
    for (int n = 0; n < DV / 8; n++)
      FA_UNROLL
      for (int e = 2 * i; e < 2 * i + 2; e++) acc[0][n][e] *= f0;
    FA_UNROLL
    for (int w = 1; w < F_WARPS; w++) {
      const float mw = sMax[w * 16 + g + 8 * i];
      const float f = mw == -INFINITY ? 0.0f : exp2f(mw - top);
      const float *r_ = sPart + (w - 1) * (2 + DV / 2) * 32 + lane;
      l[0][i] += f * r_[32 * i];
      FA_UNROLL
      for (int n = 0; n < DV / 8; n++)
        FA_UNROLL
        for (int e = 2 * i; e < 2 * i + 2; e++) acc[0][n][e] += f * r_[(2 + 4 * n + e) * 32];
    }
    m[0][i] = top;
  }
#endif

  FA_UNROLL
  for (int ms = 0; ms < F_MS; ms++)
    FA_UNROLL
    for (int i = 0; i < 2; i++) {
      l[ms][i] += fa_shfl_xor(l[ms][i], 1);
      l[ms][i] += fa_shfl_xor(l[ms][i], 2);
    }
  FA_UNROLL
  for (int ms = 0; ms < F_MS; ms++)
    FA_UNROLL
    for (int i = 0; i < 2; i++) {
      const int r = wr0[ms] + g + 8 * i, pos = R0 + r / pack, h = h0 + r % pack;
      if (r >= rows) continue;
      if (nsplit > 1) {
        const int split_ = (int)blockIdx.x % nsplit; /* again: no register held for it */
        const int64_t prow = (int64_t)split_ * (p.B * p.Hq * p.sq) + (b * p.Hq + h) * p.sq + pos;
        fa_state_put(p.part_m, p.part_l, p.part_acc, prow, i, tg, &acc[ms][0][0], m[ms], l[ms]);
        continue;
      }
      if (p.block_mode) {
        fa_state_store(p, (b * p.Hq + h) * p.st_rows + p.q_row0 + pos, i, tg, &acc[ms][0][0], m[ms],
                       l[ms]);
        continue;
      }
      const float sink2 = p.sinks ? p.sinks[h] * FA_LOG2E : -INFINITY;
      float inv, lse2;
      fa_row_finish(m[ms][i], l[ms][i], sink2, &inv, &lse2);
      fa_elem *o = (fa_elem *)p.o.p + b * p.o.sb + pos * p.o.ss + h * p.o.sh;
      FA_UNROLL
      for (int n = 0; n < DV / 8; n++)
        *(uint32_t *)(o + n * 8 + 2 * tg) = fa_pack(acc[ms][n][2 * i] * inv, acc[ms][n][2 * i + 1] * inv);
      if (tg == 0 && p.lse) p.lse[(b * p.Hq + h) * p.lse_rows + p.q_row0 + pos] = lse2 / FA_LOG2E;
    }
}

#undef F_THREADS
#undef F_BM
#undef F_WARPS
#undef F_MS
#undef F_BN
#undef F_Q_IN_REGS
#undef F_DECODE
#undef F_LOAD_ALL
#undef F_ABLATE
#undef F_ROW_TABLE
#undef F_STAGES
#undef F_KSPLIT
#undef F_KW
#undef F_NAME
#undef F_KERNEL_DECL
