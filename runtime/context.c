/* context.c — context lifetime, backend selection and per-call statistics. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* The backends this build has: the one place with an #ifdef, where the table is chosen.
 * AUTO takes CUDA when the build has it and a device is visible. */
static attn_status pick_backend(attn_ctx_t ctx) {
  attn_backend want = ctx->cfg.backend;
#ifdef ATTN_HAVE_CUDA
  if (want == ATTN_BACKEND_CUDA || (want == ATTN_BACKEND_AUTO && attn__cuda_device_count() > 0))
    return attn__cuda_backend(ctx, &ctx->ops);
#else
  if (want == ATTN_BACKEND_CUDA)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "backend=cuda: this build has no CUDA backend (configure where nvcc is, "
                      "-DATTN_CUDA=ON); use cpu or auto");
#endif
  return attn__cpu_backend(ctx, &ctx->ops);
}

attn_status attn_ctx_create(attn_ctx_t *out, const attn_ctx_config *cfg_in) {
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn_ctx_t *) is NULL");
  *out = NULL;
  attn_ctx_config cfg = ATTN_CTX_CONFIG_INIT;
  if (cfg_in) {
    if (cfg_in->size < offsetof(attn_ctx_config, device) || cfg_in->size > (1u << 16) ||
        cfg_in->version < 1 || cfg_in->version > ATTN_CTX_CONFIG_VERSION)
      return attn__fail(ATTN_ERR_INVALID_ARG,
                        "cfg size=%zu version=%u is not valid; initialise with "
                        "ATTN_CTX_CONFIG_INIT",
                        cfg_in->size, cfg_in->version);
    memcpy(&cfg, cfg_in, cfg_in->size < sizeof cfg ? cfg_in->size : sizeof cfg);
    cfg.size = sizeof cfg;
  }
  if (cfg.num_threads < 0)
    return attn__fail(ATTN_ERR_INVALID_ARG, "cfg.num_threads=%d must be >= 0 (0 = default)",
                      cfg.num_threads);
  if (cfg.backend != ATTN_BACKEND_AUTO && cfg.backend != ATTN_BACKEND_CPU &&
      cfg.backend != ATTN_BACKEND_CUDA)
    return attn__fail(ATTN_ERR_INVALID_ARG, "cfg.backend=%d is not a backend (0 auto, 1 cpu, 2 cuda)",
                      (int)cfg.backend);
  if (ATTN_PARAM("FORCE_SCALAR", 0)) cfg.force_scalar = 1;
  const int64_t amx_env = ATTN_PARAM("CPU_AMX", 100); /* 100: not set (the value is cached) */
  if (amx_env != 100) cfg.cpu_amx = (int32_t)amx_env;
  if (cfg.cpu_amx < -1 || cfg.cpu_amx > 2)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "cfg.cpu_amx=%d (or ATTN_CPU_AMX) must be -1 (off), 0 (auto), 1 (AMX "
                      "required) or 2 (AVX512-BF16 required)",
                      cfg.cpu_amx);

  attn_ctx_t ctx = calloc(1, sizeof *ctx);
  if (!ctx) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "context allocation failed");
  ctx->cfg = cfg;
  attn_status st = pick_backend(ctx);
  if (st != ATTN_OK) {
    free(ctx);
    return st;
  }
  attn__clear_error();
  *out = ctx;
  return ATTN_OK;
}

attn_status attn_ctx_destroy(attn_ctx_t ctx) {
  if (!ctx) return ATTN_OK;
  if (ctx->ops && ctx->ops->release) ctx->ops->release(ctx->backend_data);
  free(ctx);
  return ATTN_OK;
}

const char *attn_ctx_backend_name(attn_ctx_t ctx) {
  return ctx && ctx->ops ? ctx->ops->name : "none";
}

attn_status attn__ctx_stats(attn_ctx_t ctx, attn_stats *out) {
  if (ctx->ops && ctx->ops->stats) ATTN_CHECK(ctx->ops->stats(ctx));
  *out = ctx->stats;
  return ATTN_OK;
}

attn_status attn_ctx_last_stats(attn_ctx_t ctx, attn_stats *out) {
  if (!ctx) return attn__fail(ATTN_ERR_INVALID_ARG, "ctx is NULL");
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn_stats *) is NULL");
  return attn__ctx_stats(ctx, out);
}

attn_device attn_ctx_device(attn_ctx_t ctx) {
  return ctx && ctx->ops ? ctx->ops->device : ATTN_DEVICE_HOST;
}

attn_status attn_ctx_alloc(attn_ctx_t ctx, size_t bytes, void **out) {
  if (!ctx) return attn__fail(ATTN_ERR_INVALID_ARG, "ctx is NULL");
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (void **) is NULL");
  *out = NULL;
  return ctx->ops->mem_alloc(ctx, bytes, out);
}

attn_status attn_ctx_free(attn_ctx_t ctx, void *p) {
  if (!ctx) return attn__fail(ATTN_ERR_INVALID_ARG, "ctx is NULL");
  return ctx->ops->mem_free(ctx, p);
}

attn_status attn_ctx_copy(attn_ctx_t ctx, void *dst, const void *src, size_t bytes,
                          attn_copy_kind kind) {
  if (!ctx) return attn__fail(ATTN_ERR_INVALID_ARG, "ctx is NULL");
  if (kind != ATTN_COPY_HOST_TO_CTX && kind != ATTN_COPY_CTX_TO_HOST &&
      kind != ATTN_COPY_CTX_TO_CTX)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "kind=%d is not a copy kind (0 host to ctx, 1 ctx to host, 2 ctx to ctx)",
                      (int)kind);
  if (bytes == 0) return ATTN_OK;
  if (!dst || !src)
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s is NULL (bytes=%zu)", dst ? "src" : "dst", bytes);
  return ctx->ops->mem_copy(ctx, dst, src, bytes, kind);
}

attn_status attn_ctx_sync(attn_ctx_t ctx) {
  if (!ctx) return attn__fail(ATTN_ERR_INVALID_ARG, "ctx is NULL");
  return ctx->ops->sync(ctx);
}

/* ---- devices: enumeration for launchers ------------------------------------------------ */

/* The CUDA half, the one #ifdef of this section: kernels/cuda/backend.c, or stubs. */
#ifdef ATTN_HAVE_CUDA
attn_status attn__cuda_pci_bus_id(int device, char *buf, size_t len);
static attn_status cuda_count(int *count) {
  *count = attn__cuda_device_count();
  return ATTN_OK;
}
static attn_status cuda_bus_id(int device, char *buf, size_t len) {
  return attn__cuda_pci_bus_id(device, buf, len);
}
#else
static attn_status no_cuda(void) {
  return attn__fail(ATTN_ERR_UNSUPPORTED,
                    "this build has no CUDA backend (configure where nvcc is, -DATTN_CUDA=ON)");
}
static attn_status cuda_count(int *count) {
  *count = 0;
  return no_cuda();
}
static attn_status cuda_bus_id(int device, char *buf, size_t len) {
  (void)device, (void)buf, (void)len;
  return no_cuda();
}
#endif

attn_status attn_device_count(attn_backend b, int *count) {
  if (!count) return attn__fail(ATTN_ERR_INVALID_ARG, "count (int *) is NULL");
  *count = 0;
  if (b == ATTN_BACKEND_CPU) {
    *count = 1;
    return ATTN_OK;
  }
  if (b != ATTN_BACKEND_CUDA)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "backend=%d: ask for a device kind, cpu (1) or cuda (2), not auto", (int)b);
  return cuda_count(count);
}

attn_status attn_device_pci_bus_id(int device, char *buf, size_t len) {
  if (!buf || len < 13)
    return attn__fail(ATTN_ERR_INVALID_ARG, "buf=%p len=%zu: needs room for 13 bytes (dddd:bb:dd.f)",
                      (void *)buf, len);
  buf[0] = '\0';
  return cuda_bus_id(device, buf, len);
}
