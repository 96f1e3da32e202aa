/* npy.h — read and write NumPy .npy files (float32 / int32, C order, little endian) with
 * errors that say which file and what to do; ranges can be read without the whole file
 * (a rank reads its shard). */
#ifndef ATTNRUN_LAUNCH_NPY_H
#define ATTNRUN_LAUNCH_NPY_H

#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_DIMS 8

typedef enum { NPY_F32 = 0, NPY_I32 = 1 } npy_dtype;

typedef struct {
  npy_dtype dtype;
  int ndim;
  int64_t shape[NPY_MAX_DIMS];
  int64_t count;       /* product of shape */
  int64_t data_offset; /* bytes from the start of the file to the data */
} npy_header;

/* Parse path's header; the dtype must be `want` ('<f4' or '<i4'). 0 on success; else -1
 * and a message in err. */
int npy_read_header(const char *path, npy_dtype want, npy_header *h, char *err, size_t errlen);

/* Read elements [first, first + count) (flat C-order index) into out. */
int npy_read_range(const char *path, const npy_header *h, int64_t first, int64_t count, void *out,
                   char *err, size_t errlen);

/* The same from an open file descriptor (pread: safe from several threads). */
int npy_pread_range(int fd, const char *path, const npy_header *h, int64_t first, int64_t count,
                    void *out, char *err, size_t errlen);

/* Read the whole array into a malloc'ed buffer (*data; caller frees). */
int npy_read_all(const char *path, npy_dtype want, npy_header *h, void **data, char *err,
                 size_t errlen);

/* Write a C-order array of ndim dims. */
int npy_write(const char *path, npy_dtype dtype, int ndim, const int64_t *shape, const void *data,
              char *err, size_t errlen);

/* Create path with the header of a C-order array and its full size (zeros), for ranks to
 * fill with npy_pwrite_range; *data_offset gets the byte offset of element 0. */
int npy_create(const char *path, npy_dtype dtype, int ndim, const int64_t *shape,
               int64_t *data_offset, char *err, size_t errlen);

/* Write count 4-byte elements at flat index first of a file made by npy_create. */
int npy_pwrite_range(int fd, const char *path, int64_t data_offset, int64_t first, int64_t count,
                     const void *data, char *err, size_t errlen);

/* "[1, 2048, 8, 128]" into buf. */
const char *npy_shape_string(int ndim, const int64_t *shape, char *buf, size_t len);

#endif
