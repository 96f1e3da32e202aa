/* problem.h — the attention problem attnrun runs: global shape and spec (masks, sinks,
 * ALiBi, varlen, block mask), where the inputs come from (counter RNG or .npy), and this
 * rank's shard of them. Single rank: the shard is the whole sequence. */
#ifndef ATTNRUN_LAUNCH_PROBLEM_H
#define ATTNRUN_LAUNCH_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "args.h"
#include "attnrun.h"
#include "npy.h"

/* Tensor slots, the same order as the oracle's ATTN_REF_Q/K/V/DO. */
enum { T_Q = 0, T_K = 1, T_V = 2, T_DO = 3, T_COUNT = 4 };

typedef enum { SRC_GENERATED = 0, SRC_FILE = 1 } input_source;

typedef struct {
  /* global problem */
  int64_t batch, seq_q, seq_kv;
  attn_spec spec;        /* points into the arrays below */
  float *sinks;          /* [Hq] or NULL */
  float *alibi;          /* [Hq] or NULL */
  int32_t *cu_q, *cu_kv; /* [num_seqs + 1] or NULL */
  attn_block_mask block_mask;
  uint8_t *mask_bytes; /* [num_q_blocks, num_k_blocks] or NULL */
  /* where inputs come from */
  uint64_t seed;
  input_source src[T_COUNT];
  char path[T_COUNT][1024];
  npy_header hdr[T_COUNT];
  int sinks_from_file, alibi_from_file;
  /* this rank's shard: query rows [q_row0, q_row0 + q_rows) and key rows
   * [kv_row0, kv_row0 + kv_rows) of every batch */
  int64_t q_row0, q_rows, kv_row0, kv_rows;
  float *q;    /* [B, q_rows, Hq, Dqk] */
  float *k;    /* [B, kv_rows, Hkv, Dqk] */
  float *v;    /* [B, kv_rows, Hkv, Dv] */
  float *dout; /* [B, q_rows, Hq, Dv] or NULL */
} problem;

/* Global shape and spec from flags or from the .npy headers in a->load_dir; the shard is
 * set to the whole sequence. 0 on success, else -1 and a message in err. */
int problem_setup(problem *p, const run_args *a, char *err, size_t errlen);

/* Allocate and fill this shard's Q, K, V (and dO when want_dout). */
int problem_fill_inputs(problem *p, int want_dout, char *err, size_t errlen);

void problem_free(problem *p);

/* Row (b, s, h) of tensor `which` (T_Q.. T_DO), global s, into out: from the shard when
 * it holds the row, else regenerated or read from the file. Matches attn_ref_fetch_fn. */
void problem_fetch(void *user, int which, int64_t b, int64_t s, int64_t h, float *out);

/* Dims of tensor `which`: *seq (global), *heads, *dim. */
void problem_dims(const problem *p, int which, int64_t *seq, int64_t *heads, int64_t *dim);

/* A contiguous [B, rows, H, D] host float32 buffer, 64-byte aligned; NULL on failure. */
float *problem_alloc(int64_t b, int64_t rows, int64_t h, int64_t d);

#endif
