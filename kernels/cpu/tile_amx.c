/* tile_amx.c — the bf16 tile kernels on Intel AMX (AMX-BF16, Sapphire Rapids and
 * later): S^T = K·Q^T and O += P·V as bf16 tile products with float32 accumulation, the
 * online softmax in AVX-512 between them. P is rounded to bf16 for P·V, as GPU flash
 * kernels do, so results differ from the float32 path by that rounding (the 2x rule).
 * Compiled with -mamx-tile -mamx-bf16 -mavx512bf16 in this unit only; picked at run time
 * when CPUID says AMX-BF16 and the kernel grants the tile data state (arch_prctl).
 *
 * The backward's five products run there too, from P and dS rounded to bf16 (as FlashAttention's
 * kernels do): S^T = K·Q^T, dP^T = V·dO^T, dV += P^T·dO, dK += dS^T·Q, dQ += dS·K.
 *
 * Every tile register is 16 rows x 64 bytes: C 16 x 16 float32, A 16 x 32 bf16, B 16
 * pairs x 16 columns x 2 bf16 ("VNNI": B[k][n] at row k/2, element 2n + k%2). Blocking is
 * 2 x 2 C tiles (0..3) fed by A tiles 4, 5 and B tiles 6, 7. */
#include "bf16_tiles.h"

#include <cpuid.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ROWB 64 /* bytes of a tile row */

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_config;

/* A constant in memory: GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes only,
 * so a config built on the stack just before it loses its stores. */
static const amx_config amx_cfg = {
    1, 0, {0}, {AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB},
    {16, 16, 16, 16, 16, 16, 16, 16}};

static void amx_begin(void) { _tile_loadconfig(&amx_cfg); }

static void amx_end(void) { _tile_release(); }

/* S^T rows [j0, j0 + 32) x lanes [i0, i0 + 16·(1 + two)) = K rows kb (stride ks elements)
 * · Q^T from qv. */
static inline void scores_block(float *S, const uint16_t *kb, int64_t ks, const uint16_t *qv,
                                int i0, int two, int D) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int d0 = 0; d0 < D; d0 += 32) {
    const uint16_t *qb = qv + (size_t)(d0 / 2) * CPU_BR * 2 + (size_t)i0 * 2;
    _tile_loadd(4, kb + d0, ks * 2);
    _tile_loadd(5, kb + 16 * ks + d0, ks * 2);
    _tile_loadd(6, qb, CPU_BR * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if (two) {
      _tile_loadd(7, qb + 32, CPU_BR * 4);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, S + i0, CPU_BR * 4);
  _tile_stored(2, S + 16 * CPU_BR + i0, CPU_BR * 4);
  if (two) {
    _tile_stored(1, S + i0 + 16, CPU_BR * 4);
    _tile_stored(3, S + 16 * CPU_BR + i0 + 16, CPU_BR * 4);
  }
}

static void amx_scores(float *S, const uint16_t *k, int64_t ldk, int nj, const uint16_t *qv,
                       int lanes, int D, uint16_t *kpad) {
  for (int j0 = 0; j0 < nj; j0 += 32) {
    const uint16_t *kb = k + j0 * ldk;
    int64_t ks = ldk;
    if (nj - j0 < 32) { /* the last keys, then zero keys: never read past row nj - 1 */
      for (int r = 0; r < 32; r++)
        if (j0 + r < nj) memcpy(kpad + r * D, kb + r * ldk, (size_t)D * 2);
        else memset(kpad + r * D, 0, (size_t)D * 2);
      kb = kpad;
      ks = D;
    }
    for (int i0 = 0; i0 < lanes; i0 += 32)
      scores_block(S + (size_t)j0 * CPU_BR, kb, ks, qv, i0, lanes - i0 >= 32, D);
  }
}

/* C rows [i0, i0 + 16·(1 + two)) x columns [n0, n0 + 32) += A · B over K. */
static inline void gemm_block(float *C, int64_t ldc, const uint16_t *A, int64_t lda,
                              const uint16_t *B, int N, int K, int i0, int n0, int two) {
  float *c = C + (size_t)i0 * ldc + n0;
  _tile_loadd(0, c, ldc * 4);
  _tile_loadd(1, c + 16, ldc * 4);
  if (two) {
    _tile_loadd(2, c + 16 * ldc, ldc * 4);
    _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
  }
  for (int k0 = 0; k0 < K; k0 += 32) {
    const uint16_t *pa = A + (size_t)i0 * lda + k0, *vb = B + (size_t)(k0 / 2) * N * 2 + 2 * n0;
    _tile_loadd(4, pa, lda * 2);
    _tile_loadd(6, vb, N * 4);
    _tile_loadd(7, vb + 32, N * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, pa + 16 * lda, lda * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  if (two) {
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
  }
}

static void amx_gemm(float *C, int64_t ldc, const uint16_t *A, int64_t lda, const uint16_t *B,
                     int M, int N, int K) {
  for (int i0 = 0; i0 < M; i0 += 32)
    for (int n0 = 0; n0 < N; n0 += 32) gemm_block(C, ldc, A, lda, B, N, K, i0, n0, M - i0 >= 32);
}

static void amx_pv(float *O, int D, const uint16_t *P, const uint16_t *vv, const uint16_t *v,
                  int64_t ldv, int nj, int lanes, const float *alpha, int safe) {
  attn__bf16_pv(O, D, P, vv, v, ldv, nj, lanes, alpha, safe, amx_gemm);
}

/* ---- availability -------------------------------------------------------------------- */
#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
  const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return;
  const int avx512bf16 = (a >> 5) & 1;
  if (!tile || !bf16 || !avx512bf16) return;
  /* the kernel enables the tile data state per process, on request */
  amx_ok = syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) == 0;
}

static const cpu_bf16_ops amx_ops = {
    "amx",           32,                amx_begin,         amx_end,    attn__bf16_pack_q, amx_scores,
    attn__bf16_softmax, amx_pv, attn__bf16_pack_lanes, attn__bf16_pack_pairs, amx_gemm,
    attn__bf16_probs, attn__bf16_dscores};

const cpu_bf16_ops *attn__cpu_amx(void) {
  pthread_once(&amx_once, amx_probe);
  return amx_ok ? &amx_ops : NULL;
}
