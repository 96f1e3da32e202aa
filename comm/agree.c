/* agree.c — the pre-flight fingerprint: every rank contributes the named values it
 * believes (shapes, flags, version), all of them are gathered, and every rank derives the
 * same verdict, so ranks that disagree fail together with one message instead of hanging
 * in the first collective. Also formats lists of ranks for messages. */
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Gathered per rank: field count, a hash of the field names, the values. */
enum { FP_COUNT = 0, FP_NAMES = 1, FP_VALUES = 2, FP_WORDS = 2 + ATTN_FP_FIELDS };
enum { MAX_DISTINCT = 4 }; /* distinct values named in a message; more are summarised */

void attn__fp_add(attn__fingerprint *fp, const char *name, int64_t value) {
  if (fp->count >= 0 && fp->count < ATTN_FP_FIELDS) {
    fp->names[fp->count] = name;
    fp->values[fp->count] = value;
  }
  fp->count++; /* past ATTN_FP_FIELDS: reported by attn__comm_agree */
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

void attn__rank_list(char *buf, size_t cap, const int *ranks, int n) {
  int *s = malloc((n > 0 ? (size_t)n : 1) * sizeof *s);
  size_t k = (size_t)snprintf(buf, cap, "%s", n == 1 ? "rank " : "ranks ");
  if (!s) return;
  memcpy(s, ranks, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_int);
  for (int i = 0; i < n && k < cap; i++) {
    int j = i;
    while (j + 1 < n && s[j + 1] == s[j] + 1 && s[i] >= 0) j++;
    const char *sep = i ? ", " : "";
    if (s[i] < 0) k += (size_t)snprintf(buf + k, cap - k, "%s?", sep);
    else if (j == i) k += (size_t)snprintf(buf + k, cap - k, "%s%d", sep, s[i]);
    else k += (size_t)snprintf(buf + k, cap - k, "%s%d..%d", sep, s[i], s[j]);
    i = j;
  }
  free(s);
}

/* FNV-1a over the field names: ranks built from different code disagree here. */
static int64_t names_hash(const attn__fingerprint *fp, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    for (const char *p = fp->names[i] ? fp->names[i] : ""; *p; p++)
      h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;
  }
  return (int64_t)h;
}

/* "ranks disagree on <label>: ranks 0..2 have 4096, rank 3 has 4095" from column col. */
static attn_status describe(const attn__comm *c, const int64_t *all, int col, const char *label) {
  char msg[900];
  int n = c->size, ndistinct = 0, covered = 0, *members = malloc((size_t)n * sizeof *members);
  int64_t seen[MAX_DISTINCT];
  size_t k = (size_t)snprintf(msg, sizeof msg, "ranks disagree on %s:", label);
  for (int r = 0; r < n && members && ndistinct < MAX_DISTINCT; r++) {
    int64_t v = all[(size_t)r * FP_WORDS + (size_t)col];
    int known = 0;
    for (int d = 0; d < ndistinct; d++) known |= seen[d] == v;
    if (known) continue;
    seen[ndistinct++] = v;
    int m = 0;
    for (int q = r; q < n; q++)
      if (all[(size_t)q * FP_WORDS + (size_t)col] == v) members[m++] = c->world_ranks[q];
    covered += m;
    char who[256];
    attn__rank_list(who, sizeof who, members, m);
    if (k < sizeof msg)
      k += (size_t)snprintf(msg + k, sizeof msg - k, "%s %s %s %lld", ndistinct > 1 ? "," : "",
                            who, m == 1 ? "has" : "have", (long long)v);
  }
  if (covered < n && k < sizeof msg)
    snprintf(msg + k, sizeof msg - k, ", and %d more ranks other values", n - covered);
  free(members);
  return attn__fail(ATTN_ERR_MISMATCH, "%s", msg);
}

static int column_agrees(const attn__comm *c, const int64_t *all, int col) {
  for (int r = 1; r < c->size; r++)
    if (all[(size_t)r * FP_WORDS + (size_t)col] != all[col]) return 0;
  return 1;
}

/* The same verdict on every rank: all decisions use only the gathered data. */
static attn_status verdict(const attn__comm *c, const attn__fingerprint *fp, const int64_t *all) {
  if (!column_agrees(c, all, FP_COUNT))
    return describe(c, all, FP_COUNT, "the number of fingerprint fields (different attnrun builds?)");
  if (all[FP_COUNT] > ATTN_FP_FIELDS || all[FP_COUNT] < 0)
    return attn__fail(ATTN_ERR_INTERNAL, "fingerprint has %lld fields; at most ATTN_FP_FIELDS=%d",
                      (long long)all[FP_COUNT], ATTN_FP_FIELDS);
  if (!column_agrees(c, all, FP_NAMES))
    return describe(c, all, FP_NAMES, "the fingerprint field names (different attnrun builds?)");
  for (int i = 0; i < (int)all[FP_COUNT]; i++)
    if (!column_agrees(c, all, FP_VALUES + i))
      return describe(c, all, FP_VALUES + i, fp->names[i] ? fp->names[i] : "?");
  return ATTN_OK;
}

attn_status attn__comm_agree(attn__comm *c, const attn__fingerprint *fp) {
  if (!c || !fp)
    return attn__fail(ATTN_ERR_INVALID_ARG, "agree: communicator %p or fingerprint %p is NULL",
                      (void *)c, (const void *)fp);
  int n = fp->count < 0 ? 0 : fp->count > ATTN_FP_FIELDS ? ATTN_FP_FIELDS : fp->count;
  int64_t mine[FP_WORDS] = {fp->count, names_hash(fp, n)};
  memcpy(mine + FP_VALUES, fp->values, (size_t)n * sizeof(int64_t));
  int64_t *all = malloc((size_t)c->size * sizeof mine);
  if (!all) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "agree: %d fingerprints", c->size);
  attn_status st = c->ops->allgather(c, mine, all, (int64_t)sizeof mine);
  if (st == ATTN_OK) st = verdict(c, fp, all);
  free(all);
  return st;
}
