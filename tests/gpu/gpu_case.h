/* gpu_case.h — the CUDA-kernels-vs-oracle harness: describe a case, generate bf16/f16
 * (or float32) inputs, run the attn_cuda_* launchers on poisoned device outputs, compute
 * the float64 oracle (kernels/ref) and a naive same-precision reference on the host, and
 * judge bf16/f16 by FlashAttention's rule (error <= 2 x the naive error + a tiny atol),
 * float32 like the CPU backend (relative to max|ref|). Device memory goes through td_*
 * (gpu_device.h), so the same harness runs on a GPU or on the emulator. */
#ifndef ATTN_GPU_CASE_H
#define ATTN_GPU_CASE_H

#include "attnrun.h"
#include "cuda_attn.h"
#include "gpu_device.h"
#include "ref.h"
#include "test_util.h"

typedef struct {
  const char *name;
  int64_t B, Sq, Skv; /* ignored with varlen (B = 1, lengths from lq / lkv) */
  int Hq, Hkv, D;     /* Dqk = D */
  int Dv;             /* 0: D */
  int dtype;          /* ATTN_BF16, ATTN_F16 or ATTN_F32 */
  int causal;
  int window; /* on: wl, wr (each -1 = unbounded side) */
  int64_t wl, wr;
  float softcap, scale;
  int sinks, alibi;
  int nseq; /* varlen: lengths in lq / lkv */
  const int32_t *lq, *lkv;
  int bq, bk;               /* block mask block sizes (0: none); random blocks, ~2/3 visible */
  int mask_short;           /* the mask covers one block fewer than needed each way */
  const uint8_t *mask_bits; /* the mask itself instead of random blocks */
  int bhsd;                 /* device tensors in [B, H, S, D] memory order */
  double amp;               /* q, k drawn from [-amp, amp) (0 → 1) */
  uint64_t seed;
} gc_case;

typedef struct {
  gc_case c;
  int64_t B, Sq, Skv, Hq, Hkv, D, Dv; /* D = Dqk */
  attn_spec spec; /* host pointers, for the oracle */
  attn_block_mask bm;
  uint8_t *mask;
  int32_t *cu_q, *cu_kv;
  float *sinks, *alibi;     /* [Hq] */
  float *q, *k;             /* [B,S,H,D], values exactly representable in the dtype */
  float *v, *dout;          /* [B,S,H,Dv] */
  uint8_t *vis;             /* [Sq][Skv] visibility (same for every batch and head) */
  /* device copies */
  void *dq_in, *dk_in, *dv_in, *ddo;
  float *d_sinks, *d_alibi;
  int32_t *d_cu_q, *d_cu_kv;
  uint8_t *d_mask;
  void *d_o;     /* forward output [B,Sq,Hq,Dv] in the dtype (device layout) */
  float *d_lse;  /* [B,Hq,Sq] */
  void *d_ws;
  size_t ws_bytes;
  attn_cuda_problem pb;
  /* references (NULL until gc_ref) */
  double *ro, *rlse, *rdq, *rdk, *rdv, *rds;
  float *no, *nlse, *ndq, *ndk, *ndv, *nds; /* naive same-precision */
} gc_prob;

typedef struct {
  float *o, *lse, *dq, *dk, *dv, *ds; /* host, gathered to [B,S,H,D or Dv]; lse [B,Hq,Sq] */
} gc_out;

int64_t gc_n_q(const gc_prob *P); /* elements of q, dq */
int64_t gc_n_o(const gc_prob *P); /* of o, dout */
int64_t gc_n_k(const gc_prob *P); /* of k, dk */
int64_t gc_n_v(const gc_prob *P); /* of v, dv */
int64_t gc_n_lse(const gc_prob *P);
/* Bytes of one element of the case's dtype on the device. */
size_t gc_elem_bytes(const gc_prob *P);

void gc_init(gc_prob *P, const gc_case *c);
void gc_free(gc_prob *P);
void gc_out_free(gc_out *o);
void gc_describe(const gc_case *c, char *buf, size_t n);
/* After editing P->q/k/v/dout (values must be representable): re-upload, drop refs. */
void gc_sync(gc_prob *P);

/* A device view of tensor [B, S, H, D] stored at p in the case's memory order. */
attn_cuda_view gc_view(const gc_prob *P, void *p, int64_t S, int64_t H, int64_t D);
/* Downloads a device tensor (the dtype, case order) to host floats [B,S,H,D]. */
void gc_download_elems(const gc_prob *P, const void *dev, int64_t S, int64_t H, int64_t D,
                       float *out);
/* Downloads a float32 device tensor (case order) to host [B,S,H,D]. */
void gc_download_f32(const gc_prob *P, const float *dev, int64_t S, int64_t H, int64_t D,
                     float *out);

/* The main of a multi-part CUDA test: exit 77 without a device; *small set on the
 * emulator unless ATTN_EMU_FULL=1 (the GPU's full case lists, slow); then the part named
 * by argv[1] (default first_part) by tu_run_parts. */
int gc_run_parts(const char *test, int argc, char **argv, const tu_part *parts, int count,
                 const char *first_part, int *small);
/* A TU_CHECK failure naming the call, the status, attn_last_error() and the case, unless
 * st is ATTN_OK. */
void gc_expect_ok(attn_status st, const char *what, const gc_case *c);
/* One-shot forward into P->d_o / P->d_lse (poisoned first); out->o, out->lse. */
attn_status gc_fwd(gc_prob *P, gc_out *out);
/* O and LSE from state st (attn_cuda_finalize) into P->d_o / P->d_lse (poisoned first);
 * out->o, out->lse as gc_fwd. */
attn_status gc_finalize(gc_prob *P, const attn_state *st, gc_out *out);
/* The backward of P (after gc_fwd) into the given float32 gradient views (zeroed by the
 * caller), and d(sinks) into ds_out [Hq]: attn_cuda_bwd_prepare + attn_cuda_bwd_block. */
attn_status gc_bwd_views(gc_prob *P, attn_cuda_view dq, attn_cuda_view dk, attn_cuda_view dv,
                         int deterministic, float *ds_out);
/* Backward from P->d_o / P->d_lse (run gc_fwd first); out->dq, dk, dv, ds. */
attn_status gc_bwd(gc_prob *P, gc_out *out, int deterministic);
/* Oracle and naive references. */
void gc_ref(gc_prob *P, int bwd);
/* Judges out against the references (bf16/f16: the 2x rule; float32: relative to
 * max|ref| as the CPU backend's tests do); prints the case on failure.
 * Returns 1 when everything passes. */
int gc_check(gc_prob *P, const gc_out *out, int bwd, const char *tag);
/* One tensor: got vs the oracle ref, with naive the same-precision reference. */
int gc_judge(const char *what, const float *got, const double *ref, const float *naive,
             int64_t n, const int64_t *dims);

/* The same with an extra absolute tolerance. */
int gc_judge_tol(const char *what, const float *got, const double *ref, const float *naive,
                 int64_t n, const int64_t *dims, double extra);

/* Rows of P that see no key (P->vis). */
int64_t gc_empty_rows(const gc_prob *P);
/* Fills the K and V rows of keys that no row of P sees, on the host copies, with k_odd /
 * k_even and v_odd / v_even by the key's parity (non-finite values: the NaN/Inf rule);
 * the caller uploads (gc_sync). Returns how many keys were planted. */
int64_t gc_plant_unseen(gc_prob *P, float k_odd, float k_even, float v_odd, float v_even);

/* The hd128 bf16/f16 case of flag mask m (0-31), for the sm90 sweeps: bit 0 causal, 1
 * ALiBi and a window (left wide_left, or 20 with bit 2; right 33, or none when causal),
 * 2 softcap and f16, 3 sinks and [B,H,S,D] views, 4 MQA (else GQA 4:2). */
gc_case gc_flags_case(const char *name, int m, int64_t sq, int64_t skv, int64_t wide_left);

/* 1 when this build has bf16/f16 kernels for the case's head dims (attn_cuda_head_dims;
 * float32: always). */
int gc_have_dims(const gc_case *c);
/* The exact values of the rows of P that see no key, after a forward (and a backward
 * when out->dq is set): O = 0, LSE = -inf or the head's sink, dQ = 0. Returns how many
 * are wrong. */
int64_t gc_empty_wrong(const gc_prob *P, const gc_out *out);
/* What a case is meant to contain (gc_expect_empty): rows that see no key, planted keys
 * that no row sees. */
enum { GC_EXPECT_EMPTY_ROWS = 1, GC_EXPECT_UNSEEN_KEYS = 2 };
/* After a call that gc_check judged (judged: its result): the exact values of the empty
 * rows (gc_empty_wrong; empties counted by gc_empty_rows before it), and that the case
 * has what expect says (planted: gc_plant_unseen's count). Failures count as TU_CHECKs. */
void gc_expect_empty(const gc_prob *P, const gc_out *out, const gc_case *c, int judged,
                     int64_t empties, int64_t planted, int expect);
/* Key Skv / 2 made hot on the host copies (bf16 only: f16 cannot hold it): its score
 * overflows to +inf (1e30 x 1e10 in the first column) exactly for the rows that must not
 * see it, the first column of every other q and k row 0. The caller uploads (gc_sync).
 * Returns how many rows do not see the hot key. */
int64_t gc_make_hot(gc_prob *P);

#endif
