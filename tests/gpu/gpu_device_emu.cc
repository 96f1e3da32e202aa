/* gpu_device_emu.cc — td_* on the emulator: device memory is host memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "gpu_device.h"

extern "C" {

int td_available(void) { return 1; }
int td_emulated(void) { return 1; }
const char *td_name(void) { return "emulated device (host coroutines)"; }

void *td_alloc(size_t bytes) {
  void *p = emu_device_alloc(bytes);
  if (!p) {
    fprintf(stderr, "emulated device allocation of %zu bytes failed\n", bytes);
    exit(1);
  }
  memset(p, 0xA5, bytes); /* like cudaMalloc: contents undefined */
  return p;
}

void td_free(void *p) { emu_device_free(p); }
void td_upload(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
void td_download(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
void td_memset(void *dst, int byte, size_t bytes) { memset(dst, byte, bytes); }
void td_sync(void) {}
}
