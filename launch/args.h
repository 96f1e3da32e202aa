/* args.h — the attnrun command line: flags, defaults, parsing and the usage text. */
#ifndef ATTNRUN_LAUNCH_ARGS_H
#define ATTNRUN_LAUNCH_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "attnrun.h"

#define ARGS_MAX_VARLEN 4096
#define ARGS_MAX_ITERS 10000
#define ARGS_REFUSE_S 3600.0 /* estimated runs longer than this need --force */
#define ARGS_LONG_CALL_S 5.0 /* calls longer than this: default --iters 1 --warmup 0 */

/* Which problem-defining flags were given (the default problem applies when none is). */
enum {
  GIVEN_SHAPE = 1 << 0,  /* --seq --seq-kv --batch --heads --kv-heads --head-dim --head-dim-v */
  GIVEN_MASK = 1 << 1,   /* --causal --window --softcap --scale --sinks --alibi --varlen --sparse */
  GIVEN_SEQ = 1 << 2,    /* --seq */
  GIVEN_SEQ_KV = 1 << 3, /* --seq-kv */
  GIVEN_TP = 1 << 4,     /* --tp */
  GIVEN_CP = 1 << 5,     /* --cp */
  GIVEN_LAYOUT = 1 << 6, /* --layout */
  GIVEN_ITERS = 1 << 7,  /* --iters */
  GIVEN_WARMUP = 1 << 8, /* --warmup */
  GIVEN_DTYPE = 1 << 9,  /* --dtype */
  GIVEN_DEVICE = 1 << 10, /* --device */
};

/* How the ranks share the work (DESIGN.md §4). AUTO: one rank runs plain attention; more
 * ranks get a tp x cp grid chosen from the problem (grid.c says why). */
typedef enum { MODE_AUTO = 0, MODE_TP = 1, MODE_RING = 2, MODE_SPLIT_KV = 3 } run_mode;

typedef struct {
  /* problem */
  int64_t batch, seq_q, seq_kv;    /* seq_kv 0 → seq_q */
  int32_t heads_q, heads_kv;       /* heads_kv 0 → heads_q */
  int32_t head_dim_qk, head_dim_v; /* head_dim_v 0 → head_dim_qk */
  int causal;
  int64_t window_left, window_right; /* -1: unbounded */
  float softcap, scale;              /* 0: off / default 1/sqrt(Dqk) */
  int sinks, alibi;
  /* varlen: varlen_count random lengths, or varlen_lens[0..varlen_count) given */
  int32_t varlen_count;
  int varlen_explicit;
  int32_t varlen_lens[ARGS_MAX_VARLEN];
  /* a KV cache (forward only): K/V in shuffled pages of page_size rows (0: contiguous);
   * each batch's used keys: cache_lens[0..count) (one value: every batch), or random */
  int64_t page_size;
  int cache_lens_random;
  int32_t cache_lens_count;
  int32_t cache_lens[ARGS_MAX_VARLEN];
  /* block-sparse */
  int sparse;
  int32_t sparse_block;
  attn_sparse_pattern sparse_pattern;
  /* run */
  int bwd;
  int32_t threads, iters, warmup;
  uint64_t seed;
  int64_t check_rows;
  attn_backend backend;
  attn_dtype dtype;     /* valid when GIVEN_DTYPE; else the backend's default */
  int32_t device;       /* CUDA ordinal when GIVEN_DEVICE; else chosen near the rank's cores */
  int list_devices;     /* --list-devices: print the devices and exit */
  int scalar;
  const char *load_dir, *save_dir, *json_path;
  /* distribution */
  run_mode mode;
  int32_t tp, cp;        /* 0: chosen from --mode and the rank count */
  attn_cp_layout layout; /* valid when GIVEN_LAYOUT; else chosen by grid.c */
  int64_t d_model;       /* > 0: the full tensor-parallel layer (attn_layer_*) */
  float timeout_s;       /* library and launcher waits; 0: ATTN_TIMEOUT or 300 s */
  int force;             /* run even when the estimate exceeds ARGS_REFUSE_S */
  int no_bind;           /* keep the launcher's binding */
  unsigned given;      /* GIVEN_* bits */
  int default_problem; /* no problem flag given: the embedded default problem */
} run_args;

typedef enum { ARGS_OK = 0, ARGS_HELP = 1, ARGS_ERROR = 2 } args_result;

/* Whether the run attends over a KV cache (--page-size or --cache-lens). */
static inline int args_kv_cache(const run_args *a) {
  return a->page_size > 0 || a->cache_lens_count > 0 || a->cache_lens_random;
}

/* Parse argv into a (defaults filled first). On ARGS_ERROR, err holds the reason. */
args_result args_parse(int argc, char **argv, run_args *a, char *err, size_t errlen);

/* The full usage text (--help). */
void args_usage(FILE *out, const char *prog);

/* The short usage (after a bad flag): a synopsis and a pointer to --help. */
void args_usage_short(FILE *out, const char *prog);

/* Parse "4K", "1M", "4096" (powers of two: K = 1024). -1 allowed when allow_neg. */
int args_parse_size(const char *s, int allow_neg, int64_t *out);

#endif
