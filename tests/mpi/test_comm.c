/* test_comm.c — multi-rank tests of comm/ and the group: allreduce (exact integer sums,
 * bitwise-identical float results on every rank), allgather, alltoall, the ring exchange
 * with uneven sizes, MPI errors as ATTN_ERR_MPI, the fingerprint agreement, the tp x cp
 * split, the step record, and attn_cp_shard_rows. Run on any number of ranks. */
#include "../../runtime/group.h"
#include "rank_check.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int wrank, wsize, nfail;
static struct attn_ctx_s dummy_ctx; /* the group only keeps the pointer */

static unsigned char byte_of(int a, int b, int64_t i) { return (unsigned char)(a * 31 + b * 7 + i * 13 + (i >> 8)); }

static uint64_t fnv(const void *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
  return h;
}

/* True on every rank when all ranks hold the same bytes. */
static int same_everywhere(const void *p, size_t n) {
  unsigned long long h = fnv(p, n), lo, hi;
  MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

/* ---- allreduce ------------------------------------------------------------------------- */
static double fill_value(attn__comm_type t, void *buf, int64_t i, double v) {
  if (t == ATTN_COMM_F32) return ((float *)buf)[i] = (float)v;
  if (t == ATTN_COMM_F64) return ((double *)buf)[i] = v;
  return (double)(((int64_t *)buf)[i] = (int64_t)v);
}

static double read_value(attn__comm_type t, const void *buf, int64_t i) {
  return t == ATTN_COMM_F32 ? ((const float *)buf)[i]
         : t == ATTN_COMM_F64 ? ((const double *)buf)[i]
                              : (double)((const int64_t *)buf)[i];
}

/* Integer-valued inputs: the sum is exact in every type. */
static void allreduce_exact(attn__comm *c, attn__comm_type t, int64_t count) {
  size_t es = t == ATTN_COMM_F32 ? 4 : 8;
  void *buf = malloc((size_t)count * es + 1);
  for (int64_t i = 0; i < count; i++) fill_value(t, buf, i, (double)((wrank + 1) * (i % 13 + 1)));
  CHECK_OK(c->ops->allreduce_sum(c, buf, count, t));
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < count; i++) {
    double want = (double)wsize * (wsize + 1) / 2 * (double)(i % 13 + 1);
    if (read_value(t, buf, i) != want && bad++ == 0) first = i;
  }
  CHECK(bad == 0, "allreduce type=%d count=%lld: %lld wrong, first at %lld", (int)t,
        (long long)count, (long long)bad, (long long)first);
  CHECK(same_everywhere(buf, (size_t)count * es), "allreduce type=%d count=%lld differs between ranks",
        (int)t, (long long)count);
  free(buf);
}

/* Random floats: rounding depends on the order of the sum; every rank must get the same bits. */
static void allreduce_random(attn__comm *c, int64_t count) {
  float *buf = malloc((size_t)count * sizeof *buf + 1);
  double *ref = malloc((size_t)count * sizeof *ref + 1);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int64_t i = 0; i < count; i++) {
    ref[i] = 0;
    for (int r = 0; r < wsize; r++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      float v = (float)((double)(s >> 40) / (double)(1 << 24) * 2 - 1) * (float)(1 + r);
      ref[i] += v;
      if (r == wrank) buf[i] = v;
    }
  }
  CHECK_OK(c->ops->allreduce_sum(c, buf, count, ATTN_COMM_F32));
  double worst = 0;
  for (int64_t i = 0; i < count; i++) {
    double e = buf[i] - ref[i];
    if (e < 0) e = -e;
    if (e > worst) worst = e;
  }
  CHECK(worst < 1e-5 * wsize * wsize, "allreduce of random floats: error %g", worst);
  CHECK(same_everywhere(buf, (size_t)count * sizeof *buf),
        "allreduce of random floats (count=%lld) is not bitwise identical on every rank",
        (long long)count);
  free(buf);
  free(ref);
}

static void test_allreduce(attn__comm *c) {
  const int64_t counts[] = {0, 1, 1000, (1 << 18) + 3};
  for (int t = 0; t < 3; t++)
    for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
      allreduce_exact(c, (attn__comm_type)t, counts[k]);
  allreduce_random(c, 4097);
  allreduce_random(c, 300001);
  CHECK(c->ops->allreduce_sum(c, NULL, 5, ATTN_COMM_F32) == ATTN_ERR_INVALID_ARG, "NULL buf");
  int64_t x = 1;
  CHECK(c->ops->allreduce_sum(c, &x, 1, (attn__comm_type)9) == ATTN_ERR_INVALID_ARG, "bad type");
}

/* ---- allgather / alltoall -------------------------------------------------------------- */
static void test_allgather(attn__comm *c) {
  const int64_t sizes[] = {0, 1, 1000, 70001};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    int64_t b = sizes[k];
    unsigned char *send = malloc((size_t)b + 1), *recv = malloc((size_t)(b * wsize) + 1);
    for (int64_t i = 0; i < b; i++) send[i] = byte_of(wrank, 0, i);
    for (int in_place = 0; in_place < 2; in_place++) {
      memset(recv, 0xee, (size_t)(b * wsize));
      const void *src = send;
      if (in_place) src = memcpy(recv + b * wrank, send, (size_t)b);
      CHECK_OK(c->ops->allgather(c, src, recv, b));
      int64_t bad = 0;
      for (int r = 0; r < wsize; r++)
        for (int64_t i = 0; i < b; i++) bad += recv[r * b + i] != byte_of(r, 0, i);
      CHECK(bad == 0, "allgather bytes=%lld in_place=%d: %lld wrong", (long long)b, in_place,
            (long long)bad);
    }
    free(send);
    free(recv);
  }
}

static void test_alltoall(attn__comm *c) {
  const int64_t sizes[] = {0, 3, 4096, 50001};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    int64_t b = sizes[k], n = b * wsize;
    unsigned char *send = malloc((size_t)n + 1), *recv = malloc((size_t)n + 1);
    for (int in_place = 0; in_place < 2; in_place++) {
      for (int r = 0; r < wsize; r++)
        for (int64_t i = 0; i < b; i++) send[r * b + i] = byte_of(wrank, r, i);
      if (in_place) memcpy(recv, send, (size_t)n);
      else memset(recv, 0xee, (size_t)n);
      CHECK_OK(c->ops->alltoall(c, in_place ? recv : send, recv, b));
      int64_t bad = 0;
      for (int s = 0; s < wsize; s++)
        for (int64_t i = 0; i < b; i++) bad += recv[s * b + i] != byte_of(s, wrank, i);
      CHECK(bad == 0, "alltoall bytes=%lld in_place=%d: %lld wrong", (long long)b, in_place,
            (long long)bad);
    }
    free(send);
    free(recv);
  }
}

/* ---- the ring exchange ---------------------------------------------------------------- */
static int64_t ring_bytes(int r, int64_t base) { return base + 37 * r; } /* uneven sizes */

static void check_recv(const unsigned char *buf, int64_t n, int from, const char *what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += buf[i] != byte_of(from, 1, i);
  CHECK(bad == 0, "%s: %lld of %lld bytes from rank %d wrong", what, (long long)bad, (long long)n,
        from);
}

/* One ring step: send to rank+1, receive from rank-1; a line (no wrap) when line != 0. */
static void ring_step(attn__comm *c, int64_t base, int line, int64_t extra_capacity) {
  int to = (wrank + 1) % wsize, from = (wrank + wsize - 1) % wsize;
  if (line && wrank == wsize - 1) to = -1;
  if (line && wrank == 0) from = -1;
  int64_t sb = ring_bytes(wrank, base), rb = ring_bytes(from < 0 ? 0 : from, base);
  unsigned char *s = malloc((size_t)sb + 1), *r = malloc((size_t)(rb + extra_capacity) + 1);
  for (int64_t i = 0; i < sb; i++) s[i] = byte_of(wrank, 1, i);
  memset(r, 0xee, (size_t)(rb + extra_capacity));
  attn__comm_req *req = NULL;
  CHECK_OK(c->ops->exchange_start(c, s, sb, to, r, rb + extra_capacity, from, &req));
  CHECK_OK(c->ops->exchange_wait(c, req));
  if (from >= 0) check_recv(r, rb, from, "ring step");
  free(s);
  free(r);
}

/* Two exchanges in flight at once (as backward: K/V and their gradients), waited in
 * reverse order. */
static void two_in_flight(attn__comm *c) {
  int to = (wrank + 1) % wsize, from = (wrank + wsize - 1) % wsize;
  int64_t nb = 200000;
  unsigned char *s = malloc((size_t)nb), *r1 = malloc((size_t)nb), *r2 = malloc((size_t)nb);
  for (int64_t i = 0; i < nb; i++) s[i] = byte_of(wrank, 1, i);
  attn__comm_req *a = NULL, *b = NULL;
  CHECK_OK(c->ops->exchange_start(c, s, nb, to, r1, nb, from, &a));
  CHECK_OK(c->ops->exchange_start(c, s, nb / 2, to, r2, nb / 2, from, &b));
  CHECK_OK(c->ops->exchange_wait(c, b));
  CHECK_OK(c->ops->exchange_wait(c, a));
  check_recv(r1, nb, from, "first of two in flight");
  check_recv(r2, nb / 2, from, "second of two in flight");
  free(s);
  free(r1);
  free(r2);
}

static void test_exchange(attn__comm *c) {
  const int64_t bases[] = {0, 1000, (1 << 20) + 5};
  for (size_t k = 0; k < sizeof bases / sizeof *bases; k++) {
    ring_step(c, bases[k], 0, 0);
    ring_step(c, bases[k], 1, 0);
  }
  if (!getenv("ATTN_COMM_CHUNK")) ring_step(c, 5000, 0, 123); /* receive buffer larger */
  two_in_flight(c);
  attn__comm_req *req = NULL;
  char x = 0;
  CHECK(c->ops->exchange_start(c, &x, 1, wsize, &x, 1, -1, &req) == ATTN_ERR_INVALID_ARG,
        "to=size must be rejected");
  CHECK(req == NULL, "req must stay NULL on failure");
}

/* A receive smaller than the message: ATTN_ERR_MPI with MPI's text, the communicator
 * dead afterwards, and the caller's error handler untouched. */
static void test_mpi_error(void) {
  attn__comm *c = NULL;
  CHECK_OK(attn__comm_mpi_create(&(MPI_Comm){MPI_COMM_WORLD}, 30, &c));
  if (!c) return;
  if (wsize >= 2 && wrank <= 1) {
    char buf[100] = {0};
    attn__comm_req *req = NULL;
    attn_status st = wrank == 0 ? c->ops->exchange_start(c, buf, 100, 1, NULL, 0, -1, &req)
                                : c->ops->exchange_start(c, NULL, 0, -1, buf, 10, 0, &req);
    CHECK(st == ATTN_OK, "start: %s", attn_last_error());
    st = c->ops->exchange_wait(c, req);
    if (wrank == 1) {
      CHECK(st == ATTN_ERR_MPI && strstr(attn_last_error(), "truncat"),
            "truncated receive: got %s: %s", attn_status_string(st), attn_last_error());
      int64_t v = 1;
      CHECK(c->ops->allreduce_sum(c, &v, 1, ATTN_COMM_I64) == ATTN_ERR_MPI && c->dead,
            "a communicator with an MPI error must be dead");
    } else {
      CHECK(st == ATTN_OK, "sender: %s", attn_last_error());
    }
  }
  MPI_Errhandler eh;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
  CHECK(eh == MPI_ERRORS_ARE_FATAL, "the caller's error handler was changed");
  MPI_Errhandler_free(&eh);
  c->ops->destroy(c);
}

/* ---- fingerprint agreement ------------------------------------------------------------ */
/* Every rank must hold the same message; returns 1 if so. */
static int same_message(const char *msg) {
  char mine[1024] = {0};
  snprintf(mine, sizeof mine, "%s", msg);
  return same_everywhere(mine, sizeof mine);
}

static void test_agree(attn__comm *c) {
  attn__fingerprint fp = {0};
  attn__fp_add(&fp, "version", 100);
  attn__fp_add(&fp, "seq_q", wrank == wsize - 1 && wsize > 1 ? 4095 : 4096);
  attn__fp_add(&fp, "heads", 8);
  attn_status st = attn__comm_agree(c, &fp);
  char want[256];
  if (wsize == 1) {
    CHECK(st == ATTN_OK, "one rank always agrees: %s", attn_last_error());
  } else {
    if (wsize == 2) snprintf(want, sizeof want, "ranks disagree on seq_q: rank 0 has 4096, rank 1 has 4095");
    else snprintf(want, sizeof want, "ranks disagree on seq_q: ranks 0..%d have 4096, rank %d has 4095", wsize - 2, wsize - 1);
    CHECK(st == ATTN_ERR_MISMATCH && !strcmp(attn_last_error(), want), "got %s: '%s', want '%s'",
          attn_status_string(st), attn_last_error(), want);
    CHECK(same_message(attn_last_error()), "ranks hold different mismatch messages");
  }
  fp.values[1] = 4096;
  CHECK_OK(attn__comm_agree(c, &fp));
  if (wrank == wsize - 1) attn__fp_add(&fp, "extra", 1);
  st = attn__comm_agree(c, &fp);
  if (wsize > 1) {
    CHECK(st == ATTN_ERR_MISMATCH && strstr(attn_last_error(), "number of fingerprint fields"),
          "field count: got %s: %s", attn_status_string(st), attn_last_error());
    CHECK(same_message(attn_last_error()), "ranks hold different field-count messages");
  }
}

/* ---- groups --------------------------------------------------------------------------- */
static attn_status make_group(attn_group_t *g, int tp, int cp) {
  attn_group_config cfg = ATTN_GROUP_CONFIG_INIT;
  cfg.tp = tp;
  cfg.cp = cp;
  cfg.timeout_s = 30;
  return attn_group_create(g, &dummy_ctx, &(MPI_Comm){MPI_COMM_WORLD}, &cfg);
}

static void check_members(attn__comm *c, int first, int stride, const char *what) {
  int ok = 1;
  for (int i = 0; i < c->size; i++) ok &= c->world_ranks[i] == first + i * stride;
  CHECK(ok, "%s group members are not %d + i*%d", what, first, stride);
  int64_t sum = wrank, want = 0;
  for (int i = 0; i < c->size; i++) want += first + i * stride;
  CHECK_OK(c->ops->allreduce_sum(c, &sum, 1, ATTN_COMM_I64));
  CHECK(sum == want, "%s allreduce of world ranks: %lld, want %lld", what, (long long)sum,
        (long long)want);
}

static void test_grid(int tp) {
  int cp = wsize / tp;
  attn_group_t g = NULL;
  CHECK_OK(make_group(&g, tp, cp));
  if (!g) return;
  attn_group_info in;
  CHECK_OK(attn_group_get_info(g, &in));
  CHECK(in.rank == wrank && in.size == wsize && in.tp_size == tp && in.cp_size == cp &&
            in.tp_rank == wrank % tp && in.cp_rank == wrank / tp,
        "tp=%d cp=%d: info rank=%d size=%d tp %d/%d cp %d/%d", tp, cp, in.rank, in.size,
        in.tp_rank, in.tp_size, in.cp_rank, in.cp_size);
  check_members(g->tp, (wrank / tp) * tp, 1, "TP");
  check_members(g->cp, wrank % tp, tp, "CP");
  CHECK_OK(attn__group_steps_reset(g, 3));
  for (int i = 0; i < 3; i++) g->steps[i] = (attn_ring_step){i * 1.0, i * 0.5, 100 * i, i & 1};
  g->nsteps = 3;
  attn_ring_step got[3] = {{0}};
  int32_t count = -1;
  CHECK_OK(attn_group_last_steps(g, got, 2, &count));
  CHECK(count == 3 && got[1].bytes == 100 && got[1].computed == 1 && got[2].bytes == 0,
        "last_steps: count=%d", count);
  CHECK_OK(attn_group_last_steps(g, NULL, 0, &count));
  CHECK(attn_group_last_steps(g, NULL, 2, &count) == ATTN_ERR_INVALID_ARG, "NULL steps, max 2");
  CHECK_OK(attn_group_destroy(g));
}

static void expect_invalid(int tp, int cp, const char *needle) {
  attn_group_t g = (attn_group_t)&dummy_ctx;
  attn_status st = make_group(&g, tp, cp);
  CHECK(st == ATTN_ERR_INVALID_ARG && g == NULL && strstr(attn_last_error(), needle),
        "tp=%d cp=%d: got %s: %s (want '%s')", tp, cp, attn_status_string(st), attn_last_error(),
        needle);
}

static void test_group_errors(void) {
  char needle[128];
  snprintf(needle, sizeof needle, "tp=%d x cp=1 does not match the communicator size %d", wsize + 1, wsize);
  expect_invalid(wsize + 1, 1, needle);
  expect_invalid(0, wsize, "tp=0");
  attn_group_config cfg = ATTN_GROUP_CONFIG_INIT;
  MPI_Comm w = MPI_COMM_WORLD;
  attn_group_t g = NULL;
  CHECK(attn_group_create(&g, NULL, &w, &cfg) == ATTN_ERR_INVALID_ARG, "NULL ctx");
  CHECK(attn_group_create(NULL, &dummy_ctx, &w, &cfg) == ATTN_ERR_INVALID_ARG, "NULL out");
  CHECK(attn_group_create(&g, &dummy_ctx, NULL, &cfg) == ATTN_ERR_INVALID_ARG, "NULL comm");
  cfg.version = 99;
  CHECK(attn_group_create(&g, &dummy_ctx, &w, &cfg) == ATTN_ERR_INVALID_ARG, "version 99");
  cfg.version = ATTN_GROUP_CONFIG_VERSION;
  cfg.timeout_s = -1;
  CHECK(attn_group_create(&g, &dummy_ctx, &w, &cfg) == ATTN_ERR_INVALID_ARG, "timeout -1");
  CHECK_OK(attn_group_destroy(NULL));
  CHECK(attn_group_abort(NULL) == ATTN_ERR_INVALID_ARG, "abort(NULL)");
  if (wsize > 1) { /* the last rank asks for another grid: everyone fails the same way */
    int last = wrank == wsize - 1;
    attn_status st = make_group(&g, last ? 1 : wsize, last ? wsize : 1);
    CHECK(st == ATTN_ERR_MISMATCH && strstr(attn_last_error(), "group tp") && g == NULL,
          "grid mismatch: got %s: %s", attn_status_string(st), attn_last_error());
    CHECK(same_message(attn_last_error()), "ranks hold different grid-mismatch messages");
  }
}

static void test_group_abort(void) {
  attn_group_t g = NULL;
  CHECK_OK(make_group(&g, wsize, 1));
  if (!g) return;
  CHECK_OK(attn_group_abort(g));
  int64_t v = 1;
  attn_status st = g->tp->ops->allreduce_sum(g->tp, &v, 1, ATTN_COMM_I64);
  CHECK(st != ATTN_OK && g->tp->dead && strstr(attn_last_error(), "aborted"),
        "after abort: %s: %s", attn_status_string(st), attn_last_error());
  CHECK_OK(attn_group_destroy(g));
}

/* ---- sequence layout ------------------------------------------------------------------ */
static void check_shards(attn_cp_layout layout, int cp, int64_t seq) {
  int64_t n = layout == ATTN_LAYOUT_ZIGZAG ? 2 * cp : cp, total = 0, lo = seq, hi = 0;
  unsigned char *seen = seq <= 100000 ? calloc((size_t)seq + 1, 1) : NULL;
  for (int r = 0; r < cp; r++) {
    attn_cp_shard s;
    CHECK_OK(attn_cp_shard_rows(layout, cp, r, seq, &s));
    CHECK(s.count == (layout == ATTN_LAYOUT_ZIGZAG ? 2 : 1) && s.rows == s.len[0] + s.len[1],
          "layout=%d cp=%d r=%d: count=%d rows=%lld", layout, cp, r, s.count, (long long)s.rows);
    int64_t chunk[2] = {r, n - 1 - r};
    for (int k = 0; k < s.count; k++) {
      CHECK(s.start[k] == (int64_t)((__int128)chunk[k] * seq / n), "chunk %lld start %lld",
            (long long)chunk[k], (long long)s.start[k]);
      lo = s.len[k] < lo ? s.len[k] : lo;
      hi = s.len[k] > hi ? s.len[k] : hi;
      for (int64_t i = 0; seen && i < s.len[k]; i++) seen[s.start[k] + i]++;
    }
    total += s.rows;
  }
  CHECK(total == seq && hi - lo <= 1, "layout=%d cp=%d seq=%lld: rows %lld, chunk lengths %lld..%lld",
        layout, cp, (long long)seq, (long long)total, (long long)lo, (long long)hi);
  int64_t bad = 0;
  for (int64_t i = 0; seen && i < seq; i++) bad += seen[i] != 1;
  CHECK(bad == 0, "layout=%d cp=%d seq=%lld: %lld rows not covered exactly once", layout, cp,
        (long long)seq, (long long)bad);
  free(seen);
}

static void test_shards(void) {
  const int64_t seqs[] = {0, 1, 2, 5, 7, 8, 63, 64, 65, 4095, 4096, 100003, (int64_t)1 << 40,
                          ((int64_t)1 << 62) + 12345};
  for (int layout = 0; layout < 2; layout++)
    for (int cp = 1; cp <= 6; cp++) {
      for (size_t k = 0; k < sizeof seqs / sizeof *seqs; k++) check_shards(layout, cp, seqs[k]);
      check_shards(layout, cp, 2 * cp - 1);
    }
  attn_cp_shard s = {.rows = 77};
  attn_cp_shard_rows(ATTN_LAYOUT_ZIGZAG, 2, 1, 8, &s); /* zigzag cp=2, rank 1: chunks 1, 2 */
  CHECK(s.start[0] == 2 && s.len[0] == 2 && s.start[1] == 4 && s.len[1] == 2, "zigzag pair");
  CHECK(attn_cp_shard_rows(ATTN_LAYOUT_ZIGZAG, 0, 0, 8, &s) == ATTN_ERR_INVALID_ARG, "cp=0");
  CHECK(attn_cp_shard_rows(ATTN_LAYOUT_ZIGZAG, 2, 2, 8, &s) == ATTN_ERR_INVALID_ARG, "rank=cp");
  CHECK(attn_cp_shard_rows(ATTN_LAYOUT_CONTIGUOUS, 2, -1, 8, &s) == ATTN_ERR_INVALID_ARG, "rank -1");
  CHECK(attn_cp_shard_rows(ATTN_LAYOUT_CONTIGUOUS, 2, 0, -1, &s) == ATTN_ERR_INVALID_ARG, "seq -1");
  CHECK(attn_cp_shard_rows((attn_cp_layout)7, 2, 0, 8, &s) == ATTN_ERR_INVALID_ARG, "layout 7");
  CHECK(attn_cp_shard_rows(ATTN_LAYOUT_ZIGZAG, 2, 0, 8, NULL) == ATTN_ERR_INVALID_ARG, "NULL out");
}

int main(int argc, char **argv) {
  attn_group_t early = NULL;
  CHECK(make_group(&early, 1, 1) == ATTN_ERR_INVALID_ARG && strstr(attn_last_error(), "MPI_Init"),
        "a group before MPI_Init: %s", attn_last_error());
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  attn__comm *c = NULL;
  CHECK_OK(attn__comm_mpi_create(&(MPI_Comm){MPI_COMM_WORLD}, 60, &c));
  if (c) {
    CHECK(c->rank == wrank && c->size == wsize && c->world_ranks[wrank] == wrank &&
              c->world_rank_of0 == 0 && c->timeout_s == 60,
          "comm rank=%d size=%d", c->rank, c->size);
    test_allreduce(c);
    test_allgather(c);
    test_alltoall(c);
    test_exchange(c);
    test_agree(c);
    CHECK_OK(c->ops->destroy(c));
  }
  test_mpi_error();
  for (int tp = 1; tp <= wsize; tp++)
    if (wsize % tp == 0) test_grid(tp);
  test_group_errors();
  test_group_abort();
  if (wrank == 0) test_shards();
  int total = 0;
  MPI_Allreduce(&nfail, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (wrank == 0) printf("test_comm on %d ranks: %s (%d failed checks)\n", wsize, total ? "FAILED" : "OK", total);
  MPI_Finalize();
  return total ? 1 : 0;
}
