/* test_ring_split.c — split-KV attention (attn_split_kv_fwd / attn_split_kv_bwd) through
 * test_ring's harness: every rank holds all query rows, K/V are cut; results against
 * single-rank attn_fwd / attn_bwd, and O, LSE, dQ, dsinks bitwise the same on every rank.
 * Decode (one query row), a few rows (speculative decoding), a full causal prefill, every
 * mask flag, varlen batches of decodes, strided tensors; then random cases; then ranks
 * that disagree, failing together. */
#include "test_ring.h"

#include <stdio.h>
#include <stdlib.h>

/* A split-KV case: ring_base's defaults (B 1, Hq 4 / Hkv 2, D 32, seed 11) but for these. */
typedef struct {
  const char *name;
  attn_cp_layout layout;
  int64_t B, Sq, Skv; /* Skv 0: 2 cp (one key row per zigzag chunk) */
  int Hq, Hkv, Dv, causal;
  int64_t wl; /* 0: none */
  int sinks, alibi, bmask, bhsd, varlen, check_steps;
  float softcap;
} split_row;

static int part_split_cases(void) {
  static const int32_t lq[] = {1, 1, 0, 1, 3};       /* 6: four decodes, one idle, one 3-row */
  static const int32_t lkv[] = {100, 37, 9, 250, 130}; /* 526 */
  const attn_cp_layout CT = ATTN_LAYOUT_CONTIGUOUS, ZZ = ATTN_LAYOUT_ZIGZAG;
  const split_row rows[] = {
      {.name = "split decode Sq=1 Skv=517 contiguous, GQA 4/2", .layout = CT, .B = 1, .Sq = 1,
       .Skv = 517},
      {.name = "split decode causal zigzag, sinks, B=2", .layout = ZZ, .B = 2, .Sq = 1,
       .Skv = 517, .causal = 1, .sinks = 1},
      {.name = "split Sq=7 causal, alibi + softcap, Dv=48", .layout = CT, .B = 1, .Sq = 7,
       .Skv = 600, .Dv = 48, .causal = 1, .alibi = 1, .softcap = 5.0f},
      {.name = "split decode window 40: only the last rank computes", .layout = CT, .B = 1,
       .Sq = 1, .Skv = 640, .causal = 1, .wl = 40, .check_steps = 3},
      {.name = "split full causal prefill S=300, bhsd strides", .layout = ZZ, .B = 1, .Sq = 300,
       .Skv = 300, .causal = 1, .bhsd = 1},
      {.name = "split varlen batch of decodes, causal, sinks", .layout = CT, .B = 1, .Sq = 6,
       .Skv = 526, .causal = 1, .sinks = 1, .varlen = 1},
      {.name = "split block-sparse mask, Sq=64 Skv=576", .layout = ZZ, .B = 1, .Sq = 64,
       .Skv = 576, .causal = 1, .bmask = 1},
      {.name = "split MQA 8/1, B=3, Sq=2, Skv=2cp", .layout = ZZ, .B = 3, .Sq = 2, .Skv = 0,
       .Hq = 8, .Hkv = 1},
  };
  int ok = 1;
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    const split_row *r = &rows[i];
    rcase c = ring_base;
    c.split = 1;
    c.name = r->name;
    c.layout = r->layout;
    c.B = r->B;
    c.Sq = r->Sq;
    c.Skv = r->Skv ? r->Skv : 2 * g_size;
    c.Hq = r->Hq ? r->Hq : c.Hq;
    c.Hkv = r->Hkv ? r->Hkv : c.Hkv;
    c.Dv = r->Dv;
    c.causal = r->causal;
    c.wl = r->wl ? r->wl : -1;
    c.sinks = r->sinks;
    c.alibi = r->alibi;
    c.softcap = r->softcap;
    c.bmask = r->bmask;
    c.bhsd = r->bhsd;
    c.check_steps = r->check_steps;
    if (r->varlen) c.nseq = 5, c.lq = lq, c.lkv = lkv;
    ok &= run_case(&c);
  }
  return ok;
}

/* A rank whose q holds another number of rows than seq_q: every rank fails. */
static int part_split_errors(void) {
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = 2;
  s.num_heads_kv = 2;
  s.head_dim_qk = 16;
  const int64_t seq_q = 3, seq_kv = 64;
  attn_cp_shard ks;
  attn_cp_shard_rows(ATTN_LAYOUT_CONTIGUOUS, g_size, g_rank, seq_kv, &ks);
  const int64_t sq = seq_q + (g_size > 1 && g_rank == g_size - 1);
  float *buf = tu_falloc(3 * 2 * 16 * (sq + ks.rows));
  tu_fill(buf, 3 * 2 * 16 * (sq + ks.rows), -1, 1, 9);
  attn_tensor q = attn_tensor_f32(buf, 1, sq, 2, 16), o = attn_tensor_f32(buf + sq * 32, 1, sq, 2, 16);
  attn_tensor k = attn_tensor_f32(buf + 2 * sq * 32, 1, ks.rows, 2, 16);
  attn_tensor v = attn_tensor_f32(buf + 2 * sq * 32 + ks.rows * 32, 1, ks.rows, 2, 16);
  float *lse = tu_falloc(2 * sq);
  attn_status st = attn_split_kv_fwd(g_grp, &s, ATTN_LAYOUT_CONTIGUOUS, seq_q,
                                     seq_kv, &q, &k, &v, &o, lse);
  const attn_status want = g_size > 1 ? ATTN_ERR_MISMATCH : ATTN_OK;
  int64_t bad = st != want, total;
  if (bad)
    fprintf(stderr, "rank %d: split-kv with a rank of %lld query rows: %s (expected %s): %s\n",
            g_rank, (long long)sq, attn_status_string(st), attn_status_string(want),
            attn_last_error());
  MPI_Allreduce(&bad, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    printf("%-4s %-40s np=%d\n", total ? "FAIL" : "ok", "split: one rank with other Sq rows", g_size);
  free(buf);
  free(lse);
  return total == 0;
}

int part_split(void) { return part_split_cases() & part_split_errors(); }

/* Random split-KV cases from one seed (the same on every rank): few query rows or a
 * prefill, every mask flag, varlen batches with idle sequences. */
int part_split_random(void) {
  static int32_t lq[12], lkv[12];
  static char names[16][112];
  tu_rng rng = tu_rng_make(77);
  int ok = 1;
  for (int n = 0; n < 16; n++) {
    rcase c = ring_base;
    c.split = 1;
    c.seed = 3000 + (uint64_t)n;
    c.layout = (attn_cp_layout)tu_randint(&rng, 0, 1);
    c.causal = (int)tu_randint(&rng, 0, 1);
    c.Hkv = (int)tu_randint(&rng, 1, 2);
    c.Hq = c.Hkv * (int)tu_randint(&rng, 1, 4);
    c.Dqk = (int)tu_randint(&rng, 8, 72);
    c.Dv = (int)tu_randint(&rng, 0, 1) ? (int)tu_randint(&rng, 8, 72) : 0;
    c.Skv = tu_randint(&rng, 2 * g_size, 700);
    c.Sq = tu_randint(&rng, 0, 3) ? tu_randint(&rng, 1, 9) : tu_randint(&rng, 1, c.Skv);
    random_flags(&rng, &c, 200, 300);
    c.bhsd = tu_randint(&rng, 0, 3) == 0;
    if (tu_randint(&rng, 0, 2) == 0) { /* varlen: B = 1, lengths summing to Sq / Skv */
      c.nseq = (int)tu_randint(&rng, 1, 12);
      int64_t tq = 0, tk = 0;
      for (int i = 0; i < c.nseq; i++) {
        lq[i] = (int32_t)tu_randint(&rng, 0, 3);
        lkv[i] = (int32_t)tu_randint(&rng, 0, 120);
        tq += lq[i];
        tk += lkv[i];
      }
      if (tq < 1) lq[c.nseq - 1] += 1, tq += 1;
      if (tk < 2 * g_size) lkv[c.nseq - 1] += (int32_t)(2 * g_size), tk += 2 * g_size;
      c.Sq = tq;
      c.Skv = tk;
      c.lq = lq;
      c.lkv = lkv;
    } else {
      c.B = tu_randint(&rng, 1, 3);
      c.bmask = tu_randint(&rng, 0, 3) == 0;
    }
    c.name = case_name(names[n], sizeof names[n], "split random", n, &c);
    ok &= run_case(&c);
  }
  return ok;
}
