/* rank_check.h — CHECK / CHECK_OK for the multi-rank tests: a failed check prints the rank,
 * the place and a message, and counts in nfail, so every rank finishes and reports. The
 * including file defines `static int wrank, nfail;` (this rank, the failures so far). */
#ifndef ATTN_TEST_RANK_CHECK_H
#define ATTN_TEST_RANK_CHECK_H

#include <stdio.h>

#define CHECK(cond, ...)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "[rank %d] %s:%d: CHECK(%s) failed: ", wrank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                       \
      fputc('\n', stderr);                                                                \
      nfail++;                                                                            \
    }                                                                                     \
  } while (0)
/* expr returns an attn_status that must be ATTN_OK (attnrun.h) */
#define CHECK_OK(expr)                                                                    \
  do {                                                                                    \
    attn_status s_ = (expr);                                                              \
    CHECK(s_ == ATTN_OK, "%s -> %s: %s", #expr, attn_status_string(s_), attn_last_error()); \
  } while (0)

#endif
