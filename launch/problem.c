/* problem.c — builds the problem attnrun runs: global shape and spec from the flags or the
 * .npy headers, generated extras (sinks, ALiBi slopes, varlen lengths, block mask), and
 * this rank's shard of Q, K, V, dO (row runs x a range of heads), generated from the
 * counter RNG or read with pread from the files (float32, rounded to the run's dtype):
 * no rank ever holds the full sequence.
 * problem_fetch serves the oracle any row of the full sequence. */
#include "kvcache.h"
#include "problem.h"
#include "err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "dtype.h"
#include "rng.h"

#define INPUT_BOUND 1.7320508f /* U[-sqrt3, sqrt3): unit variance, so scores have std ~1 */

static const char *const tensor_file[T_COUNT] = {"q.npy", "k.npy", "v.npy", "do.npy"};
static const uint64_t tensor_stream[T_COUNT] = {RNG_Q, RNG_K, RNG_V, RNG_DO};

float *problem_alloc(int64_t b, int64_t rows, int64_t h, int64_t d) {
  size_t bytes = sizeof(float);
  if (b < 0 || rows < 0 || h < 0 || d < 0 || __builtin_mul_overflow(bytes, (size_t)b, &bytes) ||
      __builtin_mul_overflow(bytes, (size_t)rows, &bytes) ||
      __builtin_mul_overflow(bytes, (size_t)h, &bytes) ||
      __builtin_mul_overflow(bytes, (size_t)d, &bytes) || bytes > SIZE_MAX - 64)
    return NULL;
  bytes = (bytes + 63) / 64 * 64;
  return aligned_alloc(64, bytes ? bytes : 64);
}

void problem_dims(const problem *p, int which, int64_t *seq, int64_t *heads, int64_t *dim) {
  const attn_spec *s = &p->spec;
  int is_q = which == T_Q || which == T_DO;
  *seq = is_q ? p->seq_q : p->seq_kv;
  *heads = is_q ? s->num_heads_q : s->num_heads_kv;
  *dim = (which == T_Q || which == T_K) ? s->head_dim_qk : s->head_dim_v;
}

static void make_alibi(problem *p) {
  int32_t hq = p->spec.num_heads_q;
  p->alibi = malloc((size_t)hq * sizeof(float));
  for (int32_t h = 0; h < hq; h++)
    p->alibi[h] = exp2f(-8.0f * (float)(h + 1) / (float)hq);
}

static void make_sinks(problem *p) {
  int32_t hq = p->spec.num_heads_q;
  p->sinks = malloc((size_t)hq * sizeof(float));
  for (int32_t h = 0; h < hq; h++)
    p->sinks[h] = rng_uniform(p->seed, RNG_SINKS, (uint64_t)h, 0.0f, 2.0f);
}

/* Prefix sums of n lengths of total `total` (each >= 1) proportional to weights w. */
static int32_t *split_lengths(const float *w, int32_t n, int64_t total) {
  int32_t *cu = malloc((size_t)(n + 1) * sizeof(int32_t));
  double wsum = 0;
  for (int32_t i = 0; i < n; i++)
    wsum += w[i];
  cu[0] = 0;
  for (int32_t i = 0; i < n; i++) {
    int64_t len = 1 + (int64_t)((double)(total - n) * w[i] / wsum);
    cu[i + 1] = (int32_t)(cu[i] + len);
  }
  cu[n] = (int32_t)total; /* the rounding remainder goes to the last sequence */
  return cu;
}

static void make_varlen(problem *p, const run_args *a) {
  int32_t n = a->varlen_count;
  float *w = malloc((size_t)n * sizeof(float));
  for (int32_t i = 0; i < n; i++)
    w[i] = a->varlen_explicit ? (float)a->varlen_lens[i]
                              : rng_uniform(p->seed, RNG_VARLEN, (uint64_t)i, 0.25f, 1.25f);
  if (a->varlen_explicit) { /* exact lengths: prefix sums, the same for q and kv */
    p->cu_q = malloc((size_t)(n + 1) * sizeof(int32_t));
    p->cu_q[0] = 0;
    for (int32_t i = 0; i < n; i++)
      p->cu_q[i + 1] = p->cu_q[i] + a->varlen_lens[i];
    p->cu_kv = malloc((size_t)(n + 1) * sizeof(int32_t));
    memcpy(p->cu_kv, p->cu_q, (size_t)(n + 1) * sizeof(int32_t));
  } else {
    p->cu_q = split_lengths(w, n, p->seq_q);
    p->cu_kv = split_lengths(w, n, p->seq_kv);
  }
  free(w);
  p->spec.num_seqs = n;
}

static int64_t longest_seq(const int32_t *cu, int32_t n, int64_t whole) {
  if (!cu) return whole;
  int64_t m = 0;
  for (int32_t i = 0; i < n; i++)
    if (cu[i + 1] - cu[i] > m) m = cu[i + 1] - cu[i];
  return m;
}

static int make_block_mask(problem *p, const run_args *a, char *err, size_t errlen) {
  attn_block_mask *bm = &p->block_mask;
  int32_t n = p->spec.num_seqs;
  bm->block_q = bm->block_k = a->sparse_block;
  bm->num_q_blocks = (longest_seq(p->cu_q, n, p->seq_q) + a->sparse_block - 1) / a->sparse_block;
  bm->num_k_blocks = (longest_seq(p->cu_kv, n, p->seq_kv) + a->sparse_block - 1) / a->sparse_block;
  p->mask_bytes = calloc((size_t)(bm->num_q_blocks * bm->num_k_blocks), 1);
  if (!p->mask_bytes) return launch_fail(err, errlen, "out of memory for the block mask");
  bm->mask = p->mask_bytes;
  attn_sparse_pattern pat = a->sparse_pattern;
  if (!pat.seed) pat.seed = p->seed;
  attn_status st = attn_block_mask_fill(bm, p->mask_bytes, &pat);
  if (st != ATTN_OK)
    return launch_fail(err, errlen, "attn_block_mask_fill: %s: %s", attn_status_string(st),
                attn_last_error());
  p->spec.block_mask = bm;
  return 0;
}

static void spec_from_args(problem *p, const run_args *a) {
  attn_spec init = ATTN_SPEC_INIT;
  p->spec = init;
  p->spec.num_heads_q = a->heads_q;
  p->spec.num_heads_kv = a->heads_kv;
  p->spec.head_dim_qk = a->head_dim_qk;
  p->spec.head_dim_v = a->head_dim_v;
  p->spec.scale = a->scale;
  p->spec.causal = a->causal;
  p->spec.window_left = a->window_left;
  p->spec.window_right = a->window_right;
  p->spec.softcap = a->softcap;
}

/* Reads a 4-D header and checks it against the dims known so far (-1: take it). */
static int load_header4(problem *p, int t, const char *dir, int64_t want[4], char *err,
                        size_t errlen) {
  snprintf(p->path[t], sizeof p->path[t], "%s/%s", dir, tensor_file[t]);
  npy_header *h = &p->hdr[t];
  if (npy_read_header(p->path[t], NPY_F32, h, err, errlen)) return -1;
  char sb[128];
  if (h->ndim != 4)
    return launch_fail(err, errlen, "%s: shape %s, expected 4 dims", p->path[t],
                npy_shape_string(h->ndim, h->shape, sb, sizeof sb));
  static const char *const names[4] = {"B", "S", "H", "D"};
  for (int i = 0; i < 4; i++) {
    if (want[i] >= 0 && h->shape[i] != want[i])
      return launch_fail(err, errlen, "%s: shape %s, but %s must be %lld to match the other files",
                  p->path[t], npy_shape_string(4, h->shape, sb, sizeof sb), names[i],
                  (long long)want[i]);
    if (h->shape[i] < 1)
      return launch_fail(err, errlen, "%s: shape %s has an empty dimension", p->path[t],
                  npy_shape_string(4, h->shape, sb, sizeof sb));
  }
  p->fd[t] = open(p->path[t], O_RDONLY);
  if (p->fd[t] < 0) return launch_fail(err, errlen, "%s: cannot open", p->path[t]);
  p->src[t] = SRC_FILE;
  return 0;
}

static int load_shapes(problem *p, const char *dir, int want_dout, char *err, size_t errlen) {
  int64_t any[4] = {-1, -1, -1, -1};
  if (load_header4(p, T_Q, dir, any, err, errlen)) return -1;
  const int64_t *q = p->hdr[T_Q].shape;
  int64_t wk[4] = {q[0], -1, -1, q[3]};
  if (load_header4(p, T_K, dir, wk, err, errlen)) return -1;
  const int64_t *k = p->hdr[T_K].shape;
  int64_t wv[4] = {q[0], k[1], k[2], -1};
  if (load_header4(p, T_V, dir, wv, err, errlen)) return -1;
  if (q[2] % k[2])
    return launch_fail(err, errlen, "%s has %lld heads, not a multiple of the %lld in %s", p->path[T_Q],
                (long long)q[2], (long long)k[2], p->path[T_K]);
  p->batch = q[0], p->seq_q = q[1], p->seq_kv = k[1];
  p->spec.num_heads_q = (int32_t)q[2], p->spec.num_heads_kv = (int32_t)k[2];
  p->spec.head_dim_qk = (int32_t)q[3], p->spec.head_dim_v = (int32_t)p->hdr[T_V].shape[3];
  char dpath[1100];
  snprintf(dpath, sizeof dpath, "%s/%s", dir, tensor_file[T_DO]);
  if (want_dout && access(dpath, R_OK) == 0) {
    int64_t wd[4] = {q[0], q[1], q[2], p->hdr[T_V].shape[3]};
    if (load_header4(p, T_DO, dir, wd, err, errlen)) return -1;
  }
  return 0;
}

/* Optional 1-D file of `n` elements; 1 if loaded, 0 if absent, -1 on error. */
static int load_optional(const char *dir, const char *name, npy_dtype dt, int64_t n, void **out,
                         char *err, size_t errlen) {
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (access(path, F_OK) != 0) return 0;
  npy_header h;
  if (npy_read_all(path, dt, &h, out, err, errlen)) return -1;
  if (h.ndim != 1 || (n >= 0 && h.count != n)) {
    char sb[128];
    free(*out);
    *out = NULL;
    if (n >= 0)
      return launch_fail(err, errlen, "%s: shape %s, expected [%lld]", path,
                  npy_shape_string(h.ndim, h.shape, sb, sizeof sb), (long long)n);
    return launch_fail(err, errlen, "%s: shape %s, expected 1 dim", path,
                npy_shape_string(h.ndim, h.shape, sb, sizeof sb));
  }
  return 1;
}

static int check_cu(const char *name, const int32_t *cu, int64_t n, int64_t total, char *err,
                    size_t errlen) {
  if (cu[0] != 0 || cu[n] != total)
    return launch_fail(err, errlen,
                "%s: must start at 0 and end at the sequence length %lld (got %d .. %d)", name,
                (long long)total, cu[0], cu[n]);
  for (int64_t i = 0; i < n; i++)
    if (cu[i + 1] < cu[i])
      return launch_fail(err, errlen, "%s: not non-decreasing at index %lld", name, (long long)i);
  return 0;
}

static int load_varlen(problem *p, const char *dir, char *err, size_t errlen) {
  void *cq = NULL, *ck = NULL;
  int rq = load_optional(dir, "cu_seqlens_q.npy", NPY_I32, -1, &cq, err, errlen);
  if (rq < 0) return -1;
  int rk = load_optional(dir, "cu_seqlens_kv.npy", NPY_I32, -1, &ck, err, errlen);
  p->cu_q = cq, p->cu_kv = ck;
  if (rk < 0) return -1;
  if (rq != rk)
    return launch_fail(err, errlen, "%s: give both cu_seqlens_q.npy and cu_seqlens_kv.npy, or neither",
                dir);
  if (!rq) return 0;
  char path[1100];
  npy_header h;
  snprintf(path, sizeof path, "%s/cu_seqlens_q.npy", dir);
  if (npy_read_header(path, NPY_I32, &h, err, errlen)) return -1;
  int64_t n = h.count - 1;
  snprintf(path, sizeof path, "%s/cu_seqlens_kv.npy", dir);
  npy_header hk;
  if (npy_read_header(path, NPY_I32, &hk, err, errlen)) return -1;
  if (n < 1 || hk.count != h.count)
    return launch_fail(err, errlen, "%s: cu_seqlens_q.npy and cu_seqlens_kv.npy need the same length >= 2",
                dir);
  if (p->batch != 1) return launch_fail(err, errlen, "%s: varlen (cu_seqlens) needs B = 1 in q.npy", dir);
  p->spec.num_seqs = (int32_t)n;
  if (check_cu("cu_seqlens_q.npy", p->cu_q, n, p->seq_q, err, errlen)) return -1;
  return check_cu("cu_seqlens_kv.npy", p->cu_kv, n, p->seq_kv, err, errlen);
}

static int load_extras(problem *p, const run_args *a, char *err, size_t errlen) {
  int64_t hq = p->spec.num_heads_q;
  int r = load_optional(a->load_dir, "sinks.npy", NPY_F32, hq, (void **)&p->sinks, err, errlen);
  if (r < 0) return -1;
  p->sinks_from_file = r;
  r = load_optional(a->load_dir, "alibi.npy", NPY_F32, hq, (void **)&p->alibi, err, errlen);
  if (r < 0) return -1;
  p->alibi_from_file = r;
  return load_varlen(p, a->load_dir, err, errlen);
}

int problem_setup(problem *p, const run_args *a, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  for (int t = 0; t < T_COUNT; t++)
    p->fd[t] = -1;
  spec_from_args(p, a);
  p->seed = a->seed;
  p->batch = a->batch, p->seq_q = a->seq_q, p->seq_kv = a->seq_kv;
  if (a->load_dir) {
    if (load_shapes(p, a->load_dir, a->bwd, err, errlen)) return -1;
    if (load_extras(p, a, err, errlen)) return -1;
  } else if (a->varlen_count) {
    make_varlen(p, a);
  }
  if (a->sinks && !p->sinks) make_sinks(p);
  if (a->alibi && !p->alibi) make_alibi(p);
  p->spec.sinks = p->sinks;
  p->spec.alibi_slopes = p->alibi;
  p->spec.cu_seqlens_q = p->cu_q;
  p->spec.cu_seqlens_kv = p->cu_kv;
  if (a->sparse && make_block_mask(p, a, err, errlen)) return -1;
  if (kvcache_setup(p, a, err, errlen)) return -1;
  attn_cp_shard qw = problem_whole(p->seq_q), kw = problem_whole(p->seq_kv);
  problem_set_shard(p, &qw, &kw, 0, p->spec.num_heads_q, 0, p->spec.num_heads_kv);
  return 0;
}

attn_cp_shard problem_whole(int64_t seq) {
  attn_cp_shard sh = {1, {0, 0}, {seq, 0}, seq};
  return sh;
}

void problem_set_shard(problem *p, const attn_cp_shard *qsh, const attn_cp_shard *ksh,
                       int32_t hq0, int32_t hq, int32_t hk0, int32_t hk) {
  p->qsh = *qsh, p->ksh = *ksh;
  p->q_rows = qsh->rows, p->kv_rows = ksh->rows;
  p->hq0 = hq0, p->hq = hq, p->hk0 = hk0, p->hk = hk;
}

int64_t problem_local_row(const attn_cp_shard *sh, int64_t s) {
  int64_t before = 0;
  for (int32_t r = 0; r < sh->count; r++) {
    if (s >= sh->start[r] && s < sh->start[r] + sh->len[r]) return before + s - sh->start[r];
    before += sh->len[r];
  }
  return -1;
}

int64_t problem_global_row(const attn_cp_shard *sh, int64_t r) {
  return r < sh->len[0] ? sh->start[0] + r : sh->start[1] + (r - sh->len[0]);
}

attn_spec problem_local_spec(const problem *p) {
  attn_spec s = p->spec;
  s.num_heads_q = p->hq;
  s.num_heads_kv = p->hk;
  if (s.sinks) s.sinks += p->hq0;
  if (s.alibi_slopes) s.alibi_slopes += p->hq0;
  return s;
}

/* Elements [first, first + count) of tensor t (global flat index) into dst, rounded to
 * the run's dtype. */
static int read_elems(const problem *p, int t, int64_t first, int64_t count, float *dst,
                      char *err, size_t errlen) {
  if (p->src[t] == SRC_FILE) {
    if (npy_pread_range(p->fd[t], p->path[t], &p->hdr[t], first, count, dst, err, errlen)) return -1;
  } else {
    rng_fill(p->seed, tensor_stream[t], (uint64_t)first, count, -INPUT_BOUND, INPUT_BOUND, dst);
  }
  dtype_round_all(dst, count, p->dtype); /* what the kernels will see, on every path */
  return 0;
}

/* Fill [B, sh.rows, hn, D] of tensor t: rows of the shard's runs, heads [h0, h0 + hn). */
static int fill_shard(const problem *p, int t, float *buf, const attn_cp_shard *sh, int32_t h0,
                      int32_t hn, char *err, size_t errlen) {
  int64_t seq, heads, dim;
  problem_dims(p, t, &seq, &heads, &dim);
  int64_t row = hn * dim;
  int rc = 0;
  for (int64_t b = 0; b < p->batch; b++) {
    float *dst = buf + b * sh->rows * row;
    for (int32_t r = 0; r < sh->count && rc == 0; r++) {
      int64_t first = ((b * seq + sh->start[r]) * heads + h0) * dim;
      if (hn == heads) { /* the run is contiguous in the file */
        rc = read_elems(p, t, first, sh->len[r] * row, dst, err, errlen);
      } else {
#pragma omp parallel for schedule(static) reduction(| : rc)
        for (int64_t i = 0; i < sh->len[r]; i++)
          rc |= read_elems(p, t, first + i * heads * dim, row, dst + i * row, err, errlen);
      }
      dst += sh->len[r] * row;
    }
  }
  return rc ? -1 : 0;
}

int problem_fill_inputs(problem *p, int want_dout, char *err, size_t errlen) {
  const attn_spec *s = &p->spec;
  p->q = problem_alloc(p->batch, p->q_rows, p->hq, s->head_dim_qk);
  p->k = problem_alloc(p->batch, p->kv_rows, p->hk, s->head_dim_qk);
  p->v = problem_alloc(p->batch, p->kv_rows, p->hk, s->head_dim_v);
  if (want_dout) p->dout = problem_alloc(p->batch, p->q_rows, p->hq, s->head_dim_v);
  if (!p->q || !p->k || !p->v || (want_dout && !p->dout))
    return launch_fail(err, errlen,
                "out of memory for the inputs (%.3g GiB for Q, K, V%s); use a smaller problem",
                4.0 * (double)p->batch *
                    ((double)p->q_rows * p->hq *
                         (s->head_dim_qk + (want_dout ? s->head_dim_v : 0)) +
                     (double)p->kv_rows * p->hk * (s->head_dim_qk + s->head_dim_v)) /
                    1073741824.0,
                want_dout ? ", dO" : "");
  if (fill_shard(p, T_Q, p->q, &p->qsh, p->hq0, p->hq, err, errlen) ||
      fill_shard(p, T_K, p->k, &p->ksh, p->hk0, p->hk, err, errlen) ||
      fill_shard(p, T_V, p->v, &p->ksh, p->hk0, p->hk, err, errlen))
    return -1;
  return want_dout ? fill_shard(p, T_DO, p->dout, &p->qsh, p->hq0, p->hq, err, errlen) : 0;
}

void problem_fetch(void *user, int which, int64_t b, int64_t s, int64_t h, float *out) {
  problem *p = user;
  int64_t seq, heads, dim;
  problem_dims(p, which, &seq, &heads, &dim);
  int is_q = which == T_Q || which == T_DO;
  const attn_cp_shard *sh = is_q ? &p->qsh : &p->ksh;
  int64_t h0 = is_q ? p->hq0 : p->hk0, hn = is_q ? p->hq : p->hk;
  float *local[T_COUNT] = {p->q, p->k, p->v, p->dout};
  int64_t r = problem_local_row(sh, s);
  if (local[which] && r >= 0 && h >= h0 && h < h0 + hn) {
    memcpy(out, local[which] + ((b * sh->rows + r) * hn + (h - h0)) * dim,
           (size_t)dim * sizeof(float));
    return;
  }
  char err[256];
  if (read_elems(p, which, ((b * seq + s) * heads + h) * dim, dim, out, err, sizeof err))
    for (int64_t d = 0; d < dim; d++)
      out[d] = NAN; /* shows up as wrong in --check */
}

void problem_free(problem *p) {
  for (int t = 0; t < T_COUNT; t++)
    if (p->fd[t] >= 0 && p->src[t] == SRC_FILE) close(p->fd[t]);
  free(p->sinks);
  free(p->alibi);
  free(p->cu_q);
  free(p->cu_kv);
  free(p->mask_bytes);
  kvcache_free(p);
  free(p->q);
  free(p->k);
  free(p->v);
  free(p->dout);
  memset(p, 0, sizeof *p);
}
