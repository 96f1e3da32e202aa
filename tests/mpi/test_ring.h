/* test_ring.h — what the parts of test_ring share (test_ring.c: the harness and the ring
 * parts; test_ring_split.c: the split-KV parts). */
#ifndef ATTN_TEST_RING_H
#define ATTN_TEST_RING_H

#include "attnrun.h"
#include "test_util.h"

#include <mpi.h>

extern int g_rank, g_size;
extern attn_group_t g_grp; /* tp = 1, cp = every rank */

typedef struct {
  const char *name;
  attn_cp_layout layout;
  int64_t B, Sq, Skv;
  int Hq, Hkv, Dqk, Dv;
  int causal;
  int64_t wl, wr;
  int sinks, alibi;
  float softcap;
  int nseq; /* varlen: lengths in lq / lkv (B = 1) */
  const int32_t *lq, *lkv;
  int bmask;    /* a block-sparse pattern (32 x 32 blocks) */
  int bhsd;     /* local tensors in [B, H, S, D] memory order */
  int check_steps; /* 1: contiguous causal, Sq == Skv; 2: also a window < chunk;
                   * 3 (split): only the last rank's keys are visible */
  int split;       /* attn_split_kv_fwd/bwd: every rank holds all query rows */
  uint64_t seed;
} rcase;

/* The ring's defaults: zigzag, B 1, S 512, Hq 4 / Hkv 2, D 32, no window, seed 11. */
extern const rcase ring_base;

/* One case against single-rank attn_fwd / attn_bwd on the full problem: O, LSE, dQ, dK, dV,
 * dsinks, a repeat bitwise identical, the step record. Returns 1 on pass (agreed). */
int run_case(const rcase *c);

/* Random window (left up to `left` keys, or `wide_left` with a right part), sinks, ALiBi
 * and softcap. */
void random_flags(tu_rng *rng, rcase *c, int64_t left, int64_t wide_left);
/* "<prefix> <i>: <the case's shape and flags>" in buf; returns buf. */
const char *case_name(char *buf, size_t n, const char *prefix, int i, const rcase *c);

int part_split(void);        /* test_ring_split.c */
int part_split_random(void);

#endif
