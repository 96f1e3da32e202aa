/* cli_npy_compare.c — compares the .npy files two `attnrun --save` runs wrote (say one
 * rank and a ring of four): per file the largest |a - b| relative to max|b|, and whether
 * the bytes are identical. Exits 1 when a file is missing, differs in shape, or exceeds
 * its tolerance.
 * usage: cli_npy_compare DIR_A DIR_B [--rtol R] [--exact f1,f2,..] file.npy...
 *   --rtol R     relative tolerance (default 1e-6) for the files listed after the flags
 *   --exact L    files that must be bitwise identical (e.g. the inputs) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

typedef struct {
  double max_abs, max_ref, rel;
  int64_t worst, count;
  int identical;
} diff;

static int load(const char *dir, const char *name, npy_header *h, void **data) {
  char path[4096], err[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  npy_dtype dt = strncmp(name, "cu_seqlens", 10) == 0 ? NPY_I32 : NPY_F32;
  if (npy_read_all(path, dt, h, data, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return -1;
  }
  return 0;
}

static int same_shape(const npy_header *a, const npy_header *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

static diff compare(const npy_header *h, const void *x, const void *y) {
  diff d = {0, 0, 0, -1, h->count, memcmp(x, y, (size_t)h->count * 4) == 0};
  for (int64_t i = 0; i < h->count; i++) {
    double a = h->dtype == NPY_F32 ? ((const float *)x)[i] : ((const int32_t *)x)[i];
    double b = h->dtype == NPY_F32 ? ((const float *)y)[i] : ((const int32_t *)y)[i];
    double e = (a == b) ? 0.0 : (isfinite(a) && isfinite(b)) ? fabs(a - b) : INFINITY;
    if (isfinite(b) && fabs(b) > d.max_ref) d.max_ref = fabs(b);
    if (e > d.max_abs || (isnan(e) && d.worst < 0)) d.max_abs = e, d.worst = i;
  }
  d.rel = d.max_abs / (d.max_ref > 0 ? d.max_ref : 1.0);
  return d;
}

static int in_list(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; p && *p;) {
    size_t len = strcspn(p, ",");
    if (len == n && !strncmp(p, name, n)) return 1;
    p += len + (p[len] == ',');
  }
  return 0;
}

/* One file; 0 when within tolerance. */
static int check_file(const char *da, const char *db, const char *name, double rtol, int exact) {
  npy_header ha, hb;
  void *a = NULL, *b = NULL;
  int rc = 1;
  if (load(da, name, &ha, &a) || load(db, name, &hb, &b)) goto out;
  if (!same_shape(&ha, &hb)) {
    fprintf(stderr, "%s: shapes differ\n", name);
    goto out;
  }
  diff d = compare(&ha, a, b);
  rc = exact ? !d.identical : !(d.rel <= rtol);
  printf("%-18s %10lld elements  max_abs %.3e  max|ref| %.3g  rel %.3e  %s  %s\n", name,
         (long long)d.count, d.max_abs, d.max_ref, d.rel, d.identical ? "bitwise identical" : "differs",
         rc ? "FAIL" : "ok");
  if (rc && d.worst >= 0) printf("  worst at flat index %lld\n", (long long)d.worst);
out:
  free(a);
  free(b);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s DIR_A DIR_B [--rtol R] [--exact f1,f2] file.npy...\n", argv[0]);
    return 2;
  }
  double rtol = 1e-6;
  const char *exact = NULL;
  int bad = 0, files = 0;
  for (int i = 3; i < argc; i++) {
    if (!strcmp(argv[i], "--rtol") && i + 1 < argc) {
      rtol = atof(argv[++i]);
    } else if (!strcmp(argv[i], "--exact") && i + 1 < argc) {
      exact = argv[++i];
    } else {
      bad += check_file(argv[1], argv[2], argv[i], rtol, in_list(exact, argv[i]));
      files++;
    }
  }
  printf("%s: %d of %d files within tolerance (rtol %.1e)\n", bad ? "FAILED" : "OK", files - bad,
         files, rtol);
  return bad ? 1 : 0;
}
