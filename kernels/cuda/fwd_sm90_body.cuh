/* fwd_sm90_body.cuh — the Hopper (sm_90a) flash forward, head dims (Dqk, Dv) = (64, 64),
 * (128, 128), (192, 128) (DeepSeek MLA) and (256, 256), one shot (O, LSE, sinks) or block
 * mode (the float32 state carried from call to call, as the ring runs it), and its
 * launcher; instantiated by fwd_hd{64,128,192x128,256}_{bf16,f16}[_causal]_sm90.cu.
 *
 * A persistent grid (one CTA per SM) walks the work tiles, 128 query rows of one (batch,
 * head) each, gridDim.x apart; causal, the tiles that see the most keys come first.
 * Warp-specialised: a CTA has three warpgroups. Warpgroup 0 is the producer: one thread
 * loads each work tile's Q (once both consumers have released the last one on
 * "empty_q") and the K and V tiles of H_BN keys (128; 176 at 128 not causal; 64 at 256) into a ring of
 * H_STAGES with TMA (128-byte swizzle, completing on "full" mbarriers with transaction
 * counts), K of tile j + 1 before V of tile j, the order the consumers use them in; its
 * second warp zero-fills,
 * in each V tile, the rows of keys that none of the work tile's queries sees, so NaN/Inf
 * there cannot reach P V, and then signals the tile on "v_ok". Warpgroups 1 and 2 are
 * the consumers, 64 rows each, with wgmma: S = Q K^T by m64n(H_BN)k16 (Q and K from shared
 * memory, K-major; Dqk / 16 k-steps), the online softmax in registers (float32, log2
 * units, the mma.sync kernel's masking and transform), O += P V by m64n(Dv)k16 (P from
 * registers, V from shared memory, MN-major). Q and K rows are Dqk / 64 swizzled column
 * blocks of 64 elements (one TMA box each), V and O rows Dv / 64: 3 and 2 at (192, 128),
 * 4 at 256, 2 at 128, 1 at 64. K and V stages are
 * released on "empty_k" / "empty_v" as soon as the GEMM that reads them has completed.
 * setmaxnreg moves registers from the producer to the consumers.
 *
 * The consumer schedule (FlashAttention 3's two overlaps), in slots j = 0 .. ntiles:
 *  - within a warpgroup, slot j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} as two
 *    wgmma groups, waits for the first only and runs the softmax of S_j while P_{j-1} V_{j-1}
 *    is still on the tensor cores; then it waits for that, rescales O and packs P_j. Live
 *    across a slot: O (Dv / 2), S (H_BN / 2) and the packed P (H_BN / 4) registers a
 *    thread (Dqk only sets the number of k-steps of S): 64 + 64 + 32 at 128 causal, 64 +
 *    88 + 44 at 128 with 176-key tiles, 128 + 32 + 16 at 256, where a 128-key S would not fit in the consumers' 232 registers.
 *  - between the warpgroups, named barriers order the issues WG1 slot 0, WG2 slot 0, WG1
 *    slot 1, ...: each warpgroup waits on its own barrier before issuing and arrives on the
 *    other's right after, so one warpgroup's softmax runs under the other's GEMMs. Both
 *    run every slot (with nothing to issue for tiles they do not see), so the barrier
 *    phases pair up and end complete, every work tile.
 *
 * Block mode (the state-carrying call, p.block_mode): the consumers load m, l and acc of
 * their rows from the state at each work tile's start (m to log2 units, l whole on the
 * quad's first lane, acc into the O fragment: the mma.sync kernel's conventions), the
 * first S slot rescales O like every later one, and the epilogue writes the three back
 * instead of O and LSE (no O map, no TMA store; sinks are left to finalize). Rows that
 * see nothing of the block keep their state (alpha = 1, P = 0).
 *
 * The one-shot epilogue: each consumer writes its normalised O rows (packed) into its own
 * 64 rows of the Q tile's first Dv / 64 column blocks (all four at 256; at (192, 128) the
 * third keeps Q: it is reloaded whole), swizzled as TMA loaded them, and one of its threads stores them with TMA
 * (Dv / 64 boxes of 64 x 64, one bulk group, rows past sq clipped by TMA); O views TMA cannot
 * describe are stored directly, row by row. Then each consumer arrives on "empty_q". The
 * ring's stages and phases run on across work tiles, and the producer loads the next
 * tile's K_0 before its Q, so K_0 is in flight while the consumers finish the last tile.
 *
 * Key tiles are placed so that the last one ends at the CTA's last visible key (the first
 * may start before key 0: TMA reads zeros there), which keeps the causal diagonal in the
 * last tile. What this kernel does not do goes to the mma.sync forward (dispatch.c):
 * varlen, block masks, other head dims, and views TMA cannot describe. */
#include "common.cuh"
#include "device_sm90.cuh"
#include "tmap_sm90.cuh"

#if !((DQK == 64 && DV == 64) || (DQK == 128 && DV == 128) || (DQK == 192 && DV == 128) || \
      (DQK == 256 && DV == 256))
#error "the sm90 forward is written for head dims (64, 64), (128, 128), (192, 128) and (256, 256)"
#endif

#define H_BM 128 /* query rows per CTA: two consumer warpgroups of 64 */
/* keys per tile: 128; 176 at (128, 128) not causal, FlashAttention-3's choice there (more
 * work per slot for the same softmax bookkeeping and barriers: S 88 + P 44 + O 64 floats a
 * thread; causal keeps 128, whose diagonal tiles waste less); and 64 at (256, 256), where O
 * alone is 128 floats a thread: S of 128 keys (64 floats + 32 packed P) would not fit
 * beside it in 232 registers, S of 64 keys (32 + 16) does (traits.h FA_SM90_FWD_BN, which
 * the stats' tile counts use, says the same) */
#if DQK == 256
#define H_BN 64
#elif DQK == 128 && !FA_CAUSAL
#define H_BN 176
#else
#define H_BN 128
#endif
#if H_BN != FA_SM90_FWD_BN(DQK, DV, FA_CAUSAL)
#error "H_BN and traits.h FA_SM90_FWD_BN disagree"
#endif
#define H_SN (H_BN / 2) /* S floats a thread: the m64n(H_BN) D fragment */
#define H_PN (H_BN / 4) /* P registers a thread, packed pairs: H_BN / 16 A fragments of 4 */
/* K/V ring stages: what keeps TMA ahead of the consumers is the consumer work the ring
 * holds, and a head-dim-64 tile is half the GEMM work of a head-dim-128 one, so 64 gets
 * twice the stages (the same time in flight). 6 stages of 32 KB: 209 KB, room left for a
 * 16 KB O buffer of its own (the next step, README); 3 of 64 KB at 128: 225 KB; at
 * (192, 128) a stage is 80 KB (K 48, V 32) and Q 48 KB: 2 stages, 209 KB (3 would be 289);
 * at (256, 256) a stage of 64 keys is 64 KB (K 32, V 32) and Q 64 KB: 2 stages, 193 KB (3
 * would be 257). */
#define H_STAGES (DQK == 64 ? 6 : DQK == 128 && H_BN == 128 ? 3 : 2) /* 176 keys: 2, 209 KB */
#define H_THREADS 384
#define H_CB FA_TMAP_CB /* elements in a 128-byte swizzled column block (a TMA box row) */
#define H_NCB_QK (DQK / H_CB) /* column blocks of a Q or K row: 1, 2 or 3 */
#define H_NCB_V (DV / H_CB)   /* of a V or O row: 1 or 2 */
#define H_ON (DV / 2)      /* O fragment floats a thread: the m64n(DV) D fragment */
#define H_QBYTES (H_BM * DQK * 2)
#define H_KBYTES (H_BN * DQK * 2)
#define H_VBYTES (H_BN * DV * 2)
#define H_NBAR (2 + 5 * H_STAGES)
/* tiles, then the mbarriers; + 1024 to align the tiles to the swizzle pattern */
#define H_SMEM_BYTES (1024 + H_QBYTES + H_STAGES * (H_KBYTES + H_VBYTES) + 8 * H_NBAR)
#if H_SMEM_BYTES > 227 * 1024
#error "the sm90 forward's shared memory exceeds the 227 KB a block may have"
#endif
#define H_PRODUCER_REGS 40
#define H_CONSUMER_REGS 232 /* 128 x 40 + 256 x 232 = 64512 of the SM's 65536 */
#define H_BAR_ORDER 1       /* named barriers 1, 2: the issue turn of consumer 1, 2 */
#define H_BAR_O 3           /* named barriers 3, 4: consumer 1's, 2's O tile is in shared memory */

/* h_wgmma_qk: S = Q K^T, m64n(H_BN)k16; h_wgmma_pv: O += P V, m64n(DV)k16 */
#if FA_BF16
#define h_wgmma_qk_176 fa_wgmma_ss176_bf16
#define h_wgmma_qk_128 fa_wgmma_ss_bf16
#define h_wgmma_qk_64 fa_wgmma_ss64_bf16
#define h_wgmma_pv_256 fa_wgmma_rs256_t_bf16
#define h_wgmma_pv_128 fa_wgmma_rs_t_bf16
#define h_wgmma_pv_64 fa_wgmma_rs64_t_bf16
#else
#define h_wgmma_qk_176 fa_wgmma_ss176_f16
#define h_wgmma_qk_128 fa_wgmma_ss_f16
#define h_wgmma_qk_64 fa_wgmma_ss64_f16
#define h_wgmma_pv_256 fa_wgmma_rs256_t_f16
#define h_wgmma_pv_128 fa_wgmma_rs_t_f16
#define h_wgmma_pv_64 fa_wgmma_rs64_t_f16
#endif
#define h_wgmma_qk FA_PASTE(h_wgmma_qk_, H_BN)
#define h_wgmma_pv FA_PASTE(h_wgmma_pv_, DV)

#ifndef FA_SM90_MAPS_DEFINED
#define FA_SM90_MAPS_DEFINED
/* TMA descriptors of Q [B,sq,Hq,Dqk], K [B,skv,Hkv,Dqk], V [B,skv,Hkv,Dv] (4-d maps (d, s,
 * h, b), boxes of 64 columns x 128 rows, 128-byte swizzle) and O [B,sq,Hq,Dv] (boxes of 64 x
 * 64 rows: one consumer's) when o_tma, else O is stored directly. */
struct fa_sm90_maps {
  fa_tmap q, k, v, o;
  int o_tma;
};

#if FA_SM90_DEVICE /* the schedule's pieces: device code of the sm_90a pass (or the emulator) */

/* A work tile of the persistent grid: 128 query rows (from R0, rows of them below sq) of
 * one (batch, head), its key tiles j = 0 .. ntiles - 1 at keys kbase + j H_BN + [0, H_BN),
 * the last ending at the CTA's last visible key, the visible keys from kc0. Work tiles
 * are numbered by query tile, then (batch, head); causal, the last query tiles, which
 * see the most keys, come first. */
struct h_tile {
  int b, h, hk, R0, rows, kc0, ntiles, kbase;
};

FA_DEV h_tile h_tile_at(const fa_params &p, const fa_seg &s, int w) {
  h_tile T;
  const int nhb = (int)(p.Hq * p.B), rank = w / nhb, hb = w - rank * nhb;
  T.h = hb % (int)p.Hq;
  T.b = hb / (int)p.Hq;
  T.hk = T.h / (int)p.group;
  T.R0 = (FA_CAUSAL ? (int)p.ntiles - 1 - rank : rank) * H_BM;
  T.rows = fa_min(H_BM, (int)p.sq - T.R0);
  int lo_first, hi_first, lo_last, hi_last;
  fa_row_keys(p, FA_CAUSAL, s, T.R0, lo_first, hi_first);
  fa_row_keys(p, FA_CAUSAL, s, T.R0 + T.rows - 1, lo_last, hi_last);
  T.kc0 = fa_max(lo_first, 0);
  const int kc1 = fa_min(hi_last + 1, (int)p.skv);
  T.ntiles = T.kc0 < kc1 ? (kc1 - T.kc0 + H_BN - 1) / H_BN : 0;
  T.kbase = kc1 - T.ntiles * H_BN;
  return T;
}

/* Does a consumer warpgroup see anything of the key tile starting at k0 (the CTA's
 * visible keys start at kc0)? Its valid rows, the first row's lowest key, the last row's
 * highest. Along the tiles it goes false.., true.., false..: each row's keys are an interval,
 * and both ends move up with the row. */
FA_DEV int h_tile_seen(int k0, int kc0, int wg_rows, int wlo_first, int whi_last) {
  return wg_rows > 0 && whi_last >= fa_max(k0, kc0) && wlo_first <= k0 + H_BN - 1;
}

/* Does every row of a consumer warpgroup (all 64 valid) see every key of the tile starting
 * at k0 (the CTA's visible keys start at kc0; the last row's lowest key, the first row's
 * highest)? */
FA_DEV int h_tile_full(int k0, int kc0, int wg_rows, int wlo_last, int whi_first) {
  return wg_rows == 64 && k0 >= kc0 && wlo_last <= k0 && whi_first >= k0 + H_BN - 1;
}

/* The key ranges and query positions of a thread's two rows (i = 0, 1: g, g + 8): below
 * head dim 256 computed once a work tile and kept in registers across the slots (lo_r,
 * hi_r, ipos); at 256, where O's 128 registers leave too few, only the thread's row g
 * (qrow) and the valid rows from it (vrows) are kept, the ranges are recomputed at each
 * masked tile, the fully visible tiles are found once as a range [jf, jg), and the call's
 * segment is read from the parameters (fa_whole_seg; the launcher declines varlen), so
 * that ptxas can reread it from the constant bank: traits.h FA_SM90_FWD_ROWS_IN_REGS, as the mma.sync
 * forward's FA_FWD_Q_IN_REGS. (With only some of these changes ptxas still spilled at 256;
 * at 128 and 192 x 128 they make it spill instead, so those keep their code, SASS
 * unchanged.) H_ROW_ARGS: the consumer's arguments of h_softmax, either way. */
#define H_ROWS_IN_REGS (FA_SM90_FWD_ROWS_IN_REGS(DQK) && H_BN <= 128) /* 176: as at 256 */
#if H_ROWS_IN_REGS
#define H_ROW_PARAMS const int ipos[2], const int lo_r[2], const int hi_r[2]
#define H_ROW_ARGS ipos, lo_r, hi_r
#else
#define H_ROW_PARAMS const fa_seg &s, int qrow, int vrows
#define H_ROW_ARGS s, qrow, vrows
#endif

/* Slot j's start (module comment): K_j has landed (j < ntiles), V_{j-1} has landed and
 * been zero-filled (j > 0), tile j in ring position it + j; then this consumer's turn to
 * issue. */
FA_DEV void h_slot_begin(uint64_t *full_k, uint64_t *v_ok, int it, int j, int ntiles, int cw) {
  if (j < ntiles) fa_mbar_wait(&full_k[(it + j) % H_STAGES], ((it + j) / H_STAGES) & 1);
  if (j > 0) fa_mbar_wait(&v_ok[(it + j - 1) % H_STAGES], ((it + j - 1) / H_STAGES) & 1);
  if (cw == 0) fa_named_bar_sync(H_BAR_ORDER, 256); /* constant ids: ptxas counts barriers */
  else fa_named_bar_sync(H_BAR_ORDER + 1, 256);
}

/* After slot j's issues: the other consumer's turn. Consumer 1's first turn comes from
 * consumer 2's arrival before slot 0 (not its own: a warp that bar.arrive'd may not run
 * another barrier instruction on that barrier before it resets, PTX ISA barrier.cta), so
 * consumer 2's arrival after the last slot would open a phase that nobody completes: it
 * is left out. */
FA_DEV void h_slot_issued(int j, int nslots, int cw) {
  if (cw == 0) fa_named_bar_arrive(H_BAR_ORDER + 1, 256);
  else if (j + 1 < nslots) fa_named_bar_arrive(H_BAR_ORDER, 256);
}

/* A stage's K or V read by this warp's GEMMs, which have completed: one arrival a warp. */
FA_DEV void h_release(uint64_t *empty, int lane) {
  fa_syncwarp();
  if (lane == 0) fa_mbar_arrive(empty);
}

/* Keys outside the thread's rows' ranges -> -inf (by select). */
#if H_ROWS_IN_REGS
FA_DEV void h_mask_rows(float S[H_SN], const int lo_r[2], const int hi_r[2], int k0, int tg) {
#else
FA_DEV void h_mask_rows(float S[H_SN], const fa_params &p, const fa_seg &s, int qrow, int vrows,
                        int k0, int tg) {
  int lo_r[2], hi_r[2];
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    lo_r[i] = (int)p.skv;
    hi_r[i] = -1;
    if (8 * i < vrows) fa_row_keys(p, FA_CAUSAL, s, qrow + 8 * i, lo_r[i], hi_r[i]);
  }
#endif
  FA_UNROLL
  for (int x = 0; x < H_SN; x++) {
    const int i = (x >> 1) & 1, key = k0 + (x >> 2) * 8 + 2 * tg + (x & 1);
    S[x] = key >= lo_r[i] && key <= hi_r[i] ? S[x] : -INFINITY;
  }
}
#if H_ROWS_IN_REGS
#define H_MASK(S, k0, tg) h_mask_rows(S, lo_r, hi_r, k0, tg)
#define H_IPOS(i) ipos[i]
#else
#define H_MASK(S, k0, tg) h_mask_rows(S, p, s, qrow, vrows, k0, tg)
#define H_IPOS(i) (qrow + s.qpos_row0 + s.off - s.kpos_col0 + 8 * (i))
#endif

/* The online softmax of S_j, a thread's two rows (i = 0, 1: g and g + 8) of the
 * warpgroup's 64 x H_BN tile at keys k0 + [0, H_BN), in place: masked by select unless every
 * pair is visible (full), P = 2^(score - mu) in S, row sums into l, alpha = the factor that
 * rescales O (module comment). Without softcap and ALiBi the score is S * sc with sc > 0
 * (dispatch.c checks scale > 0), so the row max is taken on S and the scale goes into the
 * FMA before the exp2; the general transform (fa_score_tile) only runs with softcap or ALiBi.
 * The uniform choices sit outside the element loops, and each way ends in its own exp
 * loop: ptxas hoists the wgmma wait that follows this to the top of its basic block, which
 * must not hold the exp loop (the P V GEMM's overlap). */
FA_DEV void h_softmax(float S[H_SN], const fa_params &p, float alibi2, H_ROW_PARAMS, int k0,
                      int tg, int full,
                      float (&m)[2], float (&l)[2], float (&alpha)[2]) {
  if (!(p.cap2 > 0.0f) && alibi2 == 0.0f) {
    if (!full) H_MASK(S, k0, tg);
    fa_exp_rows<H_SN, 2>(S, p.sc, m, l, alpha);
  } else {
    const int base[2] = {H_IPOS(0) - k0, H_IPOS(1) - k0};
    const float slope[2] = {alibi2, alibi2};
    fa_score_tile<H_SN>(p, S, slope, base, tg);
    if (!full) H_MASK(S, k0, tg);
    fa_exp_rows<H_SN, 2>(S, 1.0f, m, l, alpha);
  }
}

#endif /* FA_SM90_DEVICE */
#endif

/* S = Q K^T as one wgmma group: 16 columns of Dqk a step, column block kk/4, 32 bytes into
 * the row; 8-row groups 1024 bytes apart (SBO); LBO is unused by K-major swizzled layouts. */
#define H_ISSUE_QK(S, q_addr, k_addr)                                                        \
  do {                                                                                       \
    FA_UNROLL                                                                                \
    for (int kk_ = 0; kk_ < DQK / 16; kk_++) {                                               \
      const uint32_t in_row_ = (uint32_t)(kk_ % 4) * 32, blk_ = (uint32_t)(kk_ / 4) * 128;   \
      h_wgmma_qk(S, fa_wgmma_desc((q_addr) + blk_ * H_BM + in_row_, 16, 1024),               \
                 fa_wgmma_desc((k_addr) + blk_ * H_BN + in_row_, 16, 1024), kk_ > 0);        \
    }                                                                                        \
    fa_wgmma_commit();                                                                       \
  } while (0)

/* O += P V as one wgmma group: P's D fragment is the A fragment of 16 keys; V is MN-major
 * (d contiguous): d blocks of 64 H_BN * 128 bytes apart (LBO; one block at head dim 64),
 * 8-key groups 1024 (SBO). */
#define H_ISSUE_PV(acc, P, v_addr)                                                           \
  do {                                                                                       \
    FA_UNROLL                                                                                \
    for (int kc_ = 0; kc_ < H_BN / 16; kc_++)                                                \
      h_wgmma_pv(acc, (P) + 4 * kc_,                                                         \
                 fa_wgmma_desc((v_addr) + (uint32_t)kc_ * 16 * 128, H_BN * 128, 1024));      \
    fa_wgmma_commit();                                                                       \
  } while (0)

/* P_j packed for the next slot's P V (S holds P_j in float32). */
#define H_PACK_P(P, S)                                          \
  do {                                                          \
    FA_UNROLL                                                   \
    for (int x_ = 0; x_ < H_PN; x_++) P[x_] = fa_pack(S[2 * x_], S[2 * x_ + 1]); \
  } while (0)

#if FA_SM90_DEVICE /* the head-dim-dependent pieces */
/* Before a slot's wgmma.fence: the last writes of the registers the GEMMs accumulate into
 * (O, S) or read (P) stay before it. */
FA_DEV void h_fence_operands(float acc[H_ON], float S[H_SN], uint32_t P[H_PN]) {
  FA_UNROLL
  for (int x = 0; x < H_ON; x++) fa_reg_fence(acc[x]);
  FA_UNROLL
  for (int x = 0; x < H_SN; x++) fa_reg_fence(S[x]);
  FA_UNROLL
  for (int x = 0; x < H_PN; x++) fa_reg_fence_u32(P[x]);
  fa_wgmma_fence();
}

/* O_j = alpha_j (O_{j-1} + P_{j-1} V_{j-1}), once the P V GEMM has completed. */
FA_DEV void h_rescale(float acc[H_ON], const float (&alpha)[2]) {
  FA_UNROLL
  for (int x = 0; x < H_ON; x++) acc[x] *= alpha[(x >> 1) & 1];
}

#endif

FA_KERNEL(H_THREADS) FA_FN(flash_fwd_)(const fa_params p, const FA_GRID_CONST fa_sm90_maps maps) {
#if FA_SM90_DEVICE
  FA_SMEM(smem_raw);
  unsigned char *smem = smem_raw + ((1024 - (fa_smem_addr(smem_raw) & 1023)) & 1023);
  fa_elem *sQ = (fa_elem *)smem;            /* [H_NCB_QK column blocks][H_BM][64], swizzled */
  fa_elem *sK = sQ + H_BM * DQK;            /* [H_STAGES][H_NCB_QK][H_BN][64] */
  fa_elem *sV = sK + H_STAGES * H_BN * DQK; /* [H_STAGES][H_NCB_V][H_BN][64] */
  uint64_t *bar_q = (uint64_t *)(sV + H_STAGES * H_BN * DV), *empty_q = bar_q + 1;
  uint64_t *full_k = empty_q + 1, *full_v = full_k + H_STAGES, *v_ok = full_v + H_STAGES,
           *empty_k = v_ok + H_STAGES, *empty_v = empty_k + H_STAGES;
  const int tid = (int)threadIdx.x, wg = fa_warp_uniform(tid / 128), warp = tid / 32, lane = tid % 32;
#if H_ROWS_IN_REGS
  const fa_seg s = fa_make_seg(p, 0);
#else
  const fa_seg s = fa_whole_seg(p);
#endif
  const int nwork = (int)(p.ntiles * p.Hq * p.B);

  if (tid == 0) {
    fa_mbar_init(bar_q, 1);
    fa_mbar_init(empty_q, 2); /* one arrival per consumer warpgroup */
    for (int i = 0; i < H_STAGES; i++) {
      fa_mbar_init(&full_k[i], 1);
      fa_mbar_init(&full_v[i], 1);
      fa_mbar_init(&v_ok[i], 1);
      fa_mbar_init(&empty_k[i], 8); /* one arrival per consumer warp */
      fa_mbar_init(&empty_v[i], 8);
    }
    fa_mbar_init_fence();
  }
  FA_SYNC();

  /* The CTA's work tiles w = blockIdx.x, + gridDim.x, ...; `it` counts the key tiles the
   * CTA has put through the ring before w (stage (it + j) % H_STAGES), nw the work tiles
   * before w (the Q tile's phase). */
  if (wg == 0) { /* ---- producer warpgroup ---------------------------------------------- */
    fa_setmaxnreg_dec<H_PRODUCER_REGS>();
    if (warp > 1 || (warp == 0 && lane > 0)) return; /* the loader thread, the zero-fill warp */
    if (warp == 0) {
      fa_tmap_prefetch(&maps.q);
      fa_tmap_prefetch(&maps.k);
      fa_tmap_prefetch(&maps.v);
      if (maps.o_tma) fa_tmap_prefetch(&maps.o);
    }
    for (int w = (int)blockIdx.x, it = 0, nw = 0; w < nwork; w += (int)gridDim.x, nw++) {
      const h_tile T = h_tile_at(p, s, w);
      if (warp == 0) {
        /* K_0, Q, K_1, V_0, K_2, V_1, ...: the first use of a stage passes its empty wait at
         * once. K_0 goes before Q: its stage was released during the last tile's slots, so
         * it loads while the consumers still finish that tile (Q shares its buffer with
         * their O stores and waits for both on empty_q). */
        for (int j = 0; j <= T.ntiles; j++) {
          if (j < T.ntiles) {
            const int st = (it + j) % H_STAGES, ph = ((it + j) / H_STAGES) & 1;
            fa_elem *k = sK + st * H_BN * DQK;
            fa_mbar_wait(&empty_k[st], ph ^ 1);
            fa_mbar_arrive_expect_tx(&full_k[st], H_KBYTES);
            for (int cb = 0; cb < H_NCB_QK; cb++)
              fa_tma_load_4d(k + cb * H_BN * H_CB, &maps.k, cb * H_CB, T.kbase + j * H_BN, T.hk,
                             T.b, &full_k[st]);
          }
          if (j == 0) { /* Q once both consumers are done with the last one (O stores included) */
            fa_mbar_wait(empty_q, (nw & 1) ^ 1);
            fa_mbar_arrive_expect_tx(bar_q, H_QBYTES);
            for (int cb = 0; cb < H_NCB_QK; cb++)
              fa_tma_load_4d(sQ + cb * H_BM * H_CB, &maps.q, cb * H_CB, T.R0, T.h, T.b, bar_q);
          }
          if (j > 0) {
            const int st = (it + j - 1) % H_STAGES, ph = ((it + j - 1) / H_STAGES) & 1;
            fa_elem *v = sV + st * H_BN * DV;
            fa_mbar_wait(&empty_v[st], ph ^ 1);
            fa_mbar_arrive_expect_tx(&full_v[st], H_VBYTES);
            for (int cb = 0; cb < H_NCB_V; cb++)
              fa_tma_load_4d(v + cb * H_BN * H_CB, &maps.v, cb * H_CB, T.kbase + (j - 1) * H_BN,
                             T.hk, T.b, &full_v[st]);
          }
        }
      } else {
        /* V rows of keys in [0, skv) that no row of the CTA sees -> 0 (outside, TMA read 0) */
        for (int j = 0; j < T.ntiles; j++) {
          const int st = (it + j) % H_STAGES, ph = ((it + j) / H_STAGES) & 1, k0 = T.kbase + j * H_BN;
          fa_elem *v = sV + st * H_BN * DV;
          fa_mbar_wait(&full_v[st], ph);
          for (int r = lane; r < H_BN; r += 32) {
            const int key = k0 + r;
            if (key < 0 || key >= (int)p.skv) continue;
            if (key >= T.kc0 && fa_key_seen(p, FA_CAUSAL, s, key, T.R0, T.R0 + T.rows - 1)) continue;
            for (int cb = 0; cb < H_NCB_V; cb++) fa_zero_row128(v + cb * H_BN * H_CB + r * H_CB);
          }
          fa_fence_proxy_async(); /* these stores are read by wgmma (the async proxy) */
          fa_syncwarp();
          if (lane == 0) fa_mbar_arrive(&v_ok[st]);
        }
      }
      it += T.ntiles;
    }
    return;
  }

  /* ---- consumer warpgroups ------------------------------------------------------------ */
  fa_setmaxnreg_inc<H_CONSUMER_REGS>();
  const int cw = wg - 1, g = lane / 4, tg = lane % 4;
  const int wr0 = 64 * cw + 16 * (warp % 4); /* this warp's first row in the CTA */
  const uint32_t q_addr = fa_smem_addr(sQ + 64 * cw * H_CB);
  for (int w = (int)blockIdx.x, it = 0, nw = 0; w < nwork; w += (int)gridDim.x, nw++) {
    const h_tile T = h_tile_at(p, s, w);
    const int b = T.b, h = T.h, R0 = T.R0, rows = T.rows, kc0 = T.kc0, ntiles = T.ntiles,
              kbase = T.kbase;
    const int wg_rows = fa_min(fa_max(rows - 64 * cw, 0), 64);
    int wlo_first = 0, whi_first = -1, wlo_last = 0, whi_last = -1;
    if (wg_rows > 0) {
      fa_row_keys(p, FA_CAUSAL, s, R0 + 64 * cw, wlo_first, whi_first);
      fa_row_keys(p, FA_CAUSAL, s, R0 + 64 * cw + wg_rows - 1, wlo_last, whi_last);
    }
#if H_ROWS_IN_REGS
    int lo_r[2], hi_r[2], ipos[2];
    FA_UNROLL
    for (int i = 0; i < 2; i++) {
      const int r = wr0 + g + 8 * i;
      lo_r[i] = (int)p.skv;
      hi_r[i] = -1;
      if (r < rows) fa_row_keys(p, FA_CAUSAL, s, R0 + r, lo_r[i], hi_r[i]);
      ipos[i] = R0 + r + s.qpos_row0 + s.off - s.kpos_col0;
    }
#else
    const int qrow = R0 + wr0 + g, vrows = rows - wr0 - g;
#endif
    const float alibi2 = p.alibi ? p.alibi[h] * FA_LOG2E : 0.0f;

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
    float acc[H_ON]; /* O: the m64n(DV) D fragment, acc[4n + e] ~ the mma.sync kernel's acc[n][e] */
    float S[H_SN];   /* S_j, then P_j in float32 */
    uint32_t P[H_PN]; /* P_j packed: the A fragments of 16 keys each, read by the next slot's PV */
    FA_UNROLL
    for (int x = 0; x < H_SN; x++) S[x] = 0.0f;
    FA_UNROLL
    for (int x = 0; x < H_ON; x++) acc[x] = 0.0f;
    FA_UNROLL
    for (int x = 0; x < H_PN; x++) P[x] = 0;
    if (p.block_mode) {
      FA_UNROLL
      for (int i = 0; i < 2; i++)
        if (wr0 + g + 8 * i < rows)
          fa_state_load(p, (b * p.Hq + h) * p.st_rows + p.q_row0 + R0 + wr0 + g + 8 * i, i, tg,
                       acc, m, l);
    }
    fa_mbar_wait(bar_q, nw & 1);

    /* this warpgroup's tiles [ja, jb): slot j issues S_j for j in [ja, jb), P_{j-1} V_{j-1}
     * for j in (ja, jb]. Each kind of slot has its own code with unconditional issues and
     * waits that retire everything: ptxas serialises the wgmma pipeline when an issue is
     * conditional inside it. */
    int ja = 0;
    while (ja < ntiles && !h_tile_seen(kbase + ja * H_BN, kc0, wg_rows, wlo_first, whi_last)) ja++;
    int jb = ja;
    while (jb < ntiles && h_tile_seen(kbase + jb * H_BN, kc0, wg_rows, wlo_first, whi_last)) jb++;
#if !H_ROWS_IN_REGS
    /* the tiles [jf, jg) with every pair visible (an interval) */
    int jf = 0;
    while (jf < ntiles && !h_tile_full(kbase + jf * H_BN, kc0, wg_rows, wlo_last, whi_first)) jf++;
    int jg = jf;
    while (jg < ntiles && h_tile_full(kbase + jg * H_BN, kc0, wg_rows, wlo_last, whi_first)) jg++;
#endif
    const int nslots = ntiles ? ntiles + 1 : 0;
    if (cw == 1 && nslots) fa_named_bar_arrive(H_BAR_ORDER, 256); /* opens consumer 1's first turn */
    for (int j = 0; j < nslots; j++) {
      const int st = (it + j) % H_STAGES, pst = (it + j + H_STAGES - 1) % H_STAGES;
      const int k0 = kbase + j * H_BN;
      const uint32_t k_addr = fa_smem_addr(sK + st * H_BN * DQK);
      const uint32_t v_addr = fa_smem_addr(sV + pst * H_BN * DV); /* tile j - 1 */
      /* every pair of the tile visible: no masking (warpgroup-uniform, as ja, jb) */
#if H_ROWS_IN_REGS
      const int full = wg_rows == 64 && k0 >= kc0 && wlo_last <= k0 && whi_first >= k0 + H_BN - 1;
#else
      const int full = j >= jf && j < jg;
#endif
      h_slot_begin(full_k, v_ok, it, j, ntiles, cw);
      if (j > ja && j < jb) { /* S_j and P_{j-1} V_{j-1}: the softmax runs under the second */
        h_fence_operands(acc, S, P);
        H_ISSUE_QK(S, q_addr, k_addr);
        H_ISSUE_PV(acc, P, v_addr);
        h_slot_issued(j, nslots, cw);
        fa_wgmma_wait<1>();
        FA_UNROLL
        for (int x = 0; x < H_SN; x++) fa_reg_fence(S[x]);
        h_release(&empty_k[st], lane);
        h_softmax(S, p, alibi2, H_ROW_ARGS, k0, tg, full, m, l, alpha);
        fa_wgmma_wait<0>();
        FA_UNROLL
        for (int x = 0; x < H_ON; x++) fa_reg_fence(acc[x]);
        h_release(&empty_v[pst], lane);
        h_rescale(acc, alpha);
        H_PACK_P(P, S);
      } else if (j == ja && j < jb) { /* the first S (O is 0, or the carried state's) */
        h_fence_operands(acc, S, P);
        H_ISSUE_QK(S, q_addr, k_addr);
        h_slot_issued(j, nslots, cw);
        fa_wgmma_wait<0>();
        FA_UNROLL
        for (int x = 0; x < H_SN; x++) fa_reg_fence(S[x]);
        h_release(&empty_k[st], lane);
        if (j > 0) h_release(&empty_v[pst], lane);
        h_softmax(S, p, alibi2, H_ROW_ARGS, k0, tg, full, m, l, alpha);
        h_rescale(acc, alpha); /* the carried O in block mode (alpha is 0 for O = 0) */
        H_PACK_P(P, S);
      } else if (j == jb && j > ja) { /* the last P V */
        h_fence_operands(acc, S, P);
        H_ISSUE_PV(acc, P, v_addr);
        h_slot_issued(j, nslots, cw);
        if (j < ntiles) h_release(&empty_k[st], lane);
        fa_wgmma_wait<0>();
        FA_UNROLL
        for (int x = 0; x < H_ON; x++) fa_reg_fence(acc[x]);
        h_release(&empty_v[pst], lane);
      } else { /* nothing of tiles j, j - 1 for this warpgroup: keep the turns and the ring */
        h_slot_issued(j, nslots, cw);
        if (j < ntiles) h_release(&empty_k[st], lane);
        if (j > 0) h_release(&empty_v[pst], lane);
      }
    }

    FA_UNROLL
    for (int i = 0; i < 2; i++) {
      l[i] += fa_shfl_xor(l[i], 1);
      l[i] += fa_shfl_xor(l[i], 2);
    }
    /* O: with o_tma into this warpgroup's 64 rows of the Q tile (its last reader, this
     * warpgroup's S GEMM, has completed), swizzled as TMA loaded Q, then one TMA store of
     * H_NCB_V boxes of 64 x 64, rows past sq clipped by TMA; else directly, row by row. Q's
     * column blocks H_NCB_V.. are left as they are (the next Q load rewrites all of them). */
    unsigned char *sO = (unsigned char *)sQ; /* [H_NCB_V column blocks][H_BM][128 bytes], swizzled */
    FA_UNROLL
    for (int i = 0; i < 2; i++) {
      const int r = wr0 + g + 8 * i;
      if (r >= rows) continue;
      if (p.block_mode) { /* the state back instead of O and LSE (sinks: at finalize) */
        fa_state_store(p, (b * p.Hq + h) * p.st_rows + p.q_row0 + R0 + r, i, tg, acc, m, l);
        continue;
      }
      const float sink2 = p.sinks ? p.sinks[h] * FA_LOG2E : -INFINITY;
      float inv, lse2;
      fa_row_finish(m[i], l[i], sink2, &inv, &lse2);
      if (maps.o_tma) {
        /* columns 8n + 2tg, + 1: column block n / 8, 16-byte chunk (n % 8) ^ (r % 8) of row
         * r, and r % 8 = g */
        const uint32_t row = (uint32_t)(r * 128 + 4 * tg) ^ ((uint32_t)g << 4);
        FA_UNROLL
        for (int n = 0; n < DV / 8; n++)
          *(uint32_t *)(sO + (n / 8) * H_BM * 128 + (row ^ ((uint32_t)(n % 8) << 4))) =
              fa_pack(acc[4 * n + 2 * i] * inv, acc[4 * n + 2 * i + 1] * inv);
      } else {
        fa_elem *o = (fa_elem *)p.o.p + b * p.o.sb + (R0 + r) * p.o.ss + h * p.o.sh;
        FA_UNROLL
        for (int n = 0; n < DV / 8; n++)
          *(uint32_t *)(o + n * 8 + 2 * tg) =
              fa_pack(acc[4 * n + 2 * i] * inv, acc[4 * n + 2 * i + 1] * inv);
      }
      if (tg == 0 && p.lse) p.lse[(b * p.Hq + h) * p.lse_rows + p.q_row0 + R0 + r] = lse2 / FA_LOG2E;
    }
    /* then the warpgroup is done with its rows of the Q tile: the producer may load the
     * next one once both warpgroups have arrived on empty_q */
    const int store = maps.o_tma && wg_rows > 0;
    if (store) fa_fence_proxy_async(); /* the stores above are read by TMA (the async proxy) */
    if (cw == 0) fa_named_bar_sync(H_BAR_O, 128);
    else fa_named_bar_sync(H_BAR_O + 1, 128);
    if (tid % 128 == 0) {
      if (store) {
        for (int cb = 0; cb < H_NCB_V; cb++)
          fa_tma_store_4d(&maps.o, sQ + (cb * H_BM + 64 * cw) * H_CB, cb * H_CB, R0 + 64 * cw, h,
                          b);
        fa_bulk_commit();
        fa_bulk_wait_read<0>(); /* shared memory stays until TMA has read it */
      }
      fa_mbar_arrive(empty_q);
    }
    it += ntiles;
  }
#endif
}

extern "C" int FA_FN(attn_cuda__fwd_)(const fa_call *c) {
  const attn_cuda_problem *pb = c->pb;
  if (pb->num_seqs || pb->block_mask) return FA_ERR_FALLBACK;
  static int have_image = -1; /* this build's fatbin has sm_90a code for the device */
  if (!fa_sm90_has_image(&have_image, (const void *)FA_FN(flash_fwd_))) return FA_ERR_FALLBACK;
  fa_params p = fa_fwd_params(c); /* block mode: the state (c->st) instead of O and LSE */
  fa_sm90_maps maps;
  memset(&maps, 0, sizeof maps);
  if (fa_sm90_tmap(&maps.q, pb->q, DQK, pb->sq, pb->Hq, pb->B, H_BM, FA_BF16) ||
      fa_sm90_tmap(&maps.k, pb->k, DQK, pb->skv, pb->Hkv, pb->B, H_BN, FA_BF16) ||
      fa_sm90_tmap(&maps.v, pb->v, DV, pb->skv, pb->Hkv, pb->B, H_BN, FA_BF16))
    return FA_ERR_FALLBACK;
  maps.o_tma = !c->st && fa_sm90_tmap(&maps.o, c->o, DV, pb->sq, pb->Hq, pb->B, 64, FA_BF16) == 0;
  p.ntiles = (pb->sq + H_BM - 1) / H_BM; /* query tiles */
  const int64_t nwork = p.ntiles * pb->Hq * pb->B;
  if (nwork > INT32_MAX) return FA_ERR_FALLBACK;
  if (nwork == 0) return 0;
  /* the persistent grid: one CTA per SM (its shared memory allows no second), each walking
   * work tiles gridDim.x apart; the emulator has no SMs: 3 CTAs, so each walks several */
  int nsm = 3;
#ifndef ATTN_CUDA_EMULATE
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(FA_FN(flash_fwd_), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             H_SMEM_BYTES);
  if (e != cudaSuccess) return (int)e;
#endif
  const unsigned grid = (unsigned)(nwork < nsm ? nwork : nsm);
  FA_LAUNCH(FA_FN(flash_fwd_), dim3(grid), dim3(H_THREADS), H_SMEM_BYTES, c->stream, p, maps);
#ifndef ATTN_CUDA_EMULATE
  return (int)cudaGetLastError();
#else
  return 0;
#endif
}
