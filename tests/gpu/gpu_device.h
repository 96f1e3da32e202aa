/* gpu_device.h — device memory for the CUDA tests: a real GPU (gpu_device_cuda.c) or the
 * emulator's host memory (gpu_device_emu.cc). Every call aborts the test on failure. */
#ifndef ATTN_GPU_DEVICE_H
#define ATTN_GPU_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when a device is there to run on (else the test exits 77). */
int td_available(void);
/* 1 on the emulator (tests pick smaller shapes). */
int td_emulated(void);
/* A line naming the device, for logs. */
const char *td_name(void);
void *td_alloc(size_t bytes);
void td_free(void *p);
void td_upload(void *dst, const void *src, size_t bytes);
void td_download(void *dst, const void *src, size_t bytes);
void td_memset(void *dst, int byte, size_t bytes);
/* Waits for the device and aborts on an asynchronous kernel error. */
void td_sync(void);

#ifdef __cplusplus
}
#endif
#endif
