/* report.h — what attnrun prints: the header (problem, backend), the result table, the
 * check summary, and the --json record (one JSON object per line, appended). */
#ifndef ATTNRUN_LAUNCH_REPORT_H
#define ATTNRUN_LAUNCH_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "args.h"
#include "check.h"
#include "problem.h"
#include "run.h"

typedef struct {
  const run_args *a;
  const problem *p;
  const run_result *r;
  const check_report *check; /* NULL without --check */
  const char *backend_name;
  int threads;
  int64_t peak_rss_bytes;
} report_data;

/* Peak resident set size of this process (VmHWM; getrusage as a fallback), bytes. */
int64_t report_peak_rss(void);

void report_header(FILE *out, const report_data *d);
void report_table(FILE *out, const report_data *d);
void report_check(FILE *out, const check_report *c);

/* Appends one JSON line to path. 0 on success, else -1 with errno set. */
int report_json(const char *path, const report_data *d);

#endif
