/* grid.c — picks tp x cp and the ring layout from the flags, the problem and the rank
 * count, and refuses impossible grids with a sentence that says what to change.
 *
 * --mode auto on more than one rank: tensor parallelism splits heads with no K/V
 * exchange at all, so it goes first, up to the largest divisor of the rank count that
 * the heads allow; the remaining factor goes to context parallelism. From GRID_LONG_SEQ
 * keys on it goes first instead (tp = 1, cp = all ranks): K/V of the full sequence per
 * rank is what stops long runs, and only a CP mode (ring or split-KV) cuts it.
 *
 * Split-KV (context-parallel decode) cuts K/V without cutting the queries: each CP rank
 * folds its keys into a state for every query row, and the states are gathered. Auto
 * takes it over the ring whenever those states are smaller than the K/V the ring carries
 * (few queries, many keys: decode, chunked prefill), and when the queries are too few to
 * give every ring chunk a row. */
#include "grid.h"
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Hq splits over tp, and Hkv either splits or each rank's query heads share one KV head. */
static int heads_fit(int32_t hq, int32_t hkv, int32_t tp) {
  return hq % tp == 0 && (hkv % tp == 0 || tp % hkv == 0);
}

static int32_t largest_tp(int ranks, int32_t hq, int32_t hkv) {
  int32_t best = 1;
  for (int32_t t = 1; t <= ranks; t++)
    if (ranks % t == 0 && heads_fit(hq, hkv, t)) best = t;
  return best;
}

static void choose_auto(const attn_spec *s, int64_t seq_kv, int ranks, grid *g) {
  if (seq_kv >= GRID_LONG_SEQ) {
    g->tp = 1, g->cp = ranks;
    snprintf(g->why, sizeof g->why,
             "auto: %lld keys >= %d, so context parallelism goes first: it cuts K/V of the "
             "sequence, which stops long runs (tp=1 x cp=%d)",
             (long long)seq_kv, GRID_LONG_SEQ, ranks);
    return;
  }
  g->tp = largest_tp(ranks, s->num_heads_q, s->num_heads_kv);
  g->cp = ranks / g->tp;
  snprintf(g->why, sizeof g->why,
           "auto: Hq=%d/Hkv=%d split over tp=%d (heads need no K/V exchange), the remaining "
           "factor %d goes to the ring (cp=%d); sequences >= %d keys put the ring first",
           s->num_heads_q, s->num_heads_kv, g->tp, g->cp, g->cp, GRID_LONG_SEQ);
}

/* tp and cp from the flags and the mode. */
static void choose_sizes(const run_args *a, const attn_spec *s, int64_t seq_kv, int ranks,
                         grid *g) {
  int gt = (a->given & GIVEN_TP) != 0, gc = (a->given & GIVEN_CP) != 0;
  g->why[0] = '\0';
  if (gt || gc) {
    g->tp = gt ? a->tp : (a->cp > 0 && ranks % a->cp == 0 ? ranks / a->cp : 0);
    g->cp = gc ? a->cp : (a->tp > 0 && ranks % a->tp == 0 ? ranks / a->tp : 0);
    snprintf(g->why, sizeof g->why, "tp=%d x cp=%d from the flags", g->tp, g->cp);
  } else if (a->mode == MODE_RING) {
    g->tp = 1, g->cp = ranks;
    snprintf(g->why, sizeof g->why, "--mode ring: every rank on the ring (cp=%d)", ranks);
  } else if (a->mode == MODE_SPLIT_KV) {
    g->tp = 1, g->cp = ranks;
    snprintf(g->why, sizeof g->why,
             "--mode split-kv: every rank holds all queries and a cut of K/V (cp=%d)", ranks);
  } else if (a->mode == MODE_TP || args_kv_cache(a)) {
    g->tp = ranks, g->cp = 1;
    snprintf(g->why, sizeof g->why, "%s: heads over every rank (tp=%d)",
             a->mode == MODE_TP ? "--mode tp" : "a KV cache (plain attention)", ranks);
  } else {
    choose_auto(s, seq_kv, ranks, g);
  }
}

static int check_sizes(const run_args *a, const attn_spec *s, int ranks, const grid *g,
                       char *err, size_t errlen) {
  if (g->tp < 1 || g->cp < 1)
    return launch_fail(err, errlen, "%s %d does not divide the %d ranks of the job (mpirun -np %d)",
                (a->given & GIVEN_TP) ? "--tp" : "--cp",
                (a->given & GIVEN_TP) ? a->tp : a->cp, ranks, ranks);
  if ((int64_t)g->tp * g->cp != ranks)
    return launch_fail(err, errlen,
                "--tp %d x --cp %d = %d ranks, but the job has %d (mpirun -np): tp*cp must "
                "equal the number of ranks",
                g->tp, g->cp, g->tp * g->cp, ranks);
  if (s->num_heads_q % g->tp)
    return launch_fail(err, errlen,
                "--heads %d is not divisible by tp=%d: each TP rank holds whole query heads "
                "(use a tp that divides the heads, or more --cp)",
                s->num_heads_q, g->tp);
  if (!heads_fit(s->num_heads_q, s->num_heads_kv, g->tp))
    return launch_fail(err, errlen,
                "--kv-heads %d cannot be shared by tp=%d: need Hkv %% tp == 0 (split) or "
                "tp %% Hkv == 0 (replicated)",
                s->num_heads_kv, g->tp);
  return 0;
}

/* Bytes one rank receives per forward: split-KV's states of the other cp-1 ranks, against
 * the ring's K/V of the other ranks (at 2 bytes an element: bf16, the smallest). */
static double split_bytes(const attn_spec *s, int64_t seq_q, int32_t cp) {
  int64_t dv = s->head_dim_v ? s->head_dim_v : s->head_dim_qk;
  return 4.0 * (cp - 1) * (double)s->num_heads_q * (double)seq_q * (double)(dv + 2);
}
static double ring_bytes(const attn_spec *s, int64_t seq_kv, int32_t cp) {
  int64_t dv = s->head_dim_v ? s->head_dim_v : s->head_dim_qk;
  return 2.0 * (cp - 1) / cp * (double)seq_kv * s->num_heads_kv * (double)(s->head_dim_qk + dv);
}

/* Split-KV or the ring, for cp > 1 (or --mode split-kv). */
static int choose_split(const run_args *a, const attn_spec *s, int64_t seq_q, int64_t seq_kv,
                        grid *g, char *err, size_t errlen) {
  size_t n = strlen(g->why);
  if (a->mode == MODE_SPLIT_KV) {
    if (g->layer)
      return launch_fail(err, errlen,
                         "--mode split-kv runs attention alone; the layer (--d-model) takes "
                         "--mode tp, ring or auto");
    g->split_kv = 1;
    return 0;
  }
  if (a->mode == MODE_RING || g->layer) return 0;
  const int64_t chunks = 2 * (int64_t)g->cp; /* zigzag's; causal runs may need them */
  const double sb = split_bytes(s, seq_q, g->cp), rb = ring_bytes(s, seq_kv, g->cp);
  if (seq_q < chunks || sb < rb) {
    g->split_kv = 1;
    if (seq_q < chunks)
      snprintf(g->why + n, sizeof g->why - n,
               "; split-kv: %lld query rows are too few to cut over cp=%d", (long long)seq_q,
               g->cp);
    else
      snprintf(g->why + n, sizeof g->why - n,
               "; split-kv: its states (%.3g MB a rank) are smaller than the K/V the ring "
               "carries (%.3g MB)",
               sb / 1e6, rb / 1e6);
  } else {
    snprintf(g->why + n, sizeof g->why - n,
             "; ring: the K/V it carries (%.3g MB a rank) are no more than split-kv's states "
             "(%.3g MB)",
             rb / 1e6, sb / 1e6);
  }
  return 0;
}

static void choose_layout(const run_args *a, const attn_spec *s, int64_t seq_q, int64_t seq_kv,
                          grid *g) {
  const char *why;
  int64_t chunk = seq_kv / (2 * (int64_t)g->cp);
  if (a->given & GIVEN_LAYOUT) {
    g->layout = a->layout;
    why = "from --layout";
  } else if (g->cp == 1) {
    g->layout = ATTN_LAYOUT_CONTIGUOUS;
    why = "one CP rank";
  } else if (s->causal && s->window_left >= 0 && s->window_left < chunk) {
    g->layout = ATTN_LAYOUT_CONTIGUOUS;
    why = "causal, but the window is shorter than a zigzag chunk: the contiguous cut is "
          "balanced already and needs only the neighbour's keys";
  } else if (g->split_kv && s->causal && seq_kv >= 2 * (int64_t)g->cp && seq_q > chunk) {
    g->layout = ATTN_LAYOUT_ZIGZAG;
    why = "split-kv, causal over more rows than a zigzag chunk: zigzag balances the triangle";
  } else if (g->split_kv) {
    g->layout = ATTN_LAYOUT_CONTIGUOUS;
    why = s->causal ? "split-kv, and the queries span at most a chunk: all but the last "
                      "chunk's keys are seen by every query"
                    : "split-kv, not causal: every cut is balanced";
  } else if (s->causal && (seq_q < 2 * (int64_t)g->cp || seq_kv < 2 * (int64_t)g->cp)) {
    g->layout = ATTN_LAYOUT_CONTIGUOUS;
    why = "causal, but the sequence has fewer rows than zigzag's 2cp chunks";
  } else if (s->causal) {
    g->layout = ATTN_LAYOUT_ZIGZAG;
    why = "causal: zigzag (chunks i and 2cp-1-i) balances the triangle";
  } else {
    g->layout = ATTN_LAYOUT_CONTIGUOUS;
    why = "not causal: every cut is balanced";
  }
  size_t n = strlen(g->why);
  snprintf(g->why + n, sizeof g->why - n, "%slayout %s (%s)", n ? "; " : "",
           g->layout == ATTN_LAYOUT_ZIGZAG ? "zigzag" : "contiguous", why);
}

static int check_rows(const grid *g, int64_t seq_q, int64_t seq_kv, char *err, size_t errlen) {
  int64_t chunks = (int64_t)g->cp * (g->layout == ATTN_LAYOUT_ZIGZAG ? 2 : 1);
  const char *layout = g->layout == ATTN_LAYOUT_ZIGZAG ? "zigzag" : "contiguous";
  if (g->split_kv && seq_kv < chunks)
    return launch_fail(err, errlen,
                "split-kv: the keys (Skv=%lld) are fewer than the %lld chunks of cp=%d (%s): "
                "every chunk needs a row; use fewer ranks or a longer --seq-kv",
                (long long)seq_kv, (long long)chunks, g->cp, layout);
  if (!g->split_kv && (seq_q < chunks || seq_kv < chunks))
    return launch_fail(err, errlen,
                "the sequence (Sq=%lld, Skv=%lld) is shorter than the %lld chunks of cp=%d "
                "(%s): every chunk needs a row; use fewer ranks or a longer --seq%s",
                (long long)seq_q, (long long)seq_kv, (long long)chunks, g->cp, layout,
                seq_q < chunks && seq_kv >= chunks
                    ? " (or --mode split-kv, which cuts only the keys)"
                    : "");
  return 0;
}

static void my_heads(const attn_spec *s, grid *g) {
  g->hq = s->num_heads_q / g->tp;
  g->hq0 = g->tp_rank * g->hq;
  if (s->num_heads_kv % g->tp == 0) {
    g->hk = s->num_heads_kv / g->tp;
    g->hk0 = g->tp_rank * g->hk;
  } else { /* replicated: this rank's query heads all read one KV head */
    g->hk = 1;
    g->hk0 = g->hq0 / (s->num_heads_q / s->num_heads_kv);
  }
}

int grid_choose(const run_args *a, const attn_spec *s, int64_t seq_q, int64_t seq_kv, int ranks,
                int rank, grid *g, char *err, size_t errlen) {
  memset(g, 0, sizeof *g);
  g->layer = a->d_model > 0;
  int flags = (a->given & (GIVEN_TP | GIVEN_CP)) != 0;
  if (ranks == 1 && a->mode == MODE_AUTO && !flags && !g->layer) {
    g->single = 1, g->tp = g->cp = 1;
    g->hq = s->num_heads_q, g->hk = s->num_heads_kv;
    snprintf(g->why, sizeof g->why, "one rank: plain attention");
    return 0;
  }
  choose_sizes(a, s, seq_kv, ranks, g);
  if (check_sizes(a, s, ranks, g, err, errlen)) return -1;
  if ((g->cp > 1 || a->mode == MODE_SPLIT_KV) && choose_split(a, s, seq_q, seq_kv, g, err, errlen))
    return -1;
  choose_layout(a, s, seq_q, seq_kv, g);
  if (check_rows(g, seq_q, seq_kv, err, errlen)) return -1;
  g->tp_rank = rank % g->tp;
  g->cp_rank = rank / g->tp;
  my_heads(s, g);
  return 0;
}

const char *grid_mode_name(const grid *g) {
  if (g->single) return "single";
  if (g->layer) return g->cp == 1 ? "tp layer" : g->tp == 1 ? "ring layer" : "tp x ring layer";
  if (g->split_kv) return g->tp == 1 ? "split-kv" : "tp x split-kv";
  return g->cp == 1 ? "tp" : g->tp == 1 ? "ring" : "tp x ring";
}
