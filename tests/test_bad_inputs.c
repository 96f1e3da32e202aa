/* test_bad_inputs.c — every bad argument returns its status with an attn_last_error()
 * message naming the argument, and nothing is written (outputs keep their poison);
 * limits: huge shapes rejected before any access, offsets past 2^31 elements computed
 * correctly (a sparse 16 GiB mapping), attn_ctx_destroy(NULL). */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "test_case.h"

static attn_ctx_t ctx;

/* A valid problem: B=1, Sq=5, Skv=6, Hq=2, Hkv=1, D=8, with sinks. */
typedef struct {
  attn_spec spec;
  attn_tensor q, k, v, o, dout, dq, dk, dv;
  float *lse, *dsinks;
  int32_t cu_q[3], cu_kv[3];
  attn_block_mask bm;
  uint8_t mask[4];
} fixture;

static float qb[80], kb[48], vb[48], ob[80], dob[80], dqb[80], dkb[48], dvb[48], lseb[10],
    dsb[2], sinks[2] = {0.1f, -0.3f};

static fixture make_fixture(void) {
  fixture f;
  memset(&f, 0, sizeof f);
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = 2;
  s.num_heads_kv = 1;
  s.head_dim_qk = 8;
  s.sinks = sinks;
  f.spec = s;
  tu_fill(qb, 80, -1, 1, 1);
  tu_fill(kb, 48, -1, 1, 2);
  tu_fill(vb, 48, -1, 1, 3);
  tu_fill(dob, 80, -1, 1, 4);
  f.q = attn_tensor_f32(qb, 1, 5, 2, 8);
  f.k = attn_tensor_f32(kb, 1, 6, 1, 8);
  f.v = attn_tensor_f32(vb, 1, 6, 1, 8);
  f.o = attn_tensor_f32(ob, 1, 5, 2, 8);
  f.dout = attn_tensor_f32(dob, 1, 5, 2, 8);
  f.dq = attn_tensor_f32(dqb, 1, 5, 2, 8);
  f.dk = attn_tensor_f32(dkb, 1, 6, 1, 8);
  f.dv = attn_tensor_f32(dvb, 1, 6, 1, 8);
  f.lse = lseb;
  f.dsinks = dsb;
  return f;
}

static void poison_all(void) {
  tu_poison(ob, 80);
  tu_poison(lseb, 10);
  tu_poison(dqb, 80);
  tu_poison(dkb, 48);
  tu_poison(dvb, 48);
  tu_poison(dsb, 2);
}

static int all_poisoned(void) {
  return tu_count_poison(ob, 80) == 80 && tu_count_poison(lseb, 10) == 10 &&
         tu_count_poison(dqb, 80) == 80 && tu_count_poison(dkb, 48) == 48 &&
         tu_count_poison(dvb, 48) == 48 && tu_count_poison(dsb, 2) == 2;
}

static int contains_ci(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
    if (i == n) return 1;
  }
  return 0;
}

/* st must be one of want[] (ATTN_OK-terminated list of up to 2) and the message must
 * contain one of the '|'-separated needles. */
static void expect(const char *what, attn_status st, attn_status want, attn_status alt,
                   const char *needles) {
  const char *msg = attn_last_error();
  TU_CHECK(st == want || (alt != ATTN_OK && st == alt), "%s: got %s, expected %s (msg: %s)",
           what, attn_status_string(st), attn_status_string(want), msg);
  int named = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", needles);
  for (char *tok = strtok(buf, "|"); tok && !named; tok = strtok(NULL, "|"))
    named = contains_ci(msg, tok);
  TU_CHECK(named, "%s: message \"%s\" does not name %s", what, msg, needles);
}

static attn_status run_fwd(fixture *f, attn_ctx_t c, int spec_null) {
  poison_all();
  attn_status st = attn_fwd(c, spec_null ? NULL : &f->spec, &f->q, &f->k, &f->v, &f->o, f->lse);
  return st;
}

static attn_status run_bwd(fixture *f) {
  poison_all();
  return attn_bwd(ctx, &f->spec, &f->q, &f->k, &f->v, &f->o, f->lse, &f->dout, &f->dq, &f->dk,
                  &f->dv, f->dsinks);
}

/* Forward with one change applied by `mutate`; expects status and a named argument. */
#define BAD_FWD(label, want, alt, needles, ...)                                   \
  do {                                                                            \
    fixture f = make_fixture();                                                   \
    __VA_ARGS__;                                                                  \
    expect("fwd " label, run_fwd(&f, ctx, 0), want, alt, needles);                \
    TU_CHECK(all_poisoned(), "fwd %s wrote to its outputs", label);               \
  } while (0)

#define BAD_BWD(label, want, alt, needles, ...)                                   \
  do {                                                                            \
    fixture f = make_fixture();                                                   \
    __VA_ARGS__;                                                                  \
    expect("bwd " label, run_bwd(&f), want, alt, needles);                        \
    TU_CHECK(all_poisoned(), "bwd %s wrote to its outputs", label);               \
  } while (0)

#define INV ATTN_ERR_INVALID_ARG
#define UNS ATTN_ERR_UNSUPPORTED
#define NONE ATTN_OK

static void bad_forward(void) {
  fixture ok = make_fixture();
  TU_CHECK(run_fwd(&ok, ctx, 0) == ATTN_OK, "the valid fixture fails: %s", attn_last_error());
  poison_all();
  expect("fwd ctx NULL", run_fwd(&ok, NULL, 0), INV, NONE, "ctx");
  TU_CHECK(all_poisoned(), "fwd ctx NULL wrote");
  expect("fwd spec NULL", run_fwd(&ok, ctx, 1), INV, NONE, "spec");
  TU_CHECK(all_poisoned(), "fwd spec NULL wrote");
  poison_all();
  expect("fwd q NULL", attn_fwd(ctx, &ok.spec, NULL, &ok.k, &ok.v, &ok.o, ok.lse), INV, NONE, "q");
  expect("fwd k NULL", attn_fwd(ctx, &ok.spec, &ok.q, NULL, &ok.v, &ok.o, ok.lse), INV, NONE, "k");
  expect("fwd v NULL", attn_fwd(ctx, &ok.spec, &ok.q, &ok.k, NULL, &ok.o, ok.lse), INV, NONE, "v");
  expect("fwd o NULL", attn_fwd(ctx, &ok.spec, &ok.q, &ok.k, &ok.v, NULL, ok.lse), INV, NONE, "o");
  TU_CHECK(all_poisoned(), "fwd NULL tensors wrote");
  BAD_FWD("q data NULL", INV, NONE, "q", f.q.data = NULL);
  BAD_FWD("o data NULL", INV, NONE, "o", f.o.data = NULL);
  BAD_FWD("Hq 0", INV, NONE, "num_heads_q", f.spec.num_heads_q = 0);
  BAD_FWD("Hq -2", INV, NONE, "num_heads_q", f.spec.num_heads_q = -2);
  BAD_FWD("Hkv 0", INV, NONE, "num_heads_kv", f.spec.num_heads_kv = 0);
  BAD_FWD("Hq % Hkv", INV, NONE, "num_heads", f.spec.num_heads_q = 3; f.spec.num_heads_kv = 2);
  BAD_FWD("Hkv > Hq", INV, NONE, "num_heads", f.spec.num_heads_kv = 4);
  BAD_FWD("head_dim 0", INV, UNS, "head_dim_qk", f.spec.head_dim_qk = 0);
  BAD_FWD("head_dim -8", INV, UNS, "head_dim_qk", f.spec.head_dim_qk = -8);
  BAD_FWD("head_dim 300", UNS, NONE, "head_dim_qk", f.spec.head_dim_qk = 300);
  BAD_FWD("head_dim_v 300", UNS, NONE, "head_dim_v", f.spec.head_dim_v = 300);
  BAD_FWD("head_dim_v -1", INV, UNS, "head_dim_v", f.spec.head_dim_v = -1);
  BAD_FWD("Sq 0", INV, NONE, "q", f.q.shape[1] = 0; f.o.shape[1] = 0);
  BAD_FWD("Skv -1", INV, NONE, "k", f.k.shape[1] = -1; f.v.shape[1] = -1);
  BAD_FWD("B 0", INV, NONE, "q", f.q.shape[0] = 0);
  BAD_FWD("k batch", INV, NONE, "k", f.k.shape[0] = 2);
  BAD_FWD("v length", INV, NONE, "v", f.v.shape[1] = 5);
  BAD_FWD("k heads", INV, NONE, "k", f.k.shape[2] = 2);
  BAD_FWD("q dim", INV, NONE, "q", f.q.shape[3] = 7);
  BAD_FWD("o shape", INV, NONE, "o", f.o.shape[1] = 4);
  BAD_FWD("o dim", INV, NONE, "o", f.o.shape[3] = 16);
  /* the cpu backend takes bf16 / f16 storage, but q, k, v and o must agree */
  BAD_FWD("bf16 q", INV, NONE, "k|dtype", f.q.dtype = ATTN_BF16);
  BAD_FWD("fp16 o", INV, NONE, "o|dtype", f.o.dtype = ATTN_F16);
  BAD_FWD("dtype 9", UNS, INV, "k|dtype", f.k.dtype = (attn_dtype)9);
  BAD_FWD("cuda k", UNS, INV, "k|device", f.k.device = ATTN_DEVICE_CUDA);
  BAD_FWD("cuda o", UNS, INV, "o|device", f.o.device = ATTN_DEVICE_CUDA);
  BAD_FWD("stride[3] 2", INV, NONE, "stride", f.q.stride[3] = 2);
  BAD_FWD("stride[3] 0", INV, NONE, "stride", f.v.stride[3] = 0);
  BAD_FWD("negative stride", INV, NONE, "stride", f.k.stride[1] = -8);
  BAD_FWD("o overlapping rows", INV, NONE, "o", f.o.stride[1] = 0);
  BAD_FWD("o overlapping heads", INV, NONE, "o", f.o.stride[2] = 4);
  BAD_FWD("spec size 0", INV, NONE, "size", f.spec.size = 0);
  BAD_FWD("spec size 3", INV, NONE, "size", f.spec.size = 3);
  BAD_FWD("spec version 0", INV, NONE, "version", f.spec.version = 0);
  BAD_FWD("spec version 99", INV, NONE, "version", f.spec.version = 99);
  BAD_FWD("scale < 0", INV, NONE, "scale", f.spec.scale = -1.0f);
  BAD_FWD("scale NaN", INV, NONE, "scale", f.spec.scale = NAN);
  BAD_FWD("softcap < 0", INV, NONE, "softcap", f.spec.softcap = -2.0f);
  BAD_FWD("softcap inf", INV, NONE, "softcap", f.spec.softcap = INFINITY);
  BAD_FWD("window -5", INV, NONE, "window", f.spec.window_left = -5);
  BAD_FWD("window right -2", INV, NONE, "window", f.spec.window_right = -2);
  BAD_FWD("block_q 0", INV, NONE, "block", f.bm.block_q = 0; f.bm.block_k = 2;
          f.bm.num_q_blocks = f.bm.num_k_blocks = 2; f.bm.mask = f.mask; f.spec.block_mask = &f.bm);
  BAD_FWD("block mask NULL", INV, NONE, "mask", f.bm.block_q = f.bm.block_k = 4;
          f.bm.num_q_blocks = f.bm.num_k_blocks = 2; f.spec.block_mask = &f.bm);
}

static void bad_varlen(void) {
  BAD_FWD("varlen B=2", INV, NONE, "batch|varlen", int32_t cq[2] = {0, 5}; int32_t ck[2] = {0, 6};
          static float q2[160], o2[160], k2[96], v2[96]; f.q = attn_tensor_f32(q2, 2, 5, 2, 8);
          f.k = attn_tensor_f32(k2, 2, 6, 1, 8); f.v = attn_tensor_f32(v2, 2, 6, 1, 8);
          f.o = attn_tensor_f32(o2, 2, 5, 2, 8); tu_fill(q2, 160, -1, 1, 5);
          tu_fill(k2, 96, -1, 1, 6); tu_fill(v2, 96, -1, 1, 7);
          f.spec.cu_seqlens_q = cq; f.spec.cu_seqlens_kv = ck; f.spec.num_seqs = 1);
  BAD_FWD("cu_seqlens_q not monotone", INV, NONE, "cu_seqlens", f.cu_q[0] = 0; f.cu_q[1] = 4;
          f.cu_q[2] = 3; f.cu_kv[0] = 0; f.cu_kv[1] = 3; f.cu_kv[2] = 6;
          f.spec.cu_seqlens_q = f.cu_q; f.spec.cu_seqlens_kv = f.cu_kv; f.spec.num_seqs = 2);
  BAD_FWD("cu_seqlens_kv not monotone", INV, NONE, "cu_seqlens", f.cu_q[0] = 0; f.cu_q[1] = 2;
          f.cu_q[2] = 5; f.cu_kv[0] = 0; f.cu_kv[1] = 7; f.cu_kv[2] = 6;
          f.spec.cu_seqlens_q = f.cu_q; f.spec.cu_seqlens_kv = f.cu_kv; f.spec.num_seqs = 2);
  BAD_FWD("cu_seqlens total", INV, NONE, "cu_seqlens", f.cu_q[0] = 0; f.cu_q[1] = 2;
          f.cu_q[2] = 4; f.cu_kv[0] = 0; f.cu_kv[1] = 3; f.cu_kv[2] = 6;
          f.spec.cu_seqlens_q = f.cu_q; f.spec.cu_seqlens_kv = f.cu_kv; f.spec.num_seqs = 2);
  BAD_FWD("cu_seqlens[0] != 0", INV, NONE, "cu_seqlens", f.cu_q[0] = 1; f.cu_q[1] = 2;
          f.cu_q[2] = 5; f.cu_kv[0] = 0; f.cu_kv[1] = 3; f.cu_kv[2] = 6;
          f.spec.cu_seqlens_q = f.cu_q; f.spec.cu_seqlens_kv = f.cu_kv; f.spec.num_seqs = 2);
  BAD_FWD("num_seqs without cu_seqlens", INV, NONE, "cu_seqlens|num_seqs", f.spec.num_seqs = 2);
  BAD_FWD("cu_seqlens_kv missing", INV, NONE, "cu_seqlens", f.cu_q[0] = 0; f.cu_q[1] = 5;
          f.spec.cu_seqlens_q = f.cu_q; f.spec.num_seqs = 1);
  BAD_FWD("num_seqs < 0", INV, NONE, "num_seqs", f.spec.num_seqs = -1);
}

static void bad_backward(void) {
  fixture ok = make_fixture();
  TU_CHECK(run_fwd(&ok, ctx, 0) == ATTN_OK, "fixture fwd: %s", attn_last_error());
  static float o_ok[80], lse_ok[10];
  memcpy(o_ok, ob, sizeof o_ok);
  memcpy(lse_ok, lseb, sizeof lse_ok);
  attn_tensor to = attn_tensor_f32(o_ok, 1, 5, 2, 8);
#define BWD_WITH(...) BAD_BWD(__VA_ARGS__)
  {
    fixture f = make_fixture();
    f.o = to;
    f.lse = lse_ok;
    TU_CHECK(run_bwd(&f) == ATTN_OK, "the valid backward fixture fails: %s", attn_last_error());
  }
  BWD_WITH("lse NULL", INV, NONE, "lse", f.o = to; f.lse = NULL);
  BWD_WITH("dsinks NULL with sinks", INV, NONE, "dsinks", f.o = to; f.lse = lse_ok; f.dsinks = NULL);
  BWD_WITH("dout shape", INV, NONE, "dout", f.o = to; f.lse = lse_ok; f.dout.shape[1] = 4);
  BWD_WITH("dout NULL data", INV, NONE, "dout", f.o = to; f.lse = lse_ok; f.dout.data = NULL);
  BWD_WITH("o shape", INV, NONE, "o", f.o = to; f.lse = lse_ok; f.o.shape[3] = 4);
  BWD_WITH("dq shape", INV, NONE, "dq", f.o = to; f.lse = lse_ok; f.dq.shape[2] = 1);
  BWD_WITH("dk shape", INV, NONE, "dk", f.o = to; f.lse = lse_ok; f.dk.shape[1] = 5);
  BWD_WITH("dv dtype", INV, NONE, "dv|dtype", f.o = to; f.lse = lse_ok; f.dv.dtype = ATTN_BF16);
  BWD_WITH("dk overlapping", INV, NONE, "dk", f.o = to; f.lse = lse_ok; f.dk.stride[1] = 1);
  BWD_WITH("Hq % Hkv", INV, NONE, "num_heads", f.o = to; f.lse = lse_ok;
           f.spec.num_heads_kv = 3);
  poison_all();
  attn_status st = attn_bwd(ctx, &ok.spec, &ok.q, &ok.k, &ok.v, &to, lse_ok, &ok.dout, NULL,
                            &ok.dk, &ok.dv, ok.dsinks);
  expect("bwd dq NULL", st, INV, NONE, "dq");
  TU_CHECK(all_poisoned(), "bwd dq NULL wrote");
}

static void bad_block_api(void) {
  fixture f = make_fixture();
  float m[10], l[10], acc[80];
  attn_state st = {m, l, acc, 1, 2, 5, 8};
  attn_block_pos pos = ATTN_BLOCK_POS_INIT;
  expect("state_init NULL", attn_state_init(ctx, NULL), INV, NONE, "st|state");
  expect("state_init ctx NULL", attn_state_init(NULL, &st), INV, NONE, "ctx");
  attn_state bad = st;
  bad.rows = 0;
  expect("state_init rows 0", attn_state_init(ctx, &bad), INV, NONE, "rows");
  TU_CHECK(attn_state_init(ctx, &st) == ATTN_OK, "state_init: %s", attn_last_error());
  expect("fwd_block pos NULL", attn_fwd_block(ctx, &f.spec, &st, &f.q, &f.k, &f.v, NULL), INV,
         NONE, "pos");
  bad = st;
  bad.rows = 4;
  expect("fwd_block state too small",
         attn_fwd_block(ctx, &f.spec, &bad, &f.q, &f.k, &f.v, &pos), INV, NONE, "state|rows");
  attn_block_pos far = {0, 0, 3, 0, 8};
  expect("fwd_block k past seq_kv", attn_fwd_block(ctx, &f.spec, &st, &f.q, &f.k, &f.v, &far),
         INV, NONE, "k_pos0|position|seq_kv");
  attn_block_pos neg = {0, -1, 0, 0, 0};
  expect("fwd_block negative q_pos0", attn_fwd_block(ctx, &f.spec, &st, &f.q, &f.k, &f.v, &neg),
         INV, NONE, "q_pos0|position");
  bad = st;
  bad.head_dim_v = 4;
  expect("merge size mismatch", attn_state_merge(ctx, &st, &bad), INV, NONE, "state|src|dst");
  float o2[80];
  tu_poison(o2, 80);
  attn_tensor to = attn_tensor_f32(o2, 1, 4, 2, 8);
  expect("finalize o rows", attn_state_finalize(ctx, &f.spec, &st, &to, NULL), INV, NONE, "o");
  TU_CHECK(tu_count_poison(o2, 80) == 80, "finalize with a bad o wrote");
  float delta[10], dsk[2] = {0, 0};
  expect("prepare delta NULL",
         attn_bwd_prepare(ctx, &f.spec, &f.o, &f.dout, lseb, NULL, dsk), INV, NONE, "delta");
  tu_poison(delta, 10);
  tu_fill(lseb, 10, 0, 1, 9);
  expect("bwd_block lse_rows", attn_bwd_block(ctx, &f.spec, &f.q, &f.k, &f.v, &f.dout, lseb,
                                              delta, 4, &f.dq, &f.dk, &f.dv, &pos),
         INV, NONE, "lse_rows");
}

static void bad_context(void) {
  TU_CHECK(attn_ctx_destroy(NULL) == ATTN_OK, "attn_ctx_destroy(NULL)");
  attn_ctx_config cfg = ATTN_CTX_CONFIG_INIT;
  attn_ctx_t c = (attn_ctx_t)0x1;
  expect("ctx_create out NULL", attn_ctx_create(NULL, &cfg), INV, NONE, "out");
  cfg.num_threads = -1;
  expect("ctx_create threads -1", attn_ctx_create(&c, &cfg), INV, NONE, "num_threads");
  TU_CHECK(c == NULL, "failed attn_ctx_create left *out = %p", (void *)c);
  cfg = (attn_ctx_config)ATTN_CTX_CONFIG_INIT;
  cfg.backend = (attn_backend)7;
  expect("ctx_create backend 7", attn_ctx_create(&c, &cfg), INV, NONE, "backend");
  cfg = (attn_ctx_config)ATTN_CTX_CONFIG_INIT;
  cfg.size = 4;
  expect("ctx_create size 4", attn_ctx_create(&c, &cfg), INV, NONE, "size");
  cfg = (attn_ctx_config)ATTN_CTX_CONFIG_INIT;
  cfg.version = 42;
  expect("ctx_create version 42", attn_ctx_create(&c, &cfg), INV, NONE, "version");
  for (int v = -2; v <= 3; v += 5) { /* -2 and 3: not a cpu_amx value */
    cfg = (attn_ctx_config)ATTN_CTX_CONFIG_INIT;
    cfg.cpu_amx = v;
    expect("ctx_create cpu_amx out of range", attn_ctx_create(&c, &cfg), INV, NONE, "cpu_amx");
  }
  for (int v = 1; v <= 2; v++) { /* a required bf16 unit with the scalar kernels forced */
    cfg = (attn_ctx_config)ATTN_CTX_CONFIG_INIT;
    cfg.backend = ATTN_BACKEND_CPU;
    cfg.force_scalar = 1;
    cfg.cpu_amx = v;
    c = (attn_ctx_t)0x1;
    expect("ctx_create cpu_amx required, force_scalar", attn_ctx_create(&c, &cfg), UNS, NONE,
           "cpu_amx");
    TU_CHECK(c == NULL, "failed attn_ctx_create (cpu_amx=%d) left *out = %p", v, (void *)c);
  }
  TU_CHECK(attn_ctx_create(&c, NULL) == ATTN_OK && c, "attn_ctx_create(cfg NULL): %s",
           attn_last_error());
  attn_ctx_destroy(c);
  for (int s = 0; s <= 10; s++) TU_CHECK(attn_status_string((attn_status)s)[0], "status %d", s);
  TU_CHECK(attn_status_string((attn_status)1234) != NULL, "unknown status string");
  TU_CHECK(attn_version() == ATTN_VERSION_CODE, "attn_version");
}

/* The context-memory calls: a round trip through attn_ctx_alloc / _copy / _free, and
 * their bad arguments. */
static void context_memory(void) {
  float src[37], back[37];
  tu_fill(src, 37, -1, 1, 77);
  tu_poison(back, 37);
  void *a = NULL, *b = NULL;
  TU_CHECK(attn_ctx_device(ctx) == ATTN_DEVICE_HOST, "cpu context memory is host memory");
  TU_CHECK(attn_ctx_alloc(ctx, sizeof src, &a) == ATTN_OK && a, "alloc: %s", attn_last_error());
  TU_CHECK(attn_ctx_alloc(ctx, 0, &b) == ATTN_OK && b && b != a, "alloc(0): %s",
           attn_last_error());
  TU_CHECK((uintptr_t)a % 256 == 0, "alloc is not 256-byte aligned: %p", a);
  TU_CHECK(attn_ctx_copy(ctx, a, src, sizeof src, ATTN_COPY_HOST_TO_CTX) == ATTN_OK, "copy in");
  TU_CHECK(attn_ctx_sync(ctx) == ATTN_OK, "sync");
  TU_CHECK(attn_ctx_copy(ctx, back, a, sizeof src, ATTN_COPY_CTX_TO_HOST) == ATTN_OK, "copy out");
  TU_CHECK(memcmp(src, back, sizeof src) == 0, "round trip through context memory differs");
  expect("copy kind 9", attn_ctx_copy(ctx, a, src, 4, (attn_copy_kind)9), INV, NONE, "kind");
  expect("copy dst NULL", attn_ctx_copy(ctx, NULL, src, 4, ATTN_COPY_HOST_TO_CTX), INV, NONE,
         "dst");
  expect("copy src NULL", attn_ctx_copy(ctx, a, NULL, 4, ATTN_COPY_HOST_TO_CTX), INV, NONE,
         "src");
  expect("alloc out NULL", attn_ctx_alloc(ctx, 4, NULL), INV, NONE, "out");
  expect("alloc ctx NULL", attn_ctx_alloc(NULL, 4, &b), INV, NONE, "ctx");
  TU_CHECK(attn_ctx_supports_dtype(ctx, ATTN_F32) == ATTN_OK, "cpu takes f32");
  TU_CHECK(attn_ctx_supports_dtype(ctx, ATTN_BF16) == ATTN_OK &&
               attn_ctx_supports_dtype(ctx, ATTN_F16) == ATTN_OK,
           "cpu takes bf16 and f16: %s", attn_last_error());
  expect("supports dtype 9", attn_ctx_supports_dtype(ctx, (attn_dtype)9), ATTN_ERR_UNSUPPORTED,
         NONE, "dtype=9");
  expect("supports dtype ctx NULL", attn_ctx_supports_dtype(NULL, ATTN_F32), INV, NONE, "ctx");
  TU_CHECK(attn_ctx_free(ctx, a) == ATTN_OK && attn_ctx_free(ctx, b) == ATTN_OK &&
               attn_ctx_free(ctx, NULL) == ATTN_OK,
           "free");
}

/* Huge shapes with a fake pointer: rejected before any access (a read would crash). */
static void limits_huge(void) {
  void *fake = (void *)(uintptr_t)0x1000;
  int64_t big = (INT64_C(1) << 40) + 1;
  BAD_FWD("Sq past 2^40", INV, NONE, "q", f.q = attn_tensor_f32(fake, 1, big, 2, 8);
          f.o = attn_tensor_f32(fake, 1, big, 2, 8); f.lse = (float *)fake);
  BAD_FWD("q spans past int64", INV, NONE, "q", int64_t e = INT64_C(1) << 39;
          f.q = attn_tensor_f32(fake, e, e, 2, 8); f.k = attn_tensor_f32(fake, e, 6, 1, 8);
          f.v = attn_tensor_f32(fake, e, 6, 1, 8); f.o = attn_tensor_f32(fake, e, e, 2, 8);
          f.lse = (float *)fake);
  /* Every extent and stride within 2^40, but the span is past 2^63. */
  BAD_FWD("q strided span past int64", INV, NONE, "q", int64_t e = INT64_C(1) << 24;
          f.q = attn_tensor_f32(fake, e, e, 2, 8); f.q.stride[0] = INT64_C(1) << 40;
          f.k = attn_tensor_f32(fake, e, 6, 1, 8); f.v = attn_tensor_f32(fake, e, 6, 1, 8);
          f.o = f.q; f.lse = (float *)fake);
}

/* Element offsets past 2^31: batch 1 of q and o sits 2^31 + 64 elements after batch 0, in a
 * sparse mapping (only touched pages are real). Must equal the contiguous result. */
static void limits_offsets(void) {
  const int64_t S = 70, H = 2, D = 16, gap = (INT64_C(1) << 31) + 64;
  size_t bytes = (size_t)(gap + S * H * D) * sizeof(float);
  float *q = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  float *o = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (q == MAP_FAILED || o == MAP_FAILED) {
    printf("limits_offsets: skipped (cannot map %zu bytes)\n", bytes);
    return;
  }
  tc_prob P;
  tc_out ref;
  tc_init(&P, &(tc_case){.B = 2, .Sq = S, .Skv = 90, .Hq = H, .Hkv = 1, .Dqk = D,
                         .causal = 1, .sinks = 1, .seed = 4242});
  tc_lib(ctx, &P, &ref, 0);
  for (int64_t b = 0; b < 2; b++) {
    memcpy(q + b * gap, P.q + b * S * H * D, (size_t)(S * H * D) * sizeof(float));
    tu_poison(o + b * gap, S * H * D);
  }
  attn_tensor tq = {q, ATTN_F32, ATTN_DEVICE_HOST, {2, S, H, D}, {gap, H * D, D, 1}};
  attn_tensor to = {o, ATTN_F32, ATTN_DEVICE_HOST, {2, S, H, D}, {gap, H * D, D, 1}};
  float *lse = tu_falloc(2 * H * S), *og = tu_falloc(2 * S * H * D);
  attn_status st = attn_fwd(ctx, &P.spec, &tq, &P.tk, &P.tv, &to, lse);
  TU_CHECK(st == ATTN_OK, "fwd with offsets past 2^31: %s", attn_last_error());
  for (int64_t b = 0; b < 2; b++)
    memcpy(og + b * S * H * D, o + b * gap, (size_t)(S * H * D) * sizeof(float));
  tu_compare_f("O with offsets past 2^31", og, ref.o, 2 * S * H * D, NULL, 1e-6, 1e-7);
  tu_compare_f("LSE with offsets past 2^31", lse, ref.lse, 2 * H * S, NULL, 1e-6, 1e-7);
  free(lse);
  free(og);
  tc_out_free(&ref);
  tc_free(&P);
  munmap(q, bytes);
  munmap(o, bytes);
}

int main(void) {
  ctx = tc_ctx(0, 2);
  bad_forward();
  bad_varlen();
  bad_backward();
  bad_block_api();
  bad_context();
  context_memory();
  limits_huge();
  limits_offsets();
  attn_ctx_destroy(ctx);
  return tu_finish("test_bad_inputs");
}
