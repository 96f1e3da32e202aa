/* test_case.h — the library-vs-oracle harness shared by the unit tests: describe a case,
 * generate its inputs, run attn_fwd/attn_bwd on poisoned outputs, run the float64 oracle,
 * compare with the suite's tolerances and print the case when it fails. */
#ifndef ATTN_TEST_CASE_H
#define ATTN_TEST_CASE_H

#include "attnrun.h"
#include "ref.h"
#include "test_util.h"

/* Tolerances (relative to max|ref| of each tensor, plus a tiny atol). */
#define TC_FWD_RTOL 2e-5
#define TC_BWD_RTOL 2e-4
/* bf16/f16 storage: O is rounded once on output (half a unit, 2^-9 / 2^-12 relative).
 * The gradients inherit that rounding through delta = rowsum(dO * O), amplified where
 * dP - delta cancels (peaked rows: 7e-3 relative measured in bf16), so the oracle check
 * uses the CLI's documented gradient tolerances (README); d(sinks), a sum with
 * cancellation, gets a bound of its own (tc_check). The sharp check of the gradients is
 * test_dtypes.c's pair with the float32 path fed the same rounded O. */
#define TC_O_RTOL(dt) ((dt) == ATTN_BF16 ? 0x1p-8 : (dt) == ATTN_F16 ? 0x1p-11 : 0.0)
#define TC_G_RTOL(dt) ((dt) == ATTN_BF16 ? 4e-2 : (dt) == ATTN_F16 ? 8e-3 : 0.0)

typedef struct {
  const char *name;
  int64_t B, Sq, Skv; /* ignored with varlen (B = 1, lengths from lq/lkv) */
  int Hq, Hkv, Dqk, Dv; /* Dv 0 → Dqk */
  int causal;
  int window;          /* window on: wl, wr (each -1 = unbounded side) */
  int64_t wl, wr;
  float softcap, scale;
  int sinks, alibi;
  int nseq;            /* varlen: number of sequences, lengths in lq / lkv */
  const int32_t *lq, *lkv;
  int bq, bk;          /* block mask block sizes (0: none); random blocks, ~2/3 visible */
  int mask_short;      /* the mask covers one block fewer than needed in each direction */
  const uint8_t *mask_bits; /* the mask itself instead of random blocks (row-major) */
  int bhsd;            /* library tensors in [B, H, S, D] memory order (strided views) */
  int bwd;             /* also run and check the backward */
  double amp;          /* q and k drawn from [-amp, amp) (0 → 1) */
  int dtype;           /* storage of q, k, v, o, dout: ATTN_F32 (0), ATTN_BF16 or ATTN_F16
                        * (inputs rounded to it, so the oracle reads what the library gets;
                        * gradients stay float32) */
  uint64_t seed;
} tc_case;

typedef struct {
  tc_case c;
  int64_t B, Sq, Skv, Hq, Hkv, Dqk, Dv;
  attn_spec spec;
  float *q, *k, *v, *dout;       /* [B,S,H,D] contiguous: what the oracle reads */
  float *sinks, *alibi;          /* [Hq] */
  int32_t *cu_q, *cu_kv;         /* [nseq + 1] */
  attn_block_mask bm;
  uint8_t *mask;
  void *lq, *lk, *lv, *ldo;      /* library copies in c.dtype (BHSD order when c.bhsd) */
  attn_tensor tq, tk, tv, tdo;
  attn_ref_arrays arr;
  attn_ref_problem rp;
  double *ro, *rlse, *rdq, *rdk, *rdv, *rds; /* oracle results (NULL until tc_ref) */
} tc_prob;

typedef struct {
  float *o, *lse, *dq, *dk, *dv, *ds; /* gathered to [B,S,H,D] contiguous; lse [B,Hq,Sq] */
  attn_status fwd_status, bwd_status;
} tc_out;

int64_t tc_n_q(const tc_prob *P);
int64_t tc_n_k(const tc_prob *P);
int64_t tc_n_v(const tc_prob *P);
int64_t tc_n_o(const tc_prob *P);
int64_t tc_n_lse(const tc_prob *P);

/* Context with num_threads and force_scalar; aborts the test if it cannot be created. */
attn_ctx_t tc_ctx(int force_scalar, int threads);
/* The same with cfg.cpu_amx (-1 off, 0 auto, 1 AMX required, 2 AVX512-BF16 required):
 * NULL when the required unit is missing on this CPU (or kernel). */
attn_ctx_t tc_ctx_amx(int force_scalar, int threads, int cpu_amx);

void tc_init(tc_prob *P, const tc_case *c);
/* After editing P->q/k/v/dout: refresh the library copies (and drop oracle results). */
void tc_sync(tc_prob *P);
void tc_ref(tc_prob *P, int bwd);
/* Poisons outputs, runs attn_fwd (and attn_bwd from the library's O/LSE when bwd). */
void tc_lib(attn_ctx_t ctx, tc_prob *P, tc_out *out, int bwd);
/* Compares out with the oracle (computing it if needed); prints the case on failure.
 * Returns 1 when everything matches. */
int tc_check(tc_prob *P, const tc_out *out, int bwd, const char *tag);
/* The gradients only (a forward judged elsewhere, e.g. by the 2x rule). */
int tc_check_grads(tc_prob *P, const tc_out *out, const char *tag);
/* Compares two library results within fp32 rounding (rtol relative to max|b|). */
int tc_check_pair(const tc_prob *P, const tc_out *a, const tc_out *b, int bwd, double rtol,
                  const char *tag);
void tc_out_free(tc_out *out);
void tc_free(tc_prob *P);
void tc_describe(const tc_case *c, char *buf, size_t n);

/* A flag-sweep case: shape's sizes, heads, dims (and bwd, dtype) kept, and flag mask m
 * (0-127) switching on: bit 0 causal, 1 a window (left 75, or 20 with bit 6; right 33,
 * none when causal) and BHSD views, 2 softcap 1.5 (amp 2), 3 sinks, 4 ALiBi, 5 varlen (3
 * sequences, lengths lq / lkv), 6 a 32x48 block mask. */
tc_case tc_flags_case(tc_case shape, int m, const int32_t *lq, const int32_t *lkv);
/* A random problem: sizes around the tiles and the row kernels, head dims, GQA, every flag,
 * varlen (4 sequences, some empty, lengths written to lq / lkv), block masks, BHSD views,
 * bf16 or f16 storage, the backward one time in three. */
tc_case tc_random_case(tu_rng *r, int32_t lq[4], int32_t lkv[4]);
/* The random cases' generator, seeded by ATTN_TEST_SEED (default 20261203); *count =
 * ATTN_TEST_COUNT, else dflt. */
tu_rng tc_random_rng(int *count, int dflt);

/* One case start to end: init, library, oracle, compare. Returns 1 on pass. */
int tc_run(attn_ctx_t ctx, const tc_case *c);

/* Makes a [B,S,H,D] view of rows [s0, s0+n) of a library tensor. */
attn_tensor tc_rows(const attn_tensor *t, int64_t s0, int64_t n);
/* A float32 state of P's query rows (allocated: free m, l, acc) with the keys folded in
 * by attn_fwd_block in n blocks [cuts[b], cuts[b+1]). */
attn_state tc_fwd_blocks(attn_ctx_t ctx, tc_prob *P, const int64_t *cuts, int n);

#endif
