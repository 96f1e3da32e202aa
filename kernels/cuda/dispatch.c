/* dispatch.c — the CUDA backend's C entry points: what the kernels support (with a
 * message naming the value and the supported set otherwise), the workspace layout, and a
 * plain switch on (Dqk, Dv), then dtype and causal, to the instance launchers; the forward
 * (one shot and block mode) and the non-deterministic backward go to the Hopper kernels
 * (fwd_sm90_body.cuh, bwd_sm90_body.cuh) at the head dims they are built for, where they
 * can run and ATTN_CUDA_HOPPER allows it. Plain C: no CUDA headers; launch errors come back
 * as cudaError_t values and are worded here. */
#include <stdint.h>
#include <string.h>

#include "../../runtime/internal.h"
#include "instance.h"
#include "traits.h"

#ifndef ATTN_CUDA_HEAD_DIMS_STR
#define ATTN_CUDA_HEAD_DIMS_STR "none"
#endif

typedef struct {
  fa_launcher fwd, bwd;
  const char *name;
} fa_instance;

#define INST(sfx) {attn_cuda__fwd_##sfx, attn_cuda__bwd_##sfx, #sfx}
/* [dtype: bf16, f16][causal: no, yes] */
#define INSTANCE_SET(hd) \
  {{INST(hd##_bf16), INST(hd##_bf16_causal)}, {INST(hd##_f16), INST(hd##_f16_causal)}}
#define DECLARE_SET(hd)                   \
  FA_DECLARE_INSTANCE(hd##_bf16)          \
  FA_DECLARE_INSTANCE(hd##_bf16_causal)   \
  FA_DECLARE_INSTANCE(hd##_f16)           \
  FA_DECLARE_INSTANCE(hd##_f16_causal)
/* A case of the switch below: the instance set of head dims (dqk, dv), named hd. */
#define CASE_SET(dqk, dv, hd)                                     \
  case PAIR(dqk, dv): {                                           \
    static const fa_instance set[2][2] = INSTANCE_SET(hd);        \
    return &set[d][c];                                            \
  }
/* (Dqk, Dv) as one switch key; both are below 1024 when it is used. */
#define PAIR(dqk, dv) ((dqk) * 1024 + (dv))

#ifdef ATTN_CUDA_HD_64
DECLARE_SET(hd64)
#endif
#ifdef ATTN_CUDA_HD_128
DECLARE_SET(hd128)
#endif
#ifdef ATTN_CUDA_HD_256
DECLARE_SET(hd256)
#endif
#ifdef ATTN_CUDA_HD_192x128
DECLARE_SET(hd192x128)
#endif

FA_DECLARE_INSTANCE(f32)

/* The Hopper instances this build has, per direction and head dim (cmake/cuda.cmake). */
#define DECLARE_SM90(dir, hd)                                                               \
  int attn_cuda__##dir##_##hd##_bf16_sm90(const fa_call *c);                                \
  int attn_cuda__##dir##_##hd##_bf16_causal_sm90(const fa_call *c);                         \
  int attn_cuda__##dir##_##hd##_f16_sm90(const fa_call *c);                                 \
  int attn_cuda__##dir##_##hd##_f16_causal_sm90(const fa_call *c);
#define SM90_SET(dir, dqk, dv, hd)                                                          \
  {dqk, dv,                                                                                 \
   {{attn_cuda__##dir##_##hd##_bf16_sm90, attn_cuda__##dir##_##hd##_bf16_causal_sm90},      \
    {attn_cuda__##dir##_##hd##_f16_sm90, attn_cuda__##dir##_##hd##_f16_causal_sm90}}},
typedef struct {
  int dqk, dv;              /* head dims (0, 0: the end of a table) */
  fa_launcher k[2][2];      /* [bf16, f16][not causal, causal] */
} sm90_set;
#ifdef ATTN_CUDA_SM90_FWD_HD64
DECLARE_SM90(fwd, hd64)
#endif
#ifdef ATTN_CUDA_SM90_FWD_HD128
DECLARE_SM90(fwd, hd128)
#endif
#ifdef ATTN_CUDA_SM90_FWD_HD192x128
DECLARE_SM90(fwd, hd192x128)
#endif
#ifdef ATTN_CUDA_SM90_FWD_HD256
DECLARE_SM90(fwd, hd256)
#endif
#ifdef ATTN_CUDA_SM90_BWD_HD64
DECLARE_SM90(bwd, hd64)
#endif
#ifdef ATTN_CUDA_SM90_BWD_HD128
DECLARE_SM90(bwd, hd128)
#endif
#ifdef ATTN_CUDA_SM90_BWD_HD192x128
DECLARE_SM90(bwd, hd192x128)
#endif
#ifdef ATTN_CUDA_SM90_BWD_HD256
DECLARE_SM90(bwd, hd256)
#endif
static const sm90_set sm90_fwd[] = {
#ifdef ATTN_CUDA_SM90_FWD_HD64
    SM90_SET(fwd, 64, 64, hd64)
#endif
#ifdef ATTN_CUDA_SM90_FWD_HD128
    SM90_SET(fwd, 128, 128, hd128)
#endif
#ifdef ATTN_CUDA_SM90_FWD_HD192x128
    SM90_SET(fwd, 192, 128, hd192x128)
#endif
#ifdef ATTN_CUDA_SM90_FWD_HD256
    SM90_SET(fwd, 256, 256, hd256)
#endif
    {0, 0, {{NULL, NULL}, {NULL, NULL}}}};
static const sm90_set sm90_bwd[] = {
#ifdef ATTN_CUDA_SM90_BWD_HD64
    SM90_SET(bwd, 64, 64, hd64)
#endif
#ifdef ATTN_CUDA_SM90_BWD_HD128
    SM90_SET(bwd, 128, 128, hd128)
#endif
#ifdef ATTN_CUDA_SM90_BWD_HD192x128
    SM90_SET(bwd, 192, 128, hd192x128)
#endif
#ifdef ATTN_CUDA_SM90_BWD_HD256
    SM90_SET(bwd, 256, 256, hd256)
#endif
    {0, 0, {{NULL, NULL}, {NULL, NULL}}}};

/* ---- the Hopper kernels: when they are taken -----------------------------------------------
 * ATTN_CUDA_HOPPER=1 (the default on hardware since the H200 run of 2026-12-04 verified the
 * kernels; 0 on the emulator: attn_cuda__hopper_default) on a compute
 * capability 9.0 device, for bf16/f16 at a head-dim pair (Dqk, Dv) the direction has an
 * sm90 instance for (the tables above), without varlen, a block mask or a KV cache; the forward both
 * one shot and in block mode (the state-carrying call of the ring: the same conditions,
 * the same kernel); the backward also with a deterministic dQ (ATTN_DETERMINISTIC /
 * deterministic=1: the key CTAs add each dQ tile in their order, through semaphores in the
 * workspace; without that workspace, the mma.sync kernels). The
 * launcher itself declines (FA_ERR_FALLBACK) when the build has no sm_90a image or TMA
 * cannot describe a view. Everything else runs the mma.sync kernels. */
static int hopper_override = -1;

void attn_cuda_set_hopper(int mode) { hopper_override = mode < 0 ? -1 : mode != 0; }

/* The launcher of set for p, or NULL with *why saying what rules it out. */
static fa_launcher hopper_pick(const sm90_set *set, const attn_cuda_problem *p, const char **why) {
  const int on = hopper_override >= 0 ? hopper_override : (int)ATTN_PARAM("CUDA_HOPPER", attn_cuda__hopper_default());
  if (!on) *why = "ATTN_CUDA_HOPPER=0";
  else if (!set[0].dqk) *why = "this build has no sm_90a kernels for this direction";
  else if (attn_cuda__device_cc() != 90) *why = "the device is not compute capability 9.0";
  else if (p->dtype == ATTN_F32) *why = "it takes bf16/f16 only";
  else if (p->num_seqs || p->block_mask) *why = "varlen and block masks run on mma.sync";
  else if (p->kv_used || p->block_table) *why = "a KV cache runs on mma.sync";
  else {
    for (; set->dqk; set++)
      if (p->Dqk == set->dqk && p->Dv == set->dv) return set->k[p->dtype == ATTN_BF16 ? 0 : 1][p->causal ? 1 : 0];
    *why = "no sm90 instance at this head dim";
  }
  return NULL;
}

/* The mma.sync forward kernel the environment asks for (instance.h FA_FWD_FORM_*; the
 * first of these variables set wins), where it applies. */
static int fwd_form_asked(void) {
  return ATTN_PARAM("CUDA_FWD_WARPS", 8) == 4         ? FA_FWD_FORM_4W
         : ATTN_PARAM("CUDA_FWD_CTAS", 1) == 2        ? FA_FWD_FORM_2CTA
         : ATTN_PARAM("CUDA_FWD_WARP_ROWS", 16) == 32 ? FA_FWD_FORM_4X32
         : ATTN_PARAM("CUDA_FWD_STAGES", 2) == 4      ? FA_FWD_FORM_4S
         : ATTN_PARAM("CUDA_FWD_KSPLIT", 0) == 1      ? FA_FWD_FORM_KS
                                                      : FA_FWD_FORM_8W;
}

/* The key-split decode kernel (fwd_body.cuh) is asked for and fits p: at most
 * FA_FWD_KS_ROWS rows a KV head, not varlen. Such a problem runs it, on Hopper too (the
 * sm90 forward's 128-row tile would compute on one of them). */
static int ksplit_fits(const attn_cuda_problem *p) {
  return fwd_form_asked() == FA_FWD_FORM_KS && p->dtype != ATTN_F32 && p->Hkv >= 1 &&
         p->Hq % p->Hkv == 0 && !p->num_seqs && p->sq * (p->Hq / p->Hkv) <= FA_FWD_KS_ROWS;
}

static fa_launcher hopper_fwd(const attn_cuda_problem *p, const char **why) {
  if (ksplit_fits(p)) {
    *why = "ATTN_CUDA_FWD_KSPLIT=1: the key-split decode kernel";
    return NULL;
  }
  return hopper_pick(sm90_fwd, p, why);
}

/* no_sems: a deterministic dQ was asked for without the workspace's semaphores */
static fa_launcher hopper_bwd(const attn_cuda_problem *p, int no_sems, const char **why) {
  if (no_sems) {
    *why = "a deterministic dQ on sm90 needs the workspace's semaphores (attn_cuda_workspace_bytes)";
    return NULL;
  }
  return hopper_pick(sm90_bwd, p, why);
}

/* One direction's kernel-family choice: the family its last bf16/f16 call ran, and what
 * was last logged (at INFO, only when the choice or its reason changes). */
typedef struct {
  const char *dir, *sm90;       /* "forward", and how the sm90 kernel is named in the log */
  const char *what, *what_sm90; /* the launch-failure messages' names */
  const char *used;             /* "none", "sm90" or "mma" */
  const char *last_path, *last_why;
} fa_choice;
static fa_choice fwd_choice = {"forward", "sm90 (TMA + wgmma, warp-specialised)", "flash forward",
                               "flash forward (sm90)", "none", NULL, NULL};
static fa_choice bwd_choice = {"backward",
                               "sm90 (TMA + wgmma, warp-specialised, dQ added in no fixed order: ATTN_SM90_DQ)",
                               "flash backward", "flash backward (sm90)", "none", NULL, NULL};

static void log_choice(fa_choice *ch, const char *path, const char *why) {
  ch->used = path == ch->sm90 ? "sm90" : "mma";
  if (path == ch->last_path && why == ch->last_why) return;
  ch->last_path = path;
  ch->last_why = why;
  attn__log(ATTN_LOG_INFO, "cuda %s: %s%s%s", ch->dir, path, why ? " — " : "", why ? why : "");
}

/* ---- the forward's decode forms (fwd_body.cuh) ---------------------------------------------
 * Packed GQA: when a query tile of one head would be mostly empty (a decode step's 1-8
 * rows, short varlen sequences), the query heads of one KV head share the CTA's 128 rows
 * (row = position x head), so each K/V tile is read once for all of them; the pack is the
 * whole group (or its largest divisor up to 128). Split-KV: when the CTAs fill less than
 * 0.8 of one wave of the device's SMs (an SM holds one CTA of the mma.sync forward: 8 warps
 * of up to 255 registers take its register file), each
 * query tile's key tiles are split over nsplit CTAs whose partial states a second kernel
 * folds together (in split order: repeatable, but not the unsplit call's bits), the
 * smallest nsplit within 0.85 of the best wave efficiency, at most 128 and with at
 * least 4 key tiles a split; it needs its partial states in the workspace
 * (attn_cuda_workspace_bytes), and without them runs unsplit (logged at INFO). Both are
 * bf16/f16 mma.sync forms: the Hopper forward, where it is on, takes the problems that
 * need no packing, unsplit. ATTN_CUDA_PACK_GQA (0 off, 1 when it saves CTAs: the default,
 * 2 whenever Hq > Hkv) and ATTN_CUDA_SPLITS (0 the heuristic: the default, n exactly n
 * splits, clamped to the key tiles) or attn_cuda_set_decode() override them. */
#define FA_MAX_SPLITS 128

static int pack_override = -1, splits_override = -1;

void attn_cuda_set_decode(int pack, int splits) {
  pack_override = pack < 0 ? -1 : pack > 2 ? 2 : pack;
  splits_override = splits < 0 ? -1 : splits;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Query rows (or keys) per sequence: the call's, or its mean under varlen. */
static int64_t per_seq(const attn_cuda_problem *p, int64_t n) {
  return p->num_seqs > 0 ? ceil_div(n, p->num_seqs) : n;
}

/* Query tiles of the forward with pack heads a CTA (the grid's x, unsplit). */
static int64_t query_ctas(const attn_cuda_problem *p, int pack) {
  const int64_t seqs = p->num_seqs > 0 ? p->num_seqs : 1;
  return p->B * (p->Hq / pack) * seqs * ceil_div(per_seq(p, p->sq), FA_FWD_BM / pack);
}

static int plan_pack(const attn_cuda_problem *p) {
  const int mode = pack_override >= 0 ? pack_override : (int)ATTN_PARAM("CUDA_PACK_GQA", 1);
  const int64_t group = p->Hq / p->Hkv;
  if (mode <= 0 || group < 2) return 1;
  int pack = (int)(group < FA_FWD_BM ? group : FA_FWD_BM);
  while (group % pack) pack--;
  if (mode == 1 && query_ctas(p, pack) >= query_ctas(p, 1)) return 1;
  return pack;
}

/* Waves of ctas CTAs on slots CTA slots, as a fraction of the whole waves they take. */
static double wave_efficiency(int64_t ctas, int64_t slots) {
  const double waves = (double)ctas / (double)slots;
  return waves / (double)ceil_div(ctas, slots);
}

static int plan_splits(const attn_cuda_problem *p, int pack) {
  const int mode = splits_override >= 0 ? splits_override : (int)ATTN_PARAM("CUDA_SPLITS", 0);
  const int64_t ktiles = ceil_div(per_seq(p, p->skv), FA_FWD_BN(p->Dqk, p->Dv));
  const int64_t most = ktiles < FA_MAX_SPLITS ? ktiles : FA_MAX_SPLITS;
  if (mode > 0) return (int)(mode < most ? mode : most);
  /* CTA slots: one an SM, two of the key-split kernel */
  const int64_t ctas = query_ctas(p, pack), slots = attn_cuda__device_sms() * (ksplit_fits(p) ? 2 : 1);
  if (slots <= 0 || (double)ctas >= 0.8 * (double)slots) return 1;
  const int64_t cap = ktiles / 4 < most ? ktiles / 4 : most;
  double best = 0.0;
  for (int64_t n = 1; n <= cap; n++) {
    const double e = wave_efficiency(ctas * n, slots);
    if (e > best) best = e;
  }
  for (int64_t n = 1; n <= cap; n++)
    if (wave_efficiency(ctas * n, slots) >= 0.85 * best) return (int)n;
  return 1;
}

typedef struct {
  int pack, nsplit;
} fwd_plan;

/* The decode forms for p (both 1 for float32 and wherever the Hopper forward runs). */
static fwd_plan plan_fwd(const attn_cuda_problem *p, int hopper) {
  fwd_plan pl = {1, 1};
  if (p->dtype == ATTN_F32 || p->Hkv < 1 || p->Hq % p->Hkv || p->sq < 1 || p->skv < 1) return pl;
  pl.pack = plan_pack(p);
  if ((hopper && pl.pack == 1) || p->Dv > FA_COMBINE_DMAX) return pl;
  pl.nsplit = plan_splits(p, pl.pack);
  return pl;
}

/* float32: one instance (causal and the head dims are read at run time). */
static int f32_dims_ok(int64_t dqk, int64_t dv) {
  return dqk >= 8 && dqk <= FA_F32_DMAX && dqk % 8 == 0 && dv >= 8 && dv <= FA_F32_DMAX &&
         dv % 8 == 0;
}

static const fa_instance *find_instance(int64_t dqk, int64_t dv, int dtype, int causal) {
  const int d = dtype == ATTN_BF16 ? 0 : 1, c = causal ? 1 : 0;
  (void)d;
  (void)c;
  if (dtype == ATTN_F32) {
    static const fa_instance f32 = INST(f32);
    return f32_dims_ok(dqk, dv) ? &f32 : NULL;
  }
  if (dqk < 1 || dqk > 1023 || dv < 1 || dv > 1023) return NULL;
  switch (PAIR(dqk, dv)) {
#ifdef ATTN_CUDA_HD_64
    CASE_SET(64, 64, hd64)
#endif
#ifdef ATTN_CUDA_HD_128
    CASE_SET(128, 128, hd128)
#endif
#ifdef ATTN_CUDA_HD_256
    CASE_SET(256, 256, hd256)
#endif
#ifdef ATTN_CUDA_HD_192x128
    CASE_SET(192, 128, hd192x128)
#endif
    default:
      break;
  }
  return NULL;
}

const char *attn_cuda_head_dims(void) { return ATTN_CUDA_HEAD_DIMS_STR; }

static attn_status check_view(const char *name, attn_cuda_view v, int is_float) {
  if (!v.p) return attn__fail(ATTN_ERR_INVALID_ARG, "%s (device pointer) is NULL", name);
  const int align = is_float ? 8 : 16, mult = is_float ? 2 : 8;
  if ((uintptr_t)v.p % (uintptr_t)align)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "%s=%p is not %d-byte aligned; the cuda kernels need aligned rows "
                      "(cudaMalloc gives 256-byte alignment)",
                      name, v.p, align);
  if (v.sb % mult || v.ss % mult || v.sh % mult || v.sb < 0 || v.ss < 0 || v.sh < 0)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "%s strides (b=%lld, s=%lld, h=%lld) must be non-negative multiples of %d "
                      "elements for the cuda kernels",
                      name, (long long)v.sb, (long long)v.ss, (long long)v.sh, mult);
  return ATTN_OK;
}

static attn_status check_dtype(int dtype) {
  if (dtype == ATTN_BF16 || dtype == ATTN_F16 || dtype == ATTN_F32) return ATTN_OK;
  return attn__fail(ATTN_ERR_INVALID_ARG, "dtype=%d is not an attn_dtype", dtype);
}

/* A KV cache's sizes (its arrays are device memory: the kernels clamp what they read). */
static attn_status check_cache(const attn_cuda_problem *p) {
  if ((p->kv_used || p->block_table) && p->num_seqs)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "a KV cache (kv_used / block_table) with varlen (num_seqs=%d): the "
                      "cuda kernels take a cache on batched problems",
                      p->num_seqs);
  if (!p->block_table) return ATTN_OK;
  if (p->pages_per_seq < 1 || p->page_size < 1 || p->num_pages < 1 ||
      p->page_size > INT32_MAX / 2 || p->pages_per_seq > INT32_MAX / 2 ||
      p->pages_per_seq * p->page_size != p->skv)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "block_table: pages_per_seq=%lld x page_size=%lld must be positive and "
                      "equal skv=%lld, and num_pages=%lld positive",
                      (long long)p->pages_per_seq, (long long)p->page_size, (long long)p->skv,
                      (long long)p->num_pages);
  return ATTN_OK;
}

static attn_status check_device(void) {
  const int cc = attn_cuda__device_cc();
  if (cc && cc < 80)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "the cuda kernels need compute capability 8.0 or newer (mma.sync bf16, "
                      "cp.async); this device is %d.%d",
                      cc / 10, cc % 10);
  return ATTN_OK;
}

attn_status attn_cuda_check(const attn_cuda_problem *p) {
  if (!p) return attn__fail(ATTN_ERR_INVALID_ARG, "problem is NULL");
  ATTN_CHECK(check_dtype(p->dtype));
  if (!find_instance(p->Dqk, p->Dv, p->dtype, p->causal)) {
    if (p->dtype == ATTN_F32)
      return attn__fail(ATTN_ERR_UNSUPPORTED,
                        "head_dim_qk=%lld head_dim_v=%lld: the cuda float32 kernels take head "
                        "dims that are multiples of 8 from 8 to %d; use the cpu backend",
                        (long long)p->Dqk, (long long)p->Dv, FA_F32_DMAX);
    if (p->Dqk == p->Dv)
      return attn__fail(ATTN_ERR_UNSUPPORTED,
                        "head_dim=%lld is not supported by the cuda backend (built: %s); "
                        "rebuild with -DATTN_CUDA_HEAD_DIMS to add it, or use the cpu backend",
                        (long long)p->Dqk, ATTN_CUDA_HEAD_DIMS_STR);
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "head_dim_qk=%lld with head_dim_v=%lld is not supported by the cuda "
                      "backend (built: %s, as D for Dqk == Dv or DqkxDv); rebuild with "
                      "-DATTN_CUDA_HEAD_DIMS to add it, or use the cpu backend",
                      (long long)p->Dqk, (long long)p->Dv, ATTN_CUDA_HEAD_DIMS_STR);
  }
  if (p->B < 1 || p->B > 65535 || p->Hq < 1 || p->Hq > 65535 || p->Hkv < 1 || p->Hq % p->Hkv)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "B=%lld Hq=%lld Hkv=%lld: the cuda kernels need 1 <= B, Hq <= 65535 "
                      "(grid limits) and Hq %% Hkv == 0",
                      (long long)p->B, (long long)p->Hq, (long long)p->Hkv);
  if (p->sq < 1 || p->skv < 1 || p->sq > INT32_MAX / 2 || p->skv > INT32_MAX / 2)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "sq=%lld skv=%lld: the cuda kernels take 1 .. 2^30 rows per call",
                      (long long)p->sq, (long long)p->skv);
  const int64_t lim = INT64_C(1) << 30; /* the kernels index positions in 32 bits */
  if (p->q_pos0 < 0 || p->k_pos0 < 0 || p->q_pos0 + p->sq > lim || p->k_pos0 + p->skv > lim ||
      p->seq_q > lim || p->seq_kv > lim || p->q_row0 < 0)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "positions q_pos0=%lld+%lld k_pos0=%lld+%lld seq_q=%lld seq_kv=%lld: the cuda "
                      "kernels take sequences of up to 2^30 positions",
                      (long long)p->q_pos0, (long long)p->sq, (long long)p->k_pos0,
                      (long long)p->skv, (long long)p->seq_q, (long long)p->seq_kv);
  if (!(p->scale > 0.0f) || !(p->softcap >= 0.0f))
    return attn__fail(ATTN_ERR_INVALID_ARG, "scale=%g must be > 0 and softcap=%g >= 0",
                      (double)p->scale, (double)p->softcap);
  if (p->num_seqs < 0 || (p->num_seqs > 0 && (!p->cu_seqlens_q || !p->cu_seqlens_kv || p->B != 1)))
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "varlen needs B=1 and both cu_seqlens device arrays (num_seqs=%d, B=%lld)",
                      p->num_seqs, (long long)p->B);
  if (p->block_mask && (p->block_q < 1 || p->block_k < 1 || p->num_q_blocks < 1 || p->num_k_blocks < 1))
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "block mask sizes block_q=%d block_k=%d num_q_blocks=%lld num_k_blocks=%lld "
                      "must be positive",
                      p->block_q, p->block_k, (long long)p->num_q_blocks, (long long)p->num_k_blocks);
  ATTN_CHECK(check_cache(p));
  ATTN_CHECK(check_view("q", p->q, p->dtype == ATTN_F32));
  ATTN_CHECK(check_view("k", p->k, p->dtype == ATTN_F32));
  ATTN_CHECK(check_view("v", p->v, p->dtype == ATTN_F32));
  return check_device();
}

/* Workspace: varlen, the query-tile table, then the key-tile table (required); otherwise,
 * for bf16/f16 without a block mask, the sm90 backward's deterministic-dQ semaphores
 * (int32 [B][Hq][ceil(sq / 64)][2] and a ticket counter: optional, a backward without
 * them takes the mma.sync kernels for a deterministic dQ). Then, when the forward's plan
 * splits its keys, the partial states (instance.h's FA_PART_FLOATS; optional: without
 * them the forward runs unsplit). */
static int64_t round256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

/* The query table's tiles are the packed forward's (128 / pack positions) at the least. */
static int64_t table_bytes(int64_t rows, int32_t num_seqs, int pack) {
  const int32_t tile = FA_FWD_BM / pack < FA_MIN_TILE ? FA_FWD_BM / pack : FA_MIN_TILE;
  return round256(attn_cuda__table_entries(rows, num_seqs, tile) * 16);
}

static int64_t sem_bytes(const attn_cuda_problem *p) {
  if (p->dtype == ATTN_F32 || p->num_seqs > 0 || p->block_mask) return 0;
  return round256((FA_DQ_SEM_WORDS(p->B, p->Hq, p->sq) + FA_DQ_SEM_EXTRA) * 4);
}

/* The fixed part (tables or semaphores) and the partial states' bytes, for plan pl. */
static int64_t fixed_bytes(const attn_cuda_problem *p, fwd_plan pl) {
  if (p->num_seqs <= 0) return sem_bytes(p);
  return table_bytes(p->sq, p->num_seqs, pl.pack) + table_bytes(p->skv, p->num_seqs, 1);
}

static int64_t part_bytes(const attn_cuda_problem *p, fwd_plan pl) {
  return pl.nsplit > 1 ? round256(FA_PART_FLOATS(p, pl.nsplit) * 4) : 0;
}

static fwd_plan plan_of(const attn_cuda_problem *p);

/* the FA_FWD_FORM_* the last bf16/f16 forward ran on mma.sync (-1: it ran none), which the
 * launchers write through fa_call.form_ran (attn_cuda_last_fwd_form) */
static int fwd_form_ran = -1;
/* the mma.sync dK/dV kernel's step buffers in the last backward (attn_cuda_last_bwd_form):
 * 0 when another kernel ran it */
static int bwd_stages_ran = 0;

/* ATTN_MMA_ABLATE=m (set at all): a one-shot forward takes the mma.sync forward's ablation
 * kernel where it applies (instance.h FA_FWD_FORM_AB), stages FA_AB_* of m left out. */
static void fwd_ablation(fa_call *c) {
  const int64_t m = ATTN_PARAM("MMA_ABLATE", -1);
  if (m < 0) return;
  c->fwd_form = FA_FWD_FORM_AB;
  c->ablate = (int)(m & FA_AB_ALL);
  if (c->ablate & FA_AB_BAR) c->ablate |= FA_AB_LOAD; /* no tile may land unwaited for */
  static int said; /* once a process: the timed loops call this thousands of times */
  if (said) return;
  said = 1;
  attn__log(ATTN_LOG_WARN,
            "mma.sync forward: ATTN_MMA_ABLATE=%d: the ablation kernel where it applies (bf16, "
            "d = 128, not causal, one shot, unpacked, unsplit)%s",
            c->ablate, c->ablate ? ", stages left out: its results are wrong" : ", nothing left out");
}

size_t attn_cuda_workspace_bytes(const attn_cuda_problem *p) {
  if (!p) return 0;
  const fwd_plan pl = plan_of(p);
  return (size_t)(fixed_bytes(p, pl) + part_bytes(p, pl));
}

/* Points c at the parts of the workspace; pl: the forward's plan ({1, 1} for a backward),
 * whose split falls back to 1 when the workspace has no room for the partial states. */
static attn_status carve(const attn_cuda_problem *p, void *ws, size_t bytes, fwd_plan pl,
                         fa_call *c) {
  const int64_t fixed = fixed_bytes(p, pl), parts = part_bytes(p, pl);
  const int aligned = ws && (uintptr_t)ws % 16 == 0;
  c->pack = pl.pack;
  c->nsplit = 1;
  c->fwd_form = fwd_form_asked();
  if (c->fwd_form == FA_FWD_FORM_KS && !ksplit_fits(p)) c->fwd_form = FA_FWD_FORM_8W;
  c->form_ran = &fwd_form_ran;
  c->bwd_stages = ATTN_PARAM("CUDA_BWD_STAGES", 2) == FA_BWD_4S_STAGES ? FA_BWD_4S_STAGES : 2;
  c->bwd_stages_ran = &bwd_stages_ran;
  if (p->num_seqs <= 0 && fixed && aligned && bytes >= (size_t)fixed) {
    c->dq_sems = (int32_t *)ws;
    c->dq_sem_bytes = (size_t)fixed;
  }
  if (p->num_seqs > 0) {
    if (!ws || bytes < (size_t)fixed)
      return attn__fail(ATTN_ERR_INVALID_ARG,
                        "workspace of %zu bytes at %p is too small: attn_cuda_workspace_bytes() "
                        "asks %lld for this problem",
                        bytes, ws, (long long)(fixed + parts));
    if (!aligned) return attn__fail(ATTN_ERR_INVALID_ARG, "workspace %p is not 16-byte aligned", ws);
    c->tiles_q = (int32_t *)ws;
    c->tiles_k = (int32_t *)((char *)ws + table_bytes(p->sq, p->num_seqs, pl.pack));
  }
  if (pl.nsplit > 1 && aligned && bytes >= (size_t)(fixed + parts)) {
    c->nsplit = pl.nsplit;
    c->part = (float *)((char *)ws + fixed);
  } else if (pl.nsplit > 1) {
    attn__log(ATTN_LOG_INFO,
              "cuda forward: %d key splits need a workspace of %lld bytes "
              "(attn_cuda_workspace_bytes); running unsplit",
              pl.nsplit, (long long)(fixed + parts));
  }
  return ATTN_OK;
}

static attn_status launched(int err, const char *what, const fa_instance *in) {
  if (!err) return ATTN_OK;
  return attn__fail(ATTN_ERR_CUDA, "%s (%s) failed to launch: %s", what, in ? in->name : "generic",
                    attn_cuda__error_string(err));
}

/* Runs the Hopper launcher hop when there is one (NULL: why says why not) and the
 * mma.sync one mma when hop declines or is absent, logging the choice. */
static attn_status launch_choice(fa_choice *ch, fa_launcher hop, const char *why, fa_launcher mma,
                                 const fa_call *c, const fa_instance *in) {
  if (hop) {
    const int err = hop(c);
    if (err != FA_ERR_FALLBACK) {
      log_choice(ch, ch->sm90, NULL);
      return launched(err, ch->what_sm90, in);
    }
    why = "the sm90 launcher declined (no sm_90a image, or a view TMA cannot describe)";
  }
  log_choice(ch, "mma.sync", why);
  return launched(mma(c), ch->what, in);
}

static fwd_plan plan_of(const attn_cuda_problem *p) {
  const char *why = NULL;
  return plan_fwd(p, hopper_fwd(p, &why) != NULL);
}

static fwd_plan last_plan = {1, 1}, logged_plan = {1, 1};

/* The forward of c (one shot, or block mode when c->st is set): float32 on its own
 * kernel, bf16/f16 on the Hopper kernel where hopper_fwd allows it and the plan packs no
 * heads, else mma.sync with the plan c carries; the choice is logged and kept for
 * attn_cuda_last_fwd_path / _plan either way. */
static attn_status fwd_launch(const attn_cuda_problem *p, const fa_call *c) {
  const fa_instance *in = find_instance(p->Dqk, p->Dv, p->dtype, p->causal);
  fwd_form_ran = -1;
  if (p->dtype == ATTN_F32) return launched(in->fwd(c), "flash forward", in);
  const char *why = NULL;
  fa_launcher hop = hopper_fwd(p, &why);
  if (hop && (c->pack > 1 || c->nsplit > 1)) {
    hop = NULL;
    why = "packed GQA and split-KV run on mma.sync";
  }
  last_plan = (fwd_plan){hop ? 1 : c->pack, hop ? 1 : c->nsplit};
  if (last_plan.pack != logged_plan.pack || last_plan.nsplit != logged_plan.nsplit) {
    logged_plan = last_plan;
    attn__log(ATTN_LOG_INFO, "cuda forward: %d query heads a CTA (packed GQA), %d key splits",
              last_plan.pack, last_plan.nsplit);
  }
  return launch_choice(&fwd_choice, hop, why, in->fwd, c, in);
}

attn_status attn_cuda_fwd(const attn_cuda_problem *p, attn_cuda_view o, float *lse,
                          int64_t lse_rows, void *workspace, size_t workspace_bytes,
                          void *stream) {
  ATTN_CHECK(attn_cuda_check(p));
  ATTN_CHECK(check_view("o", o, p->dtype == ATTN_F32));
  if (lse && lse_rows < p->q_row0 + p->sq)
    return attn__fail(ATTN_ERR_INVALID_ARG, "lse_rows=%lld is less than q_row0+sq=%lld",
                      (long long)lse_rows, (long long)(p->q_row0 + p->sq));
  fa_call c;
  memset(&c, 0, sizeof c);
  c.pb = p;
  c.o = o;
  c.lse = lse;
  c.lse_rows = lse_rows;
  c.stream = stream;
  ATTN_CHECK(carve(p, workspace, workspace_bytes, plan_of(p), &c));
  fwd_ablation(&c);
  return fwd_launch(p, &c);
}

const char *attn_cuda_fwd_path(const attn_cuda_problem *p) {
  const char *why = NULL;
  if (!p || !find_instance(p->Dqk, p->Dv, p->dtype, p->causal)) return "none";
  if (p->dtype == ATTN_F32) return "f32";
  return hopper_fwd(p, &why) && plan_pack(p) == 1 ? "sm90" : "mma";
}

const char *attn_cuda_last_fwd_path(void) { return fwd_choice.used; }

const char *attn_cuda_last_fwd_form(void) {
  static const char *const names[] = {[FA_FWD_FORM_8W] = "8w", [FA_FWD_FORM_4W] = "4w",
                                      [FA_FWD_FORM_2CTA] = "2cta", [FA_FWD_FORM_AB] = "ab",
                                      [FA_FWD_FORM_4X32] = "4x32", [FA_FWD_FORM_4S] = "4s",
                                      [FA_FWD_FORM_KS] = "ks"};
  return fwd_form_ran >= 0 ? names[fwd_form_ran] : "none";
}

const char *attn_cuda_last_bwd_form(void) {
  return bwd_stages_ran == FA_BWD_4S_STAGES ? "4s" : bwd_stages_ran ? "2s" : "none";
}

void attn_cuda_fwd_plan(const attn_cuda_problem *p, int *pack, int *nsplit) {
  const fwd_plan pl = p && find_instance(p->Dqk, p->Dv, p->dtype, p->causal) ? plan_of(p)
                                                                            : (fwd_plan){1, 1};
  *pack = pl.pack;
  *nsplit = pl.nsplit;
}

void attn_cuda_last_fwd_plan(int *pack, int *nsplit) {
  *pack = last_plan.pack;
  *nsplit = last_plan.nsplit;
}

static attn_status check_state(const attn_cuda_problem *p, const attn_state *st) {
  if (!st || !st->m || !st->l || !st->acc)
    return attn__fail(ATTN_ERR_INVALID_ARG, "state or one of its m/l/acc pointers is NULL");
  if ((uintptr_t)st->acc % 8)
    return attn__fail(ATTN_ERR_UNSUPPORTED, "state acc=%p is not 8-byte aligned", (void *)st->acc);
  if (p && (st->batch != p->B || st->heads != p->Hq || st->head_dim_v != p->Dv ||
            p->q_row0 + p->sq > st->rows))
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "state [B=%lld, Hq=%lld, rows=%lld, Dv=%lld] does not fit rows %lld..%lld "
                      "of B=%lld Hq=%lld Dv=%lld",
                      (long long)st->batch, (long long)st->heads, (long long)st->rows,
                      (long long)st->head_dim_v, (long long)p->q_row0,
                      (long long)(p->q_row0 + p->sq), (long long)p->B, (long long)p->Hq,
                      (long long)p->Dv);
  return ATTN_OK;
}

attn_status attn_cuda_fwd_block(const attn_cuda_problem *p, attn_state *st, void *workspace,
                                size_t workspace_bytes, void *stream) {
  ATTN_CHECK(attn_cuda_check(p));
  ATTN_CHECK(check_state(p, st));
  fa_call c;
  memset(&c, 0, sizeof c);
  c.pb = p;
  c.st = st;
  c.stream = stream;
  ATTN_CHECK(carve(p, workspace, workspace_bytes, plan_of(p), &c));
  return fwd_launch(p, &c);
}

attn_status attn_cuda_state_init(attn_state *st, void *stream) {
  ATTN_CHECK(check_state(NULL, st));
  return launched(attn_cuda__state_init(st, stream), "state init", NULL);
}

attn_status attn_cuda_state_merge(attn_state *dst, const attn_state *src, void *stream) {
  ATTN_CHECK(check_state(NULL, dst));
  ATTN_CHECK(check_state(NULL, src));
  if (dst->batch != src->batch || dst->heads != src->heads || dst->rows != src->rows ||
      dst->head_dim_v != src->head_dim_v)
    return attn__fail(ATTN_ERR_INVALID_ARG, "dst and src states have different sizes");
  return launched(attn_cuda__state_merge(dst, src, stream), "state merge", NULL);
}

attn_status attn_cuda_finalize(const attn_cuda_problem *p, const attn_state *st,
                               attn_cuda_view o, float *lse, void *stream) {
  if (!p) return attn__fail(ATTN_ERR_INVALID_ARG, "problem is NULL");
  ATTN_CHECK(check_dtype(p->dtype));
  ATTN_CHECK(check_state(NULL, st));
  if (st->batch != p->B || st->heads != p->Hq || st->head_dim_v != p->Dv)
    return attn__fail(ATTN_ERR_INVALID_ARG, "state [B=%lld, Hq=%lld, Dv=%lld] does not match "
                      "the problem's B=%lld Hq=%lld Dv=%lld",
                      (long long)st->batch, (long long)st->heads, (long long)st->head_dim_v,
                      (long long)p->B, (long long)p->Hq, (long long)p->Dv);
  ATTN_CHECK(check_view("o", o, p->dtype == ATTN_F32));
  return launched(attn_cuda__finalize(p, st, o, lse, stream), "state finalize", NULL);
}

attn_status attn_cuda_bwd_prepare(const attn_cuda_problem *p, attn_cuda_view o,
                                  attn_cuda_view dout, const float *lse, float *delta,
                                  float *dsinks, void *stream) {
  if (!p) return attn__fail(ATTN_ERR_INVALID_ARG, "problem is NULL");
  ATTN_CHECK(check_dtype(p->dtype));
  ATTN_CHECK(check_view("o", o, p->dtype == ATTN_F32));
  ATTN_CHECK(check_view("dout", dout, p->dtype == ATTN_F32));
  if (!lse || !delta) return attn__fail(ATTN_ERR_INVALID_ARG, "%s is NULL", !lse ? "lse" : "delta");
  if (p->sinks && p->Hq > 65535)
    return attn__fail(ATTN_ERR_UNSUPPORTED, "Hq=%lld is past the grid limit 65535", (long long)p->Hq);
  return launched(attn_cuda__bwd_prepare(p, o, dout, lse, delta, dsinks, stream),
                  "backward prepare", NULL);
}

attn_status attn_cuda_bwd_block(const attn_cuda_problem *p, attn_cuda_view dout,
                                const float *lse, const float *delta, int64_t lse_rows,
                                attn_cuda_view dq, attn_cuda_view dk, attn_cuda_view dv,
                                int deterministic, void *workspace, size_t workspace_bytes,
                                void *stream) {
  ATTN_CHECK(attn_cuda_check(p));
  if (p->kv_used || p->block_table)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "a KV cache (kv_used / block_table) is for the forward: the backward "
                      "takes K/V as [B, skv] rows");
  ATTN_CHECK(check_view("dout", dout, p->dtype == ATTN_F32));
  ATTN_CHECK(check_view("dq", dq, 1));
  ATTN_CHECK(check_view("dk", dk, 1));
  ATTN_CHECK(check_view("dv", dv, 1));
  if (!lse || !delta) return attn__fail(ATTN_ERR_INVALID_ARG, "%s is NULL", !lse ? "lse" : "delta");
  if (lse_rows < p->q_row0 + p->sq)
    return attn__fail(ATTN_ERR_INVALID_ARG, "lse_rows=%lld is less than q_row0+sq=%lld",
                      (long long)lse_rows, (long long)(p->q_row0 + p->sq));
  fa_call c;
  memset(&c, 0, sizeof c);
  c.pb = p;
  c.dout = dout;
  c.lse_in = lse;
  c.delta = delta;
  c.lse_rows = lse_rows;
  c.dq = dq;
  c.dk = dk;
  c.dv = dv;
  c.deterministic = deterministic != 0;
  c.stream = stream;
  ATTN_CHECK(carve(p, workspace, workspace_bytes, (fwd_plan){1, 1}, &c));
  const fa_instance *in = find_instance(p->Dqk, p->Dv, p->dtype, p->causal);
  bwd_stages_ran = 0;
  if (p->dtype == ATTN_F32) return launched(in->bwd(&c), "flash backward", in);
  const char *why = NULL;
  const fa_launcher hop = hopper_bwd(p, c.deterministic && !c.dq_sems, &why);
  return launch_choice(&bwd_choice, hop, why, in->bwd, &c, in);
}

const char *attn_cuda_bwd_path(const attn_cuda_problem *p, int deterministic) {
  const char *why = NULL;
  if (!p || !find_instance(p->Dqk, p->Dv, p->dtype, p->causal)) return "none";
  if (p->dtype == ATTN_F32) return "f32";
  (void)deterministic; /* with the workspace attn_cuda_workspace_bytes asks, either takes sm90 */
  return hopper_bwd(p, 0, &why) ? "sm90" : "mma";
}

const char *attn_cuda_last_bwd_path(void) { return bwd_choice.used; }
