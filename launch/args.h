/* args.h — the attnrun command line: flags, defaults, parsing and the usage text. */
#ifndef ATTNRUN_LAUNCH_ARGS_H
#define ATTNRUN_LAUNCH_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "attnrun.h"

#define ARGS_MAX_VARLEN 4096
#define ARGS_MAX_ITERS 10000

/* Which problem-defining flags were given (the default problem applies when none is). */
enum {
  GIVEN_SHAPE = 1 << 0,  /* --seq --seq-kv --batch --heads --kv-heads --head-dim --head-dim-v */
  GIVEN_MASK = 1 << 1,   /* --causal --window --softcap --scale --sinks --alibi --varlen --sparse */
  GIVEN_SEQ = 1 << 2,    /* --seq */
  GIVEN_SEQ_KV = 1 << 3, /* --seq-kv */
};

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
  int scalar;
  const char *load_dir, *save_dir, *json_path;
  unsigned given;      /* GIVEN_* bits */
  int default_problem; /* no problem flag given: the embedded default problem */
} run_args;

typedef enum { ARGS_OK = 0, ARGS_HELP = 1, ARGS_ERROR = 2 } args_result;

/* Parse argv into a (defaults filled first). On ARGS_ERROR, err holds the reason. */
args_result args_parse(int argc, char **argv, run_args *a, char *err, size_t errlen);

/* The full usage text (--help). */
void args_usage(FILE *out, const char *prog);

/* The short usage (after a bad flag): a synopsis and a pointer to --help. */
void args_usage_short(FILE *out, const char *prog);

/* Parse "4K", "1M", "4096" (powers of two: K = 1024). -1 allowed when allow_neg. */
int args_parse_size(const char *s, int allow_neg, int64_t *out);

#endif
