/* mpi.c — the MPI transport of comm.h: host buffers over our own duplicate of the caller's
 * communicator (MPI_ERRORS_RETURN set on the duplicate only), every operation
 * non-blocking and completed by a timed test loop — the watchdog that turns a dead or
 * stalled peer into ATTN_ERR_TIMEOUT naming it, instead of a hang.
 *
 * Collectives work on a staging copy of the caller's buffers, so one abandoned at a
 * timeout cannot write into them when a late rank arrives.
 *
 * Allreduce determinism: the sum is posted in place (MPI_IN_PLACE). Open MPI's libnbc
 * runs every in-place MPI_Iallreduce as a binomial reduce to one rank followed by a
 * broadcast, and its other schedules (ring, reduce-scatter + allgather) also reduce each
 * element on one rank and copy it out, so all ranks get the same bits;
 * tests/mpi/test_comm.c checks this with random floats on 1-4 ranks.
 *
 * Large messages travel in pieces of at most ATTN_COMM_CHUNK bytes (default 1 GiB), so no
 * MPI count exceeds INT_MAX. */
#include "comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_EXCH = 7101, TAG_DIAG = 7102 };

/* One exchange in flight: receive pieces first, then send pieces. */
struct attn__comm_req {
  attn__comm_req *next; /* the communicator's list of started, unwaited exchanges */
  int to, from;
  int64_t sbytes, rbytes;
  int nrecv, nsend;
  MPI_Request reqs[]; /* [nrecv + nsend] */
};

typedef struct {
  MPI_Comm comm;
  int64_t chunk;          /* largest piece of one message, in bytes */
  int64_t nallreduce;     /* allreduce calls so far: the fault-injection step */
  int64_t ncoll;          /* collective calls so far: matched in timeout diagnosis */
  attn__comm_req *pending; /* exchanges started and not yet waited */
  void *stage;             /* collectives run on this copy; abandoned if one times out */
  size_t stage_cap;
  attn_status dead_status; /* what made the communicator unusable */
  char why[512];
} mpi_impl;

static const attn__comm_ops mpi_ops;

/* ---- small helpers ----------------------------------------------------------------- */
static mpi_impl *impl_of(attn__comm *c) { return (mpi_impl *)c->impl; }

static int my_world_rank(const attn__comm *c) { return c->world_ranks[c->rank]; }

static void mark_dead(attn__comm *c, attn_status status, const char *why) {
  mpi_impl *m = impl_of(c);
  if (c->dead) return; /* keep the first reason */
  c->dead = 1;
  m->dead_status = status;
  snprintf(m->why, sizeof m->why, "%s", why);
}

static attn_status dead_fail(attn__comm *c, const char *what) {
  mpi_impl *m = impl_of(c);
  return attn__fail(m->dead_status,
                    "%s on world rank %d: the communicator is no longer usable (%s); "
                    "destroy the group and end the job or create a new one",
                    what, my_world_rank(c), m->why);
}

/* An MPI error code becomes ATTN_ERR_MPI naming the call and MPI's own text. */
static attn_status mpi_fail(attn__comm *c, int err, const char *what) {
  char text[MPI_MAX_ERROR_STRING + 1] = "";
  int len = 0;
  MPI_Error_string(err, text, &len);
  attn_status st = attn__fail(ATTN_ERR_MPI, "%s failed on world rank %d: %s", what,
                              c ? my_world_rank(c) : -1, text);
  if (c) mark_dead(c, ATTN_ERR_MPI, attn_last_error());
  return st;
}

static attn_status type_info(attn__comm_type type, MPI_Datatype *dt, size_t *bytes) {
  switch (type) {
    case ATTN_COMM_F32: *dt = MPI_FLOAT; *bytes = 4; return ATTN_OK;
    case ATTN_COMM_F64: *dt = MPI_DOUBLE; *bytes = 8; return ATTN_OK;
    case ATTN_COMM_I64: *dt = MPI_INT64_T; *bytes = 8; return ATTN_OK;
  }
  return attn__fail(ATTN_ERR_INVALID_ARG, "comm type=%d is not f32 (0), f64 (1) or i64 (2)",
                    (int)type);
}

/* Pieces a message of `bytes` travels in (a zero-byte message is one empty piece). */
static int64_t piece_count(const mpi_impl *m, int64_t bytes) {
  return bytes <= m->chunk ? 1 : (bytes + m->chunk - 1) / m->chunk;
}

/* A datatype describing `bytes` contiguous bytes with counts that fit an int: MPI_BYTE
 * x bytes when small, else one element of a committed struct type (*owned = 1). */
static int bytes_type(int64_t bytes, int64_t chunk, MPI_Datatype *dt, int *count, int *owned) {
  *owned = 0;
  if (bytes <= chunk && bytes <= INT_MAX) {
    *dt = MPI_BYTE;
    *count = (int)bytes;
    return MPI_SUCCESS;
  }
  int64_t q = bytes / chunk, rem = bytes % chunk;
  MPI_Datatype piece, pieces;
  int e = MPI_Type_contiguous((int)chunk, MPI_BYTE, &piece);
  if (e == MPI_SUCCESS) e = MPI_Type_contiguous((int)q, piece, &pieces);
  if (e != MPI_SUCCESS) return e;
  int lens[2] = {1, (int)rem};
  MPI_Aint displs[2] = {0, (MPI_Aint)(q * chunk)};
  MPI_Datatype types[2] = {pieces, MPI_BYTE};
  e = MPI_Type_create_struct(rem ? 2 : 1, lens, displs, types, dt);
  if (e == MPI_SUCCESS) e = MPI_Type_commit(dt);
  MPI_Type_free(&pieces);
  MPI_Type_free(&piece);
  *count = 1;
  *owned = e == MPI_SUCCESS;
  return e;
}

/* First real error code behind MPI_ERR_IN_STATUS. */
static int status_error(int err, int n, const MPI_Status *st) {
  if (err != MPI_ERR_IN_STATUS) return err;
  for (int i = 0; i < n; i++)
    if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING)
      return st[i].MPI_ERROR;
  return err;
}

enum { WAIT_DONE = 0, WAIT_TIMEOUT = 1, WAIT_ERROR = 2 };

/* Tests reqs until all complete, an MPI error (*err) or the deadline. */
static int test_until(int n, MPI_Request *reqs, double deadline, int *err) {
  MPI_Status *st = calloc(n > 0 ? (size_t)n : 1, sizeof *st);
  attn__backoff b = ATTN__BACKOFF_INIT;
  int result = WAIT_TIMEOUT;
  for (;;) {
    int flag = 0;
    int e = st ? MPI_Testall(n, reqs, &flag, st) : MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
    if (e != MPI_SUCCESS) {
      *err = st ? status_error(e, n, st) : e;
      result = WAIT_ERROR;
      break;
    }
    if (flag) {
      result = WAIT_DONE;
      break;
    }
    if (attn__now_s() >= deadline) break;
    attn__backoff_wait(&b);
  }
  free(st);
  return result;
}

/* Cancels and releases point-to-point requests (collective ones cannot be cancelled). */
static void cancel_free(int n, MPI_Request *reqs) {
  for (int i = 0; i < n; i++) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&reqs[i]);
    MPI_Request_free(&reqs[i]);
  }
}

/* ---- timeout diagnosis ---------------------------------------------------------------- */
/* After a collective timed out: every rank that is also stuck tells every other which
 * collective it waits in; ranks not heard from within a grace period are named. Only runs
 * on a communicator about to be marked dead, so stray messages do no harm. */
typedef struct {
  int *silent, nsilent;    /* world ranks not heard from */
  int *elsewhere, nelsewhere; /* world ranks waiting in another collective */
} diagnosis;

static void diag_collect(attn__comm *c, int64_t seq, const int64_t *got, const int *heard,
                         diagnosis *d) {
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank) continue;
    if (!heard[r]) d->silent[d->nsilent++] = c->world_ranks[r];
    else if (got[r] != seq) d->elsewhere[d->nelsewhere++] = c->world_ranks[r];
  }
}

static void diag_exchange(attn__comm *c, int64_t seq, diagnosis *d) {
  mpi_impl *m = impl_of(c);
  int n = c->size;
  int64_t *got = calloc((size_t)n, sizeof *got);
  int *heard = calloc((size_t)n, sizeof *heard);
  MPI_Request *rq = malloc(2 * (size_t)n * sizeof *rq);
  if (!got || !heard || !rq) goto out;
  for (int r = 0; r < 2 * n; r++) rq[r] = MPI_REQUEST_NULL;
  for (int r = 0; r < n; r++) {
    if (r == c->rank) continue;
    MPI_Irecv(&got[r], 1, MPI_INT64_T, r, TAG_DIAG, m->comm, &rq[r]);
    MPI_Isend(&seq, 1, MPI_INT64_T, r, TAG_DIAG, m->comm, &rq[n + r]);
  }
  double grace = c->timeout_s / 4 < 0.5 ? 0.5 : c->timeout_s / 4 > 5 ? 5 : c->timeout_s / 4;
  double deadline = attn__now_s() + grace;
  attn__backoff b = ATTN__BACKOFF_INIT;
  for (int left = n - 1; left > 0 && attn__now_s() < deadline; attn__backoff_wait(&b)) {
    for (int r = 0; r < n; r++) {
      int flag = 0;
      if (r == c->rank || heard[r] || rq[r] == MPI_REQUEST_NULL) continue;
      if (MPI_Test(&rq[r], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) heard[r] = 1, left--;
    }
  }
  diag_collect(c, seq, got, heard, d);
  cancel_free(2 * n, rq);
out:
  free(rq);
  free(heard);
  free(got);
}

/* "world rank 3 did not reach it" and the like, into out. */
static void diagnose(attn__comm *c, int64_t seq, char *out, size_t cap) {
  diagnosis d = {calloc((size_t)c->size, sizeof(int)), 0, calloc((size_t)c->size, sizeof(int)), 0};
  out[0] = '\0';
  if (!d.silent || !d.elsewhere) goto out;
  diag_exchange(c, seq, &d);
  char a[256] = "", b[256] = "";
  attn__rank_list(a, sizeof a, d.silent, d.nsilent);
  attn__rank_list(b, sizeof b, d.elsewhere, d.nelsewhere);
  const char *are = d.nelsewhere == 1 ? "is" : "are";
  if (d.nsilent && d.nelsewhere)
    snprintf(out, cap, "world %s did not answer; world %s %s waiting in another collective", a, b,
             are);
  else if (d.nsilent)
    snprintf(out, cap, "world %s did not answer (not in this call, dead or stuck)", a);
  else if (d.nelsewhere)
    snprintf(out, cap, "world %s %s waiting in another collective (the ranks' calls diverged)",
             b, are);
  else
    snprintf(out, cap, "every rank answered late (a rank arrived after the others gave up)");
out:
  free(d.silent);
  free(d.elsewhere);
}

/* Completes collective requests within the timeout. On expiry the requests are left to
 * MPI (a collective cannot be cancelled), the communicator is marked dead, and the
 * message names the ranks that did not answer. */
static attn_status coll_wait(attn__comm *c, int n, MPI_Request *reqs, const char *what,
                             int64_t seq) {
  int err = MPI_SUCCESS;
  int r = test_until(n, reqs, attn__now_s() + c->timeout_s, &err);
  if (r == WAIT_DONE) return ATTN_OK;
  if (r == WAIT_ERROR) return mpi_fail(c, err, what);
  /* The collective stays with MPI and may still complete when a late rank arrives: it
   * owns the staging buffer from now on (never freed), so it cannot write into the
   * caller's memory. */
  impl_of(c)->stage = NULL;
  impl_of(c)->stage_cap = 0;
  char who[600];
  diagnose(c, seq, who, sizeof who);
  attn_status st = attn__fail(ATTN_ERR_TIMEOUT,
                              "%s (collective #%lld on a %d-rank communicator) timed out after "
                              "%g s on world rank %d: %s; raise ATTN_TIMEOUT if the peers are "
                              "only slow",
                              what, (long long)seq, c->size, c->timeout_s, my_world_rank(c), who);
  mark_dead(c, ATTN_ERR_TIMEOUT, attn_last_error());
  return st;
}

/* ---- collectives -------------------------------------------------------------------- */
/* Collectives run on a staging copy of the caller's buffers, so a collective abandoned at
 * a timeout never touches them later. The copies are cheap next to the attention that
 * surrounds every collective. */
static attn_status stage_get(attn__comm *c, size_t bytes, char **out) {
  mpi_impl *m = impl_of(c);
  if (bytes > m->stage_cap) {
    void *p = realloc(m->stage, bytes);
    if (!p) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "staging buffer of %zu bytes", bytes);
    m->stage = p;
    m->stage_cap = bytes;
  }
  *out = m->stage;
  return ATTN_OK;
}

static attn_status allreduce_pieces(attn__comm *c, char *buf, int64_t count, MPI_Datatype dt,
                                    size_t es, int64_t seq) {
  mpi_impl *m = impl_of(c);
  int64_t per = m->chunk / (int64_t)es < 1 ? 1 : m->chunk / (int64_t)es;
  int64_t n = (count + per - 1) / per;
  MPI_Request *reqs = malloc((size_t)n * sizeof *reqs);
  if (!reqs) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "allreduce: %lld requests", (long long)n);
  for (int64_t i = 0; i < n; i++) {
    int64_t len = count - i * per < per ? count - i * per : per;
    int e = MPI_Iallreduce(MPI_IN_PLACE, buf + i * per * (int64_t)es, (int)len, dt, MPI_SUM,
                           m->comm, &reqs[i]);
    if (e != MPI_SUCCESS) {
      free(reqs); /* pieces already posted stay with MPI; the communicator is dead */
      m->stage = NULL;
      m->stage_cap = 0;
      return mpi_fail(c, e, "MPI_Iallreduce");
    }
  }
  attn_status st = coll_wait(c, (int)n, reqs, "allreduce", seq);
  free(reqs);
  return st;
}

static attn_status mpi_allreduce_sum(attn__comm *c, void *buf, int64_t count,
                                     attn__comm_type type) {
  mpi_impl *m = impl_of(c);
  attn__fault_point("allreduce", (int)m->nallreduce++);
  if (c->dead) return dead_fail(c, "allreduce");
  MPI_Datatype dt = MPI_DATATYPE_NULL;
  size_t es = 1;
  ATTN_CHECK(type_info(type, &dt, &es));
  if (count < 0 || (count > 0 && !buf))
    return attn__fail(ATTN_ERR_INVALID_ARG, "allreduce: count=%lld buf=%p is not valid",
                      (long long)count, buf);
  int64_t seq = m->ncoll++;
  if (count == 0 || c->size == 1) return ATTN_OK;
  char *stage = NULL;
  ATTN_CHECK(stage_get(c, (size_t)count * es, &stage));
  memcpy(stage, buf, (size_t)count * es);
  ATTN_CHECK(allreduce_pieces(c, stage, count, dt, es, seq));
  memcpy(buf, stage, (size_t)count * es);
  return ATTN_OK;
}

typedef enum { COLL_ALLGATHER, COLL_ALLTOALL } coll_kind;

/* Posts allgather / alltoall of `bytes` per rank between staged send and recv regions. */
static int bytes_post(attn__comm *c, coll_kind kind, const char *send, char *recv,
                      int64_t bytes, MPI_Request *req) {
  mpi_impl *m = impl_of(c);
  MPI_Datatype dt;
  int count, owned;
  int e = bytes_type(bytes, m->chunk, &dt, &count, &owned);
  if (e != MPI_SUCCESS) return e;
  if (kind == COLL_ALLGATHER)
    e = MPI_Iallgather(send, count, dt, recv, count, dt, m->comm, req);
  else
    e = MPI_Ialltoall(send, count, dt, recv, count, dt, m->comm, req);
  if (owned) MPI_Type_free(&dt); /* released once the pending operation is done with it */
  return e;
}

static attn_status bytes_collective(attn__comm *c, coll_kind kind, const void *send, void *recv,
                                    int64_t bytes) {
  mpi_impl *m = impl_of(c);
  const char *what = kind == COLL_ALLGATHER ? "allgather" : "alltoall";
  if (c->dead) return dead_fail(c, what);
  if (bytes < 0 || (bytes > 0 && (!send || !recv)))
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s: bytes=%lld send=%p recv=%p is not valid", what,
                      (long long)bytes, send, recv);
  int64_t seq = m->ncoll++;
  if (bytes == 0) return ATTN_OK;
  if (c->size == 1) {
    memmove(recv, send, (size_t)bytes);
    return ATTN_OK;
  }
  size_t sb = (size_t)bytes * (kind == COLL_ALLGATHER ? 1 : (size_t)c->size);
  size_t rb = (size_t)bytes * (size_t)c->size;
  char *stage = NULL;
  ATTN_CHECK(stage_get(c, sb + rb, &stage));
  memcpy(stage, send, sb); /* send may lie inside recv (in place): copy it first */
  MPI_Request req = MPI_REQUEST_NULL;
  int e = bytes_post(c, kind, stage, stage + sb, bytes, &req);
  if (e != MPI_SUCCESS)
    return mpi_fail(c, e, kind == COLL_ALLGATHER ? "MPI_Iallgather" : "MPI_Ialltoall");
  ATTN_CHECK(coll_wait(c, 1, &req, what, seq));
  memcpy(recv, stage + sb, rb);
  return ATTN_OK;
}

static attn_status mpi_allgather(attn__comm *c, const void *send, void *recv, int64_t bytes) {
  return bytes_collective(c, COLL_ALLGATHER, send, recv, bytes);
}

static attn_status mpi_alltoall(attn__comm *c, const void *send, void *recv, int64_t bytes) {
  return bytes_collective(c, COLL_ALLTOALL, send, recv, bytes);
}

/* ---- the ring step ---------------------------------------------------------------- */
static void pending_unlink(mpi_impl *m, attn__comm_req *req) {
  for (attn__comm_req **p = &m->pending; *p; p = &(*p)->next)
    if (*p == req) {
      *p = req->next;
      return;
    }
}

/* Posts the pieces of one direction: receive (dir 0) or send (dir 1). */
static int post_pieces(mpi_impl *m, attn__comm_req *req, int dir, void *buf, int64_t bytes,
                       int peer) {
  int n = dir == 0 ? req->nrecv : req->nsend;
  MPI_Request *r = req->reqs + (dir == 0 ? 0 : req->nrecv);
  for (int i = 0; i < n; i++) {
    int64_t off = (int64_t)i * m->chunk;
    int len = (int)(bytes - off < m->chunk ? bytes - off : m->chunk);
    int e = dir == 0 ? MPI_Irecv((char *)buf + off, len, MPI_BYTE, peer, TAG_EXCH, m->comm, &r[i])
                     : MPI_Isend((char *)buf + off, len, MPI_BYTE, peer, TAG_EXCH, m->comm, &r[i]);
    if (e != MPI_SUCCESS) return e;
  }
  return MPI_SUCCESS;
}

static attn_status exchange_check(attn__comm *c, const void *sbuf, int64_t sbytes, int to,
                                  void *rbuf, int64_t rbytes, int from, attn__comm_req **req) {
  if (!req) return attn__fail(ATTN_ERR_INVALID_ARG, "exchange: req (attn__comm_req **) is NULL");
  if (to >= c->size || from >= c->size)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "exchange: to=%d from=%d on a %d-rank communicator (use -1 to skip)", to,
                      from, c->size);
  if ((to >= 0 && (sbytes < 0 || (sbytes > 0 && !sbuf))) ||
      (from >= 0 && (rbytes < 0 || (rbytes > 0 && !rbuf))))
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "exchange: sbuf=%p sbytes=%lld rbuf=%p rbytes=%lld is not valid", sbuf,
                      (long long)sbytes, rbuf, (long long)rbytes);
  return ATTN_OK;
}

static attn_status mpi_exchange_start(attn__comm *c, const void *sbuf, int64_t sbytes, int to,
                                      void *rbuf, int64_t rbytes, int from,
                                      attn__comm_req **req) {
  mpi_impl *m = impl_of(c);
  if (req) *req = NULL;
  if (c->dead) return dead_fail(c, "exchange");
  ATTN_CHECK(exchange_check(c, sbuf, sbytes, to, rbuf, rbytes, from, req));
  int64_t nr = from >= 0 ? piece_count(m, rbytes) : 0, ns = to >= 0 ? piece_count(m, sbytes) : 0;
  if (nr + ns > INT_MAX / 2)
    return attn__fail(ATTN_ERR_INVALID_ARG, "exchange: %lld pieces; raise ATTN_COMM_CHUNK",
                      (long long)(nr + ns));
  attn__comm_req *q = malloc(sizeof *q + (size_t)(nr + ns) * sizeof(MPI_Request));
  if (!q) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "exchange: request allocation failed");
  q->next = NULL;
  q->to = to;
  q->from = from;
  q->sbytes = sbytes;
  q->rbytes = rbytes;
  q->nrecv = (int)nr;
  q->nsend = (int)ns;
  for (int64_t i = 0; i < nr + ns; i++) q->reqs[i] = MPI_REQUEST_NULL;
  int e = post_pieces(m, q, 0, rbuf, rbytes, from);
  if (e == MPI_SUCCESS) e = post_pieces(m, q, 1, (void *)sbuf, sbytes, to);
  if (e != MPI_SUCCESS) {
    cancel_free(q->nrecv + q->nsend, q->reqs);
    free(q);
    return mpi_fail(c, e, "exchange: MPI_Isend/MPI_Irecv");
  }
  q->next = m->pending;
  m->pending = q;
  *req = q;
  return ATTN_OK;
}

/* After a timeout: which directions are still incomplete, as a message. */
static void exchange_who(attn__comm *c, attn__comm_req *q, char *out, size_t cap) {
  int recv_open = 0, send_open = 0;
  for (int i = 0; i < q->nrecv + q->nsend; i++) {
    int flag = 1;
    if (q->reqs[i] != MPI_REQUEST_NULL) MPI_Test(&q->reqs[i], &flag, MPI_STATUS_IGNORE);
    if (!flag) *(i < q->nrecv ? &recv_open : &send_open) = 1;
  }
  int n = 0;
  out[0] = '\0';
  if (recv_open)
    n += snprintf(out, cap, "no data from world rank %d (receive of %lld bytes pending)",
                  c->world_ranks[q->from], (long long)q->rbytes);
  if (send_open && (size_t)n < cap)
    snprintf(out + n, cap - (size_t)n, "%sworld rank %d did not take the %lld bytes sent to it",
             recv_open ? "; " : "", c->world_ranks[q->to], (long long)q->sbytes);
}

static attn_status mpi_exchange_wait(attn__comm *c, attn__comm_req *q) {
  mpi_impl *m = impl_of(c);
  if (!q) return attn__fail(ATTN_ERR_INVALID_ARG, "exchange_wait: req is NULL");
  pending_unlink(m, q);
  int n = q->nrecv + q->nsend, err = MPI_SUCCESS;
  attn_status st = ATTN_OK;
  int r = c->dead ? WAIT_ERROR : test_until(n, q->reqs, attn__now_s() + c->timeout_s, &err);
  if (c->dead) {
    st = dead_fail(c, "exchange");
  } else if (r == WAIT_ERROR) {
    st = mpi_fail(c, err, "exchange (MPI_Isend/MPI_Irecv)");
  } else if (r == WAIT_TIMEOUT) {
    char who[400];
    exchange_who(c, q, who, sizeof who);
    st = attn__fail(ATTN_ERR_TIMEOUT,
                    "ring exchange timed out after %g s on world rank %d: %s; raise "
                    "ATTN_TIMEOUT if the peer is only slow",
                    c->timeout_s, my_world_rank(c), who);
    mark_dead(c, ATTN_ERR_TIMEOUT, attn_last_error());
  }
  cancel_free(n, q->reqs);
  free(q);
  return st;
}

/* ---- lifetime ------------------------------------------------------------------------ */
static attn_status mpi_abort(attn__comm *c, const char *why) {
  if (!c) return ATTN_OK;
  mark_dead(c, ATTN_ERR_MPI, why && *why ? why : "aborted");
  for (attn__comm_req *q = impl_of(c)->pending; q; q = q->next)
    cancel_free(q->nrecv + q->nsend, q->reqs);
  return ATTN_OK;
}

static attn_status mpi_destroy(attn__comm *c) {
  if (!c) return ATTN_OK;
  mpi_impl *m = impl_of(c);
  int finalized = 0;
  MPI_Finalized(&finalized);
  while (m->pending) {
    attn__comm_req *q = m->pending;
    m->pending = q->next;
    if (!finalized) cancel_free(q->nrecv + q->nsend, q->reqs);
    free(q);
  }
  /* A dead communicator may still have collectives in flight that MPI cannot cancel; it
   * is left to MPI rather than freed under them. */
  if (!finalized && !c->dead) MPI_Comm_free(&m->comm);
  free(m->stage);
  free(c->world_ranks);
  free(m);
  free(c);
  return ATTN_OK;
}

/* World rank of each member (-1 where the member is not in MPI_COMM_WORLD). */
static int world_ranks_of(MPI_Comm comm, int size, int *out) {
  MPI_Group g, wg;
  int e = MPI_Comm_group(comm, &g);
  if (e != MPI_SUCCESS) return e;
  e = MPI_Comm_group(MPI_COMM_WORLD, &wg);
  if (e == MPI_SUCCESS) {
    int *ranks = malloc((size_t)size * sizeof *ranks);
    for (int i = 0; ranks && i < size; i++) ranks[i] = i;
    e = ranks ? MPI_Group_translate_ranks(g, size, ranks, wg, out) : MPI_ERR_NO_MEM;
    for (int i = 0; e == MPI_SUCCESS && i < size; i++)
      if (out[i] == MPI_UNDEFINED) out[i] = -1;
    free(ranks);
    MPI_Group_free(&wg);
  }
  MPI_Group_free(&g);
  return e;
}

/* Takes ownership of comm (ours: errors return, never abort) and wraps it. */
static attn_status wrap(MPI_Comm comm, double timeout_s, int64_t chunk, attn__comm **out) {
  attn__comm *c = calloc(1, sizeof *c);
  mpi_impl *m = calloc(1, sizeof *m);
  int e = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (c && m && e == MPI_SUCCESS) {
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    c->world_ranks = malloc((size_t)c->size * sizeof(int));
    e = c->world_ranks ? world_ranks_of(comm, c->size, c->world_ranks) : MPI_ERR_NO_MEM;
  }
  if (!c || !m || e != MPI_SUCCESS) {
    attn_status st = !c || !m || e == MPI_ERR_NO_MEM
                         ? attn__fail(ATTN_ERR_OUT_OF_MEMORY, "communicator allocation failed")
                         : mpi_fail(NULL, e, "MPI_Comm_set_errhandler/MPI_Comm_group");
    if (c) free(c->world_ranks);
    free(c);
    free(m);
    MPI_Comm_free(&comm);
    return st;
  }
  m->comm = comm;
  m->chunk = chunk;
  c->ops = &mpi_ops;
  c->timeout_s = timeout_s;
  c->world_rank_of0 = c->world_ranks[0];
  c->impl = m;
  *out = c;
  return ATTN_OK;
}

static attn_status mpi_split(attn__comm *c, int color, int key, attn__comm **out) {
  mpi_impl *m = impl_of(c);
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "split: out (attn__comm **) is NULL");
  *out = NULL;
  if (c->dead) return dead_fail(c, "split");
  if (color < 0) return attn__fail(ATTN_ERR_INVALID_ARG, "split: color=%d must be >= 0", color);
  /* A timed allgather first, so a missing rank times out here instead of hanging in the
   * blocking MPI_Comm_split below. */
  int mine[2] = {color, key};
  int *all = malloc((size_t)c->size * sizeof mine);
  if (!all) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "split: allocation failed");
  attn_status st = mpi_allgather(c, mine, all, sizeof mine);
  free(all);
  ATTN_CHECK(st);
  MPI_Comm nc;
  int e = MPI_Comm_split(m->comm, color, key, &nc);
  if (e != MPI_SUCCESS) return mpi_fail(c, e, "MPI_Comm_split");
  return wrap(nc, c->timeout_s, m->chunk, out);
}

static const attn__comm_ops mpi_ops = {
    .name = "mpi",
    .split = mpi_split,
    .destroy = mpi_destroy,
    .allreduce_sum = mpi_allreduce_sum,
    .allgather = mpi_allgather,
    .alltoall = mpi_alltoall,
    .exchange_start = mpi_exchange_start,
    .exchange_wait = mpi_exchange_wait,
    .abort = mpi_abort,
};

static double resolve_timeout(double timeout_s) {
  if (timeout_s > 0) return timeout_s;
  int64_t t = ATTN_PARAM("TIMEOUT", 300);
  if (t > 0) return (double)t;
  attn__log(ATTN_LOG_WARN, "ATTN_TIMEOUT=%lld must be > 0 seconds; using 300", (long long)t);
  return 300;
}

static int64_t resolve_chunk(void) {
  int64_t chunk = ATTN_PARAM("COMM_CHUNK", (int64_t)1 << 30);
  if (chunk >= 8 && chunk <= INT_MAX) return chunk;
  attn__log(ATTN_LOG_WARN, "ATTN_COMM_CHUNK=%lld must be in [8, INT_MAX] bytes; using 1 GiB",
            (long long)chunk);
  return (int64_t)1 << 30;
}

attn_status attn__comm_mpi_create(const void *mpi_comm, double timeout_s, attn__comm **out) {
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn__comm **) is NULL");
  *out = NULL;
  if (!mpi_comm) return attn__fail(ATTN_ERR_INVALID_ARG, "mpi_comm (MPI_Comm *) is NULL");
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return attn__fail(ATTN_ERR_INVALID_ARG, "MPI is %s; call MPI_Init before creating a group",
                      fin ? "already finalized" : "not initialised");
  timeout_s = resolve_timeout(timeout_s);
  /* Non-blocking duplicate, so a rank that never arrives times out here too. Errors in
   * this one call go to the caller's handler: theirs is the communicator. */
  MPI_Comm dup;
  MPI_Request req;
  MPI_Comm_idup(*(const MPI_Comm *)mpi_comm, &dup, &req);
  int err = MPI_SUCCESS;
  int r = test_until(1, &req, attn__now_s() + timeout_s, &err);
  if (r == WAIT_ERROR) return mpi_fail(NULL, err, "MPI_Comm_idup");
  if (r == WAIT_TIMEOUT)
    return attn__fail(ATTN_ERR_TIMEOUT,
                      "duplicating the communicator timed out after %g s: not every rank "
                      "called attn_group_create (or one is stuck); raise ATTN_TIMEOUT if they "
                      "are only slow",
                      timeout_s);
  return wrap(dup, timeout_s, resolve_chunk(), out);
}
