/* problem.h — the attention problem attnrun runs: global shape and spec (masks, sinks,
 * ALiBi, varlen, block mask), where the inputs come from (counter RNG or .npy), and this
 * rank's shard of them: row runs of the sequence (attn_cp_shard) and a range of heads.
 * Single rank: the shard is the whole sequence and every head. */
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
  /* a KV cache (kvcache.c; spec.kv_cache = &kv_cache), or kv_used NULL: none */
  attn_kv_cache kv_cache;
  int32_t *kv_used;     /* [B] keys each batch uses */
  int32_t *block_table; /* [B, pages_per_seq] or NULL: not paged */
  int64_t page_size, pages_per_seq, num_pages;
  /* where inputs come from */
  uint64_t seed;
  attn_dtype dtype; /* Q, K, V, dO are rounded to it (nearest even) wherever they are read */
  input_source src[T_COUNT];
  char path[T_COUNT][1024];
  npy_header hdr[T_COUNT];
  int fd[T_COUNT]; /* open .npy files (read with pread, from any thread), or -1 */
  int sinks_from_file, alibi_from_file;
  /* this rank's shard, the same in every batch: query rows qsh (local rows in run order),
   * key rows ksh, query heads [hq0, hq0 + hq), KV heads [hk0, hk0 + hk) */
  attn_cp_shard qsh, ksh;
  int64_t q_rows, kv_rows; /* qsh.rows, ksh.rows */
  int32_t hq0, hq, hk0, hk;
  float *q;    /* [B, q_rows, hq, Dqk] */
  float *k;    /* [B, kv_rows, hk, Dqk] */
  float *v;    /* [B, kv_rows, hk, Dv] */
  float *dout; /* [B, q_rows, hq, Dv] or NULL */
} problem;

/* Global shape and spec from flags or from the .npy headers in a->load_dir; the shard is
 * set to the whole sequence. 0 on success, else -1 and a message in err. */
int problem_setup(problem *p, const run_args *a, char *err, size_t errlen);

/* This rank's shard: row runs of the query and key sequences, and heads. */
void problem_set_shard(problem *p, const attn_cp_shard *qsh, const attn_cp_shard *ksh,
                       int32_t hq0, int32_t hq, int32_t hk0, int32_t hk);

/* The whole sequence [0, seq) as one run. */
attn_cp_shard problem_whole(int64_t seq);

/* Local row of global row s in sh (rows in run order), or -1. */
int64_t problem_local_row(const attn_cp_shard *sh, int64_t s);

/* Global row of local row r of sh. */
int64_t problem_global_row(const attn_cp_shard *sh, int64_t r);

/* The spec of this rank's heads (sinks and ALiBi slopes offset to hq0). */
attn_spec problem_local_spec(const problem *p);

/* Allocate and fill this shard's Q, K, V (and dO when want_dout). */
int problem_fill_inputs(problem *p, int want_dout, char *err, size_t errlen);

void problem_free(problem *p);

/* Row (b, s, h) of tensor `which` (T_Q.. T_DO), global s and h, into out: from the shard
 * when it holds the row, else regenerated or read from the file (rounded to p->dtype). Matches
 * attn_ref_fetch_fn; safe to call from several threads. */
void problem_fetch(void *user, int which, int64_t b, int64_t s, int64_t h, float *out);

/* Dims of tensor `which`: *seq (global), *heads, *dim. */
void problem_dims(const problem *p, int which, int64_t *seq, int64_t *heads, int64_t *dim);

/* A contiguous [B, rows, H, D] host float32 buffer, 64-byte aligned; NULL on failure. */
float *problem_alloc(int64_t b, int64_t rows, int64_t h, int64_t d);

#endif
