/* npy.c — a small, strict .npy reader/writer (format versions 1.0–3.0): float32 and
 * int32, little endian, C order. Anything else is refused with a message naming the file
 * and how to convert it. */
#include "npy.h"
#include "err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAX_HEADER (1 << 20)

static const char *dtype_descr(npy_dtype t) { return t == NPY_F32 ? "<f4" : "<i4"; }

const char *npy_shape_string(int ndim, const int64_t *shape, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < ndim && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (n < len) snprintf(buf + n, len - n, "]");
  return buf;
}

/* Value text after 'key': in the header dict, or NULL. */
static const char *dict_value(const char *hdr, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char *p = strstr(hdr, pat);
  if (!p) return NULL;
  p = strchr(p + strlen(pat), ':');
  if (!p) return NULL;
  p++;
  while (*p == ' ')
    p++;
  return p;
}

static int parse_descr(const char *path, const char *hdr, npy_dtype want, char *err,
                       size_t errlen) {
  const char *v = dict_value(hdr, "descr");
  if (!v || (*v != '\'' && *v != '"'))
    return launch_fail(err, errlen, "%s: malformed .npy header (no 'descr')", path);
  char descr[32] = {0};
  size_t n = 0;
  for (const char *p = v + 1; *p && *p != *v && n + 1 < sizeof descr; p++)
    descr[n++] = *p;
  if (strcmp(descr, dtype_descr(want)) == 0) return 0;
  if (want == NPY_F32 && strcmp(descr, "|f4") == 0) return 0;
  return launch_fail(err, errlen,
              "%s: dtype '%s', but attnrun reads %s ('%s', little endian); convert with "
              "np.save(path, a.astype(np.%s))",
              path, descr, want == NPY_F32 ? "float32" : "int32", dtype_descr(want),
              want == NPY_F32 ? "float32" : "int32");
}

static int parse_shape(const char *path, const char *hdr, npy_header *h, char *err, size_t errlen) {
  const char *v = dict_value(hdr, "shape");
  if (!v || *v != '(') return launch_fail(err, errlen, "%s: malformed .npy header (no 'shape')", path);
  h->ndim = 0;
  h->count = 1;
  const char *p = v + 1;
  for (;;) {
    while (*p == ' ' || *p == ',')
      p++;
    if (*p == ')') break;
    char *end;
    errno = 0;
    long long d = strtoll(p, &end, 10);
    if (end == p || errno || d < 0)
      return launch_fail(err, errlen, "%s: malformed .npy header (bad shape)", path);
    if (h->ndim == NPY_MAX_DIMS)
      return launch_fail(err, errlen, "%s: more than %d dimensions", path, NPY_MAX_DIMS);
    h->shape[h->ndim++] = d;
    h->count *= d;
    p = end;
  }
  return 0;
}

static int parse_dict(const char *path, const char *hdr, npy_dtype want, npy_header *h, char *err,
                      size_t errlen) {
  if (parse_descr(path, hdr, want, err, errlen)) return -1;
  const char *fo = dict_value(hdr, "fortran_order");
  if (!fo) return launch_fail(err, errlen, "%s: malformed .npy header (no 'fortran_order')", path);
  if (strncmp(fo, "False", 5) != 0)
    return launch_fail(err, errlen, "%s: Fortran-order array; save a C-order copy (np.ascontiguousarray)",
                path);
  h->dtype = want;
  return parse_shape(path, hdr, h, err, errlen);
}

/* Reads the preamble: magic, version, header length. */
static int read_preamble(FILE *f, const char *path, int64_t *hdr_len, int64_t *data_off, char *err,
                         size_t errlen) {
  unsigned char pre[12];
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, NPY_MAGIC, 6) != 0)
    return launch_fail(err, errlen, "%s: not a .npy file (bad magic)", path);
  if (pre[6] == 1) {
    *hdr_len = pre[8] | (pre[9] << 8);
    *data_off = 10 + *hdr_len;
    return 0;
  }
  if (pre[6] == 2 || pre[6] == 3) {
    if (fread(pre + 10, 1, 2, f) != 2) return launch_fail(err, errlen, "%s: truncated header", path);
    *hdr_len = (int64_t)pre[8] | ((int64_t)pre[9] << 8) | ((int64_t)pre[10] << 16) |
               ((int64_t)pre[11] << 24);
    *data_off = 12 + *hdr_len;
    return 0;
  }
  return launch_fail(err, errlen, "%s: unsupported .npy format version %d", path, pre[6]);
}

static int check_size(FILE *f, const char *path, const npy_header *h, char *err, size_t errlen) {
  if (fseeko(f, 0, SEEK_END) != 0) return launch_fail(err, errlen, "%s: cannot seek", path);
  int64_t size = (int64_t)ftello(f);
  int64_t want = h->data_offset + h->count * 4;
  if (size < want)
    return launch_fail(err, errlen, "%s: truncated (%lld bytes, the header promises %lld)", path,
                (long long)size, (long long)want);
  return 0;
}

int npy_read_header(const char *path, npy_dtype want, npy_header *h, char *err, size_t errlen) {
  memset(h, 0, sizeof *h);
  FILE *f = fopen(path, "rb");
  if (!f) return launch_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
  int64_t hdr_len = 0;
  int rc = read_preamble(f, path, &hdr_len, &h->data_offset, err, errlen);
  if (rc == 0 && (hdr_len <= 0 || hdr_len > NPY_MAX_HEADER))
    rc = launch_fail(err, errlen, "%s: implausible header length %lld", path, (long long)hdr_len);
  char *hdr = rc == 0 ? calloc(1, (size_t)hdr_len + 1) : NULL;
  if (rc == 0 && !hdr) rc = launch_fail(err, errlen, "%s: out of memory", path);
  if (rc == 0 && fread(hdr, 1, (size_t)hdr_len, f) != (size_t)hdr_len)
    rc = launch_fail(err, errlen, "%s: truncated header", path);
  if (rc == 0) rc = parse_dict(path, hdr, want, h, err, errlen);
  if (rc == 0) rc = check_size(f, path, h, err, errlen);
  free(hdr);
  fclose(f);
  return rc;
}

int npy_read_range(const char *path, const npy_header *h, int64_t first, int64_t count, void *out,
                   char *err, size_t errlen) {
  if (first < 0 || count < 0 || first + count > h->count)
    return launch_fail(err, errlen, "%s: range [%lld, %lld) outside %lld elements", path, (long long)first,
                (long long)(first + count), (long long)h->count);
  FILE *f = fopen(path, "rb");
  if (!f) return launch_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
  int rc = 0;
  if (fseeko(f, (off_t)(h->data_offset + first * 4), SEEK_SET) != 0 ||
      fread(out, 4, (size_t)count, f) != (size_t)count)
    rc = launch_fail(err, errlen, "%s: read failed", path);
  fclose(f);
  return rc;
}

int npy_pread_range(int fd, const char *path, const npy_header *h, int64_t first, int64_t count,
                    void *out, char *err, size_t errlen) {
  if (first < 0 || count < 0 || first + count > h->count)
    return launch_fail(err, errlen, "%s: range [%lld, %lld) outside %lld elements", path, (long long)first,
                (long long)(first + count), (long long)h->count);
  char *dst = out;
  off_t at = (off_t)(h->data_offset + first * 4);
  size_t left = (size_t)count * 4;
  while (left > 0) {
    ssize_t n = pread(fd, dst, left, at);
    if (n <= 0) return launch_fail(err, errlen, "%s: read failed: %s", path, n ? strerror(errno) : "end of file");
    dst += n, at += n, left -= (size_t)n;
  }
  return 0;
}

int npy_read_all(const char *path, npy_dtype want, npy_header *h, void **data, char *err,
                 size_t errlen) {
  *data = NULL;
  if (npy_read_header(path, want, h, err, errlen)) return -1;
  void *buf = malloc(h->count > 0 ? (size_t)h->count * 4 : 1);
  if (!buf)
    return launch_fail(err, errlen, "%s: out of memory (%lld elements)", path, (long long)h->count);
  if (npy_read_range(path, h, 0, h->count, buf, err, errlen)) {
    free(buf);
    return -1;
  }
  *data = buf;
  return 0;
}

/* The header dict, padded with spaces to a 64-byte boundary and ended by '\n'. */
static size_t format_header(char *buf, size_t len, npy_dtype dtype, int ndim,
                            const int64_t *shape) {
  size_t n = (size_t)snprintf(buf, len, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                              dtype_descr(dtype));
  for (int i = 0; i < ndim; i++)
    n +=
        (size_t)snprintf(buf + n, len - n, "%lld,%s", (long long)shape[i], i + 1 < ndim ? " " : "");
  n += (size_t)snprintf(buf + n, len - n, "), }");
  size_t total = (10 + n + 1 + 63) / 64 * 64;
  while (10 + n + 1 < total)
    buf[n++] = ' ';
  buf[n++] = '\n';
  return n;
}

/* The 10-byte version 1.0 preamble for a header of hlen bytes. */
static void preamble(unsigned char pre[10], size_t hlen) {
  static const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  memcpy(pre, magic, 8);
  pre[8] = (unsigned char)(hlen & 0xff);
  pre[9] = (unsigned char)(hlen >> 8);
}

int npy_create(const char *path, npy_dtype dtype, int ndim, const int64_t *shape,
               int64_t *data_offset, char *err, size_t errlen) {
  char hdr[512];
  unsigned char pre[10];
  size_t hlen = format_header(hdr, sizeof hdr, dtype, ndim, shape);
  int64_t count = 1;
  for (int i = 0; i < ndim; i++)
    count *= shape[i];
  preamble(pre, hlen);
  *data_offset = (int64_t)(10 + hlen);
  FILE *f = fopen(path, "wb");
  if (!f) return launch_fail(err, errlen, "%s: cannot create: %s", path, strerror(errno));
  int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, hlen, f) == hlen && fflush(f) == 0 &&
           ftruncate(fileno(f), (off_t)(*data_offset + count * 4)) == 0;
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : launch_fail(err, errlen, "%s: write failed: %s", path, strerror(errno));
}

int npy_pwrite_range(int fd, const char *path, int64_t data_offset, int64_t first, int64_t count,
                     const void *data, char *err, size_t errlen) {
  const char *src = data;
  off_t at = (off_t)(data_offset + first * 4);
  size_t left = (size_t)count * 4;
  while (left > 0) {
    ssize_t n = pwrite(fd, src, left, at);
    if (n <= 0) return launch_fail(err, errlen, "%s: write failed: %s", path, strerror(errno));
    src += n, at += n, left -= (size_t)n;
  }
  return 0;
}

int npy_write(const char *path, npy_dtype dtype, int ndim, const int64_t *shape, const void *data,
              char *err, size_t errlen) {
  char hdr[512];
  size_t hlen = format_header(hdr, sizeof hdr, dtype, ndim, shape);
  int64_t count = 1;
  for (int i = 0; i < ndim; i++)
    count *= shape[i];
  unsigned char pre[10];
  preamble(pre, hlen);
  FILE *f = fopen(path, "wb");
  if (!f) return launch_fail(err, errlen, "%s: cannot create: %s", path, strerror(errno));
  int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, hlen, f) == hlen &&
           fwrite(data, 4, (size_t)count, f) == (size_t)count;
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : launch_fail(err, errlen, "%s: write failed: %s", path, strerror(errno));
}
