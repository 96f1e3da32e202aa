/* args.c — parses the attnrun command line into run_args: a table of flags, typed setters,
 * then cross-flag validation. Every error is a sentence naming the flag and the value. */
#include "args.h"
#include "err.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { K_BOOL, K_SIZE, K_INT, K_FLOAT, K_SPECIAL } flag_kind;
typedef int (*special_fn)(run_args *a, const char *v, char *err, size_t errlen);

typedef struct {
  const char *name;
  flag_kind kind;
  size_t offset; /* field for K_BOOL/K_SIZE/K_INT/K_FLOAT */
  unsigned given;
  special_fn special;
} flag_def;

int args_parse_size(const char *s, int allow_neg, int64_t *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || errno) return -1;
  int shift = 0;
  if (*end == 'K' || *end == 'k')
    shift = 10;
  else if (*end == 'M' || *end == 'm')
    shift = 20;
  else if (*end == 'G' || *end == 'g')
    shift = 30;
  if (shift) end++;
  if (*end != '\0') return -1;
  if (v < 0 && !(allow_neg && v == -1 && !shift)) return -1;
  if (v > (LLONG_MAX >> shift)) return -1;
  *out = (int64_t)v << shift;
  return 0;
}

static int parse_float(const char *s, float *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno) return -1;
  *out = (float)v;
  return 0;
}

static int set_window(run_args *a, const char *v, char *err, size_t errlen) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", v);
  char *comma = strchr(buf, ',');
  if (comma) *comma = '\0';
  int64_t l, r;
  if (args_parse_size(buf, 1, &l) || args_parse_size(comma ? comma + 1 : buf, 1, &r))
    return launch_fail(err, errlen, "--window '%s': expected L,R (or W for W,W); sizes >= 0 or -1", v);
  a->window_left = l;
  a->window_right = r;
  return 0;
}

static int set_varlen(run_args *a, const char *v, char *err, size_t errlen) {
  a->varlen_explicit = strchr(v, ',') != NULL;
  a->varlen_count = 0;
  const char *p = v;
  while (*p) {
    char buf[32];
    size_t n = strcspn(p, ",");
    int64_t len;
    snprintf(buf, sizeof buf, "%.*s", (int)(n < 31 ? n : 31), p);
    /* a listed length may be 0 (an empty sequence: its rows are none, as cu_seqlens
     * allows); a count N at least 1 */
    if (args_parse_size(buf, 0, &len) || len < (a->varlen_explicit ? 0 : 1) || len > INT32_MAX)
      return launch_fail(err, errlen,
                         "--varlen '%s': expected N >= 1 (N random lengths) or a list "
                         "L1,L2,... of lengths >= 0", v);
    if (a->varlen_count == ARGS_MAX_VARLEN)
      return launch_fail(err, errlen, "--varlen: more than %d lengths", ARGS_MAX_VARLEN);
    a->varlen_lens[a->varlen_count++] = (int32_t)len;
    p += n + (p[n] == ',');
  }
  if (a->varlen_count == 0) return launch_fail(err, errlen, "--varlen: empty value");
  if (!a->varlen_explicit) a->varlen_count = a->varlen_lens[0];
  return 0;
}

static int set_cache_lens(run_args *a, const char *v, char *err, size_t errlen) {
  a->cache_lens_count = 0;
  a->cache_lens_random = !strcmp(v, "random");
  for (const char *p = v; *p && !a->cache_lens_random;) {
    char buf[32];
    size_t n = strcspn(p, ",");
    int64_t len;
    snprintf(buf, sizeof buf, "%.*s", (int)(n < 31 ? n : 31), p);
    if (args_parse_size(buf, 0, &len) || len < 0 || len > INT32_MAX)
      return launch_fail(err, errlen,
                         "--cache-lens '%s': expected random, L (every batch) or L1,L2,.. (one "
                         "per batch), lengths >= 0",
                         v);
    if (a->cache_lens_count == ARGS_MAX_VARLEN)
      return launch_fail(err, errlen, "--cache-lens: more than %d lengths", ARGS_MAX_VARLEN);
    a->cache_lens[a->cache_lens_count++] = (int32_t)len;
    p += n + (p[n] == ',');
  }
  if (!a->cache_lens_random && a->cache_lens_count == 0)
    return launch_fail(err, errlen, "--cache-lens: empty value");
  return 0;
}

static int set_sparse_key(run_args *a, const char *key, int64_t val) {
  attn_sparse_pattern *p = &a->sparse_pattern;
  if (val > INT32_MAX) return -1;
  if (!strcmp(key, "local"))
    p->local_blocks = (int32_t)val;
  else if (!strcmp(key, "stride"))
    p->stride = (int32_t)val;
  else if (!strcmp(key, "global"))
    p->global_blocks = (int32_t)val;
  else if (!strcmp(key, "random"))
    p->random_blocks = (int32_t)val;
  else if (!strcmp(key, "block") && val >= 1)
    a->sparse_block = (int32_t)val;
  else if (!strcmp(key, "seed"))
    p->seed = (uint64_t)val;
  else
    return -1;
  return 0;
}

static int set_sparse(run_args *a, const char *v, char *err, size_t errlen) {
  a->sparse = 1;
  const char *p = v;
  while (*p) {
    char item[64], *eq;
    size_t n = strcspn(p, ",");
    int64_t val;
    snprintf(item, sizeof item, "%.*s", (int)(n < 63 ? n : 63), p);
    eq = strchr(item, '=');
    if (!eq || (*eq = '\0', args_parse_size(eq + 1, 0, &val)) || set_sparse_key(a, item, val))
      return launch_fail(err, errlen,
                     "--sparse '%s': expected key=value pairs from local, stride, global, "
                     "random, block, seed (e.g. local=2,stride=4,global=1,random=1,block=64)",
                     v);
    p += n + (p[n] == ',');
  }
  return 0;
}

static int set_backend(run_args *a, const char *v, char *err, size_t errlen) {
  if (!strcmp(v, "auto"))
    a->backend = ATTN_BACKEND_AUTO;
  else if (!strcmp(v, "cpu"))
    a->backend = ATTN_BACKEND_CPU;
  else if (!strcmp(v, "cuda"))
    a->backend = ATTN_BACKEND_CUDA;
  else
    return launch_fail(err, errlen, "--backend '%s': expected cpu, auto or cuda", v);
  return 0;
}

static int set_dtype(run_args *a, const char *v, char *err, size_t errlen) {
  if (!strcmp(v, "f32"))
    a->dtype = ATTN_F32;
  else if (!strcmp(v, "bf16"))
    a->dtype = ATTN_BF16;
  else if (!strcmp(v, "f16"))
    a->dtype = ATTN_F16;
  else
    return launch_fail(err, errlen, "--dtype '%s': expected f32, bf16 or f16", v);
  return 0;
}

static int set_seed(run_args *a, const char *v, char *err, size_t errlen) {
  char *end;
  errno = 0;
  unsigned long long s = strtoull(v, &end, 0);
  if (end == v || *end || errno || v[0] == '-')
    return launch_fail(err, errlen, "--seed '%s': expected a non-negative integer", v);
  a->seed = (uint64_t)s;
  return 0;
}

static int set_load(run_args *a, const char *v, char *err, size_t errlen) {
  (void)err, (void)errlen;
  a->load_dir = v;
  return 0;
}
static int set_save(run_args *a, const char *v, char *err, size_t errlen) {
  (void)err, (void)errlen;
  a->save_dir = v;
  return 0;
}
static int set_json(run_args *a, const char *v, char *err, size_t errlen) {
  (void)err, (void)errlen;
  a->json_path = v;
  return 0;
}

static int set_mode(run_args *a, const char *v, char *err, size_t errlen) {
  if (!strcmp(v, "auto"))
    a->mode = MODE_AUTO;
  else if (!strcmp(v, "tp"))
    a->mode = MODE_TP;
  else if (!strcmp(v, "ring"))
    a->mode = MODE_RING;
  else if (!strcmp(v, "split-kv"))
    a->mode = MODE_SPLIT_KV;
  else
    return launch_fail(err, errlen, "--mode '%s': expected tp, ring, split-kv or auto", v);
  return 0;
}

static int set_layout(run_args *a, const char *v, char *err, size_t errlen) {
  if (!strcmp(v, "contiguous"))
    a->layout = ATTN_LAYOUT_CONTIGUOUS;
  else if (!strcmp(v, "zigzag"))
    a->layout = ATTN_LAYOUT_ZIGZAG;
  else
    return launch_fail(err, errlen, "--layout '%s': expected contiguous or zigzag", v);
  return 0;
}

#define F(name, kind, field, given)                                                                \
  { name, kind, offsetof(run_args, field), given, NULL }
#define S(name, fn, given)                                                                         \
  { name, K_SPECIAL, 0, given, fn }
static const flag_def flags[] = {
    F("--seq", K_SIZE, seq_q, GIVEN_SHAPE | GIVEN_SEQ),
    F("--seq-kv", K_SIZE, seq_kv, GIVEN_SHAPE | GIVEN_SEQ_KV),
    F("--batch", K_SIZE, batch, GIVEN_SHAPE),
    F("--heads", K_INT, heads_q, GIVEN_SHAPE),
    F("--kv-heads", K_INT, heads_kv, GIVEN_SHAPE),
    F("--head-dim", K_INT, head_dim_qk, GIVEN_SHAPE),
    F("--head-dim-v", K_INT, head_dim_v, GIVEN_SHAPE),
    F("--causal", K_BOOL, causal, GIVEN_MASK),
    S("--window", set_window, GIVEN_MASK),
    F("--softcap", K_FLOAT, softcap, GIVEN_MASK),
    F("--scale", K_FLOAT, scale, GIVEN_MASK),
    F("--sinks", K_BOOL, sinks, GIVEN_MASK),
    F("--alibi", K_BOOL, alibi, GIVEN_MASK),
    S("--varlen", set_varlen, GIVEN_MASK),
    S("--sparse", set_sparse, GIVEN_MASK),
    F("--page-size", K_SIZE, page_size, GIVEN_MASK),
    S("--cache-lens", set_cache_lens, GIVEN_MASK),
    F("--bwd", K_BOOL, bwd, 0),
    F("--threads", K_INT, threads, 0),
    F("--iters", K_INT, iters, GIVEN_ITERS),
    F("--warmup", K_INT, warmup, GIVEN_WARMUP),
    S("--seed", set_seed, 0),
    F("--check", K_SIZE, check_rows, 0),
    S("--load", set_load, 0),
    S("--save", set_save, 0),
    S("--json", set_json, 0),
    S("--backend", set_backend, 0),
    S("--dtype", set_dtype, GIVEN_DTYPE),
    F("--device", K_INT, device, GIVEN_DEVICE),
    F("--list-devices", K_BOOL, list_devices, 0),
    F("--scalar", K_BOOL, scalar, 0),
    S("--mode", set_mode, 0),
    F("--tp", K_INT, tp, GIVEN_TP),
    F("--cp", K_INT, cp, GIVEN_CP),
    S("--layout", set_layout, GIVEN_LAYOUT),
    F("--d-model", K_SIZE, d_model, 0),
    F("--timeout", K_FLOAT, timeout_s, 0),
    F("--force", K_BOOL, force, 0),
    F("--no-bind", K_BOOL, no_bind, 0),
};
#undef F
#undef S

static const flag_def *find_flag(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (strlen(flags[i].name) == len && !strncmp(flags[i].name, name, len)) return &flags[i];
  return NULL;
}

static int apply_value(run_args *a, const flag_def *f, const char *v, char *err, size_t errlen) {
  char *field = (char *)a + f->offset;
  int64_t n;
  switch (f->kind) {
  case K_SIZE:
    if (args_parse_size(v, 0, &n))
      return launch_fail(err, errlen, "%s '%s': expected a size such as 4096, 4K or 1M", f->name, v);
    /* positions and cu_seqlens are int32 in the kernels, and the run's estimate walks the
     * rows by tiles: a size past 2^31 - 1 would hang there before any refusal */
    if (n > INT32_MAX)
      return launch_fail(err, errlen, "%s '%s': at most 2147483647 (2G - 1)", f->name, v);
    *(int64_t *)field = n;
    return 0;
  case K_INT:
    if (args_parse_size(v, 0, &n) || n > INT32_MAX)
      return launch_fail(err, errlen, "%s '%s': expected a non-negative integer", f->name, v);
    *(int32_t *)field = (int32_t)n;
    return 0;
  case K_FLOAT:
    if (parse_float(v, (float *)field))
      return launch_fail(err, errlen, "%s '%s': expected a number", f->name, v);
    return 0;
  case K_SPECIAL:
    return f->special(a, v, err, errlen);
  case K_BOOL:
    break;
  }
  return launch_fail(err, errlen, "%s takes no value", f->name);
}

static void set_defaults(run_args *a) {
  memset(a, 0, sizeof *a);
  a->batch = 1;
  a->seq_q = 2048;
  a->heads_q = 8;
  a->head_dim_qk = 128;
  a->window_left = a->window_right = -1;
  a->iters = 5;
  a->warmup = 1;
  a->seed = 1;
  a->sparse_block = 64;
  a->backend = ATTN_BACKEND_AUTO;
  a->mode = MODE_AUTO;
  a->layout = ATTN_LAYOUT_ZIGZAG;
}

/* One argv entry (and maybe the next one, its value). Returns args consumed or -1. */
static int parse_one(run_args *a, int argc, char **argv, int i, char *err, size_t errlen) {
  const char *arg = argv[i];
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  const flag_def *f = find_flag(arg, len);
  if (!f) return launch_fail(err, errlen, "unknown flag '%s'", arg);
  a->given |= f->given;
  if (f->kind == K_BOOL) {
    if (eq) return launch_fail(err, errlen, "%.*s takes no value", (int)len, arg);
    *(int *)((char *)a + f->offset) = 1;
    return 1;
  }
  const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
  if (!v || (!eq && v[0] == '-' && v[1] == '-'))
    return launch_fail(err, errlen, "%s needs a value", f->name);
  return apply_value(a, f, v, err, errlen) ? -1 : (eq ? 1 : 2);
}

static int check_varlen(run_args *a, char *err, size_t errlen) {
  if (a->batch != 1)
    return launch_fail(err, errlen, "--varlen packs sequences along S: --batch must be 1");
  if (!a->varlen_explicit) {
    int64_t shortest = a->seq_kv < a->seq_q ? a->seq_kv : a->seq_q;
    if (a->varlen_count > shortest)
      return launch_fail(err, errlen, "--varlen %d: more sequences than tokens (%lld)", a->varlen_count,
                     (long long)shortest);
    return 0;
  }
  int64_t total = 0;
  for (int i = 0; i < a->varlen_count; i++)
    total += a->varlen_lens[i];
  if (((a->given & GIVEN_SEQ) && total != a->seq_q) ||
      ((a->given & GIVEN_SEQ_KV) && total != a->seq_kv))
    return launch_fail(err, errlen, "--varlen lengths sum to %lld, but --seq is %lld and --seq-kv %lld",
                   (long long)total, (long long)a->seq_q, (long long)a->seq_kv);
  a->seq_q = a->seq_kv = total;
  return 0;
}

static int check_shape(const run_args *a, char *err, size_t errlen) {
  if (a->batch < 1 || a->seq_q < 1 || a->seq_kv < 1)
    return launch_fail(err, errlen, "--batch, --seq and --seq-kv must be at least 1");
  if (a->heads_q < 1 || a->heads_kv < 1)
    return launch_fail(err, errlen, "--heads and --kv-heads must be at least 1");
  if (a->heads_q % a->heads_kv)
    return launch_fail(err, errlen,
                   "--heads %d is not a multiple of --kv-heads %d (GQA needs Hq %% Hkv == 0)",
                   a->heads_q, a->heads_kv);
  if (a->head_dim_qk < 1 || a->head_dim_v < 1)
    return launch_fail(err, errlen, "--head-dim and --head-dim-v must be at least 1");
  return 0;
}

static int check_run(const run_args *a, char *err, size_t errlen) {
  if (a->iters < 1 || a->iters > ARGS_MAX_ITERS)
    return launch_fail(err, errlen, "--iters %d: must be 1..%d", a->iters, ARGS_MAX_ITERS);
  if (a->warmup > ARGS_MAX_ITERS)
    return launch_fail(err, errlen, "--warmup %d: must be 0..%d", a->warmup, ARGS_MAX_ITERS);
  if (a->softcap < 0)
    return launch_fail(err, errlen, "--softcap %g: must be >= 0 (0: off)", a->softcap);
  if (a->scale < 0)
    return launch_fail(err, errlen, "--scale %g: must be > 0 (0: 1/sqrt(head_dim))", a->scale);
  if (a->load_dir && (a->given & GIVEN_SHAPE))
    return launch_fail(
        err, errlen,
        "shape flags (--seq, --heads, ...) conflict with --load: shapes come from the files");
  if ((a->given & GIVEN_DEVICE) && a->backend == ATTN_BACKEND_CPU)
    return launch_fail(err, errlen,
                       "--device %d picks a CUDA device; it conflicts with --backend cpu",
                       a->device);
  if (a->load_dir && a->varlen_count)
    return launch_fail(err, errlen,
                   "--varlen conflicts with --load: use cu_seqlens_q.npy / cu_seqlens_kv.npy");
  return 0;
}

/* Distribution flags that do not depend on the rank count (grid.c checks the rest). */
static int check_dist(const run_args *a, char *err, size_t errlen) {
  if (((a->given & GIVEN_TP) && a->tp < 1) || ((a->given & GIVEN_CP) && a->cp < 1))
    return launch_fail(err, errlen, "--tp and --cp must be at least 1");
  if (a->timeout_s < 0)
    return launch_fail(err, errlen, "--timeout %g: must be > 0 seconds (0: ATTN_TIMEOUT or 300)",
                   a->timeout_s);
  if (a->d_model && (a->given & GIVEN_SEQ_KV) && a->seq_kv != a->seq_q)
    return launch_fail(err, errlen, "--d-model runs self-attention: --seq-kv must equal --seq");
  if (a->d_model && a->load_dir)
    return launch_fail(err, errlen,
                   "--d-model runs the layer on generated x and weights; it conflicts with --load");
  return 0;
}

/* A KV cache: forward only, plain attention (tp at most), lengths within --seq-kv. */
static int check_cache(const run_args *a, char *err, size_t errlen) {
  const char *what = a->page_size > 0 ? "--page-size" : "--cache-lens";
  if (a->page_size < 0 || a->page_size > a->seq_kv)
    return launch_fail(err, errlen, "--page-size %lld: must be 1..--seq-kv (%lld)",
                       (long long)a->page_size, (long long)a->seq_kv);
  if (a->bwd)
    return launch_fail(err, errlen, "%s: a KV cache is for inference, forward only; drop --bwd",
                       what);
  if (a->varlen_count || a->load_dir || a->d_model)
    return launch_fail(err, errlen, "%s conflicts with %s (a KV cache serves batched decode / "
                       "prefill of plain attention)", what,
                       a->varlen_count ? "--varlen" : a->load_dir ? "--load" : "--d-model");
  if (a->mode == MODE_RING || a->mode == MODE_SPLIT_KV || (a->given & GIVEN_CP))
    return launch_fail(err, errlen, "%s: a KV cache runs on plain attention (--mode tp): the "
                       "ring and split-KV take no cache yet", what);
  if (a->cache_lens_count > 1 && a->cache_lens_count != a->batch)
    return launch_fail(err, errlen, "--cache-lens: %d lengths for --batch %lld (give one, or "
                       "one per batch)", a->cache_lens_count, (long long)a->batch);
  for (int i = 0; i < a->cache_lens_count; i++)
    if (a->cache_lens[i] > a->seq_kv)
      return launch_fail(err, errlen, "--cache-lens: length %d is past --seq-kv %lld",
                         a->cache_lens[i], (long long)a->seq_kv);
  return 0;
}

static int validate(run_args *a, char *err, size_t errlen) {
  if (!a->heads_kv) a->heads_kv = a->heads_q;
  if (!a->head_dim_v) a->head_dim_v = a->head_dim_qk;
  if (!(a->given & GIVEN_SEQ_KV)) a->seq_kv = a->seq_q;
  if (check_shape(a, err, errlen) || check_run(a, err, errlen) || check_dist(a, err, errlen))
    return -1;
  if (a->varlen_count && check_varlen(a, err, errlen)) return -1;
  if (args_kv_cache(a) && check_cache(a, err, errlen)) return -1;
  a->default_problem = !(a->given & (GIVEN_SHAPE | GIVEN_MASK)) && !a->load_dir;
  if (a->default_problem) a->causal = 1;
  return 0;
}

args_result args_parse(int argc, char **argv, run_args *a, char *err, size_t errlen) {
  set_defaults(a);
  err[0] = '\0';
  for (int i = 1; i < argc;) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return ARGS_HELP;
    int used = parse_one(a, argc, argv, i, err, errlen);
    if (used < 0) return ARGS_ERROR;
    i += used;
  }
  return validate(a, err, errlen) ? ARGS_ERROR : ARGS_OK;
}

void args_usage(FILE *out, const char *prog) {
  fprintf(
      out,
      "usage: %s [flags]    exact softmax attention, forward and backward, timed and checked\n"
      "\n"
      "With no problem flag (none of the flags under 'problem', and no --load) it runs the\n"
      "default problem: B=1 S=2K Hq=Hkv=8 D=128 causal. Inputs come from a counter-based RNG\n"
      "keyed by (seed, tensor, global index), uniform in [-sqrt3, sqrt3).\n"
      "Sizes take K/M/G suffixes, powers of two (4K = 4096).\n"
      "\n"
      "problem\n"
      "  --seq N            query length Sq (default 2K)\n"
      "  --seq-kv N         key/value length Skv (default Sq)\n"
      "  --batch N          batch B (default 1)\n"
      "  --heads N          query heads Hq (default 8)\n"
      "  --kv-heads N       key/value heads Hkv, Hq %% Hkv == 0 (default Hq; 1 = MQA)\n"
      "  --head-dim N       Dqk (default 128)\n"
      "  --head-dim-v N     Dv (default Dqk)\n"
      "  --causal           causal mask, bottom-right aligned\n"
      "  --window L,R       sliding window: keys i+off-L..i+off+R (-1 unbounded; W alone = W,W)\n"
      "  --softcap C        s = C*tanh(s/C)\n"
      "  --scale S          score scale (default 1/sqrt(Dqk))\n"
      "  --sinks            per-head sink logits, generated U[0,2) (--load: sinks.npy if present)\n"
      "  --alibi            ALiBi slopes 2^(-8(h+1)/Hq) (--load: alibi.npy if present)\n"
      "  --varlen N|L1,..   pack sequences along S (B=1): N of random lengths splitting Sq and\n"
      "                     Skv alike, or the listed lengths (both Sq and Skv; sum = --seq;\n"
      "                     0 = an empty sequence)\n"
      "  --sparse SPEC      block-sparse tile mask, SPEC = key=value list from local, stride,\n"
      "                     global, random (blocks), block (tile size, default 64), seed\n"
      "                     e.g. local=2,stride=4,global=1,random=1,block=64\n"
      "KV cache (forward only, plain attention)\n"
      "  --page-size N      K/V in pages of N rows, shuffled (a block table, as vLLM keeps\n"
      "                     them); rows past a batch's used keys and spare pages hold NaN\n"
      "  --cache-lens L|L1,..|random\n"
      "                     keys each batch uses (seqused_kv): one for every batch, one per\n"
      "                     batch, or random in 0..--seq-kv; causal aligns to them\n"
      "run\n"
      "  --bwd              also run and time the backward pass\n"
      "  --iters N          timed iterations, median reported (default 5; 1 when the estimate\n"
      "                     says one call takes more than 5 s)\n"
      "  --warmup N         untimed iterations first (default 1; 0 when a call takes > 5 s)\n"
      "  --threads N        CPU threads per rank (default: the rank's share of its host's cores)\n"
      "  --seed N           input seed (default 1)\n"
      "  --check N          compare N sampled query rows per rank (and with --bwd N key rows)\n"
      "                     with the float64 oracle over the full sequence; exit 3 if any\n"
      "                     element is wrong (--d-model: rows of y and dx). Wrong: off by\n"
      "                     more than tol x max|ref| of the tensor (LSE: x max(max|ref|, 1));\n"
      "                     tol forward / LSE / backward:\n"
      "                     f32 2e-5 / 2e-5 / 2e-4, bf16 2e-2 / 1e-3 / 4e-2, f16 4e-3 / 1e-3 / 8e-3\n"
      "                     (O rounded to bf16 is off by up to 2^-8 = 3.9e-3 relative, f16 2^-11,\n"
      "                     and the CUDA kernels round P and dS to it: about 5 units of rounding;\n"
      "                     the cpu kernels convert to float32 and round only O)\n"
      "  --backend B        cpu | auto | cuda (default auto: cuda when this build has it and\n"
      "                     every rank sees a CUDA device, else cpu; the header says which)\n"
      "  --dtype T          f32 | bf16 | f16: storage of Q, K, V, O, dO (default bf16 on cuda,\n"
      "                     f32 on cpu; a dtype the backend does not take: exit 2). Inputs are\n"
      "                     generated (or loaded) as float32 and rounded to T (nearest even);\n"
      "                     the oracle sees the rounded values. LSE and gradients are float32\n"
      "  --device N         CUDA device ordinal for every rank (default: the device nearest the\n"
      "                     rank's cores by hwloc; ranks of a host that tie spread over them)\n"
      "  --list-devices     print the CUDA devices (ordinal, PCI bus id, nearest cores), exit\n"
      "  --scalar           force the portable scalar CPU kernels\n"
      "  --force            run even when the estimate says it takes more than an hour, or\n"
      "                     more memory than the host has (refused otherwise, exit 2)\n"
      "distribution (mpirun -np P attnrun ...; tp x cp must equal P)\n"
      "  --mode M           tp | ring | split-kv | auto (default auto: one rank runs plain\n"
      "                     attention; more ranks get a grid chosen from the problem, and a line\n"
      "                     says why). split-kv (context-parallel decode): every CP rank holds\n"
      "                     all query rows and a cut of K/V; the float32 states are gathered and\n"
      "                     merged. auto takes it over the ring when its states are smaller than\n"
      "                     the K/V the ring would carry (few queries, many keys), or when the\n"
      "                     queries are too few to cut\n"
      "  --tp N             tensor-parallel ranks: each holds Hq/N query heads (default: P for\n"
      "                     --mode tp, 1 for --mode ring or split-kv, P/cp when --cp is given)\n"
      "  --cp N             context-parallel ranks: the sequence is cut over a ring of N ranks\n"
      "                     (default: P for --mode ring or split-kv, 1 for --mode tp, P/tp when\n"
      "                     --tp is given)\n"
      "  --layout L         contiguous | zigzag: how the ring cuts the sequence (default zigzag\n"
      "                     when causal, unless a window shorter than a chunk balances the\n"
      "                     contiguous cut or the sequence has fewer rows than zigzag's 2cp\n"
      "                     chunks; contiguous otherwise; split-kv cuts only the keys: zigzag\n"
      "                     when causal over more query rows than a chunk)\n"
      "  --d-model N        run the full tensor-parallel layer (projections W_qkv, attention,\n"
      "                     W_o, AllReduce) on generated x [B,S,N] and weights; without it the\n"
      "                     ranks run attention only, on their heads and rows\n"
      "  --timeout S        seconds any rank waits for a peer before the job is ended\n"
      "                     (default: env ATTN_TIMEOUT, else 300)\n"
      "  --no-bind          keep the launcher's CPU binding (default: ranks on a host split\n"
      "                     its cores, and OpenMP threads follow the share)\n"
      "input / output\n"
      "  --load DIR         read q.npy k.npy v.npy [sinks.npy alibi.npy do.npy cu_seqlens_q.npy\n"
      "                     cu_seqlens_kv.npy] (float32/int32, C order); shapes from the files\n"
      "  --save DIR         write o.npy lse.npy [dq.npy dk.npy dv.npy dsinks.npy] and the inputs\n"
      "                     (always full arrays: under mpirun each rank writes its part; with\n"
      "                     --d-model: x.npy y.npy [dy.npy dx.npy]). DIR must be visible to\n"
      "                     every rank\n"
      "  --json FILE        append one JSON record of the run (with the per-rank split)\n"
      "  --help             this text\n"
      "\n"
      "exit status (the same on every rank): 0 ok, 1 error while running (library, CUDA,\n"
      "files, a peer that failed or stalled), 2 nothing ran: bad flags, an impossible grid,\n"
      "a refused estimate, a backend, dtype or device this machine cannot give (--backend\n"
      "cuda without a visible CUDA device, --device past the last),\n"
      "3 --check found wrong elements on some rank\n",
      prog);
}

void args_usage_short(FILE *out, const char *prog) {
  fprintf(
      out,
      "usage: %s [--seq N] [--seq-kv N] [--batch N] [--heads N] [--kv-heads N] [--head-dim N]\n"
      "         [--head-dim-v N] [--causal] [--window L,R] [--softcap C] [--scale S] [--sinks]\n"
      "         [--alibi] [--varlen N|L1,L2,..] [--sparse SPEC] [--bwd] [--iters N] [--warmup N]\n"
      "         [--threads N] [--seed N] [--check N] [--backend cpu|auto|cuda] [--scalar]\n"
      "         [--dtype f32|bf16|f16] [--device N] [--list-devices]\n"
      "         [--load DIR] [--save DIR] [--json FILE] [--force] [--mode tp|ring|split-kv|auto]\n"
      "         [--tp N] [--cp N] [--layout contiguous|zigzag] [--d-model N] [--timeout S]\n"
      "         [--no-bind] [--help]\n"
      "run '%s --help' for what each flag does\n",
      prog, prog);
}
