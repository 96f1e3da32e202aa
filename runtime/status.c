/* status.c — status strings, the per-thread last-error message, logging and tunables. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

static _Thread_local char last_error[1024];

int attn_version(void) { return ATTN_VERSION_CODE; }

const char *attn_version_string(void) {
#define ATTN_STR2(x) #x
#define ATTN_STR(x) ATTN_STR2(x)
  return ATTN_STR(ATTN_VERSION_MAJOR) "." ATTN_STR(ATTN_VERSION_MINOR) "." ATTN_STR(
      ATTN_VERSION_PATCH);
}

const char *attn_status_string(attn_status status) {
  switch (status) {
#define ATTN_STATUS_CASE(name, code, text) \
  case name:                               \
    return text;
    ATTN_STATUS_TABLE(ATTN_STATUS_CASE)
#undef ATTN_STATUS_CASE
  }
  return "unknown status";
}

const char *attn_last_error(void) { return last_error; }

void attn__clear_error(void) { last_error[0] = '\0'; }

attn_status attn__fail(attn_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  attn__log(ATTN_LOG_INFO, "%s: %s", attn_status_string(status), last_error);
  return status;
}

static int log_level(void) {
  static int level = -1;
  if (level < 0) {
    const char *s = getenv("ATTN_DEBUG");
    level = !s ? 0 : !strcmp(s, "INFO") ? ATTN_LOG_INFO : !strcmp(s, "WARN") ? ATTN_LOG_WARN : 0;
  }
  return level;
}

static const char *rank_string(void) {
  const char *r = getenv("ATTN_RANK");
  if (!r) r = getenv("OMPI_COMM_WORLD_RANK");
  if (!r) r = getenv("PMI_RANK");
  return r ? r : "0";
}

void attn__log(int level, const char *fmt, ...) {
  if (level > log_level()) return;
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  char msg[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s:%s attnrun %s %s\n", host, rank_string(),
          level == ATTN_LOG_WARN ? "WARN" : "INFO", msg);
}

/* Integer tunables from the environment (ATTN_<name>), read once per name and cached for
 * the process lifetime; malformed values warn once and fall back to the default. */
#define PARAM_SLOTS 64
static struct {
  const char *name; /* a string literal: compared by content, kept by pointer */
  int64_t value;
} param_cache[PARAM_SLOTS];
static int param_count;
static pthread_mutex_t param_lock = PTHREAD_MUTEX_INITIALIZER;

static int64_t param_read(const char *name, int64_t dflt) {
  char key[96];
  snprintf(key, sizeof key, "ATTN_%s", name);
  const char *s = getenv(key);
  if (!s || !*s) return dflt;
  char *end = NULL;
  long long v = strtoll(s, &end, 0);
  if (*end) {
    attn__log(ATTN_LOG_WARN, "%s=%s is not an integer; using %lld", key, s, (long long)dflt);
    return dflt;
  }
  return v;
}

int64_t attn__param(const char *name, int64_t dflt) {
  pthread_mutex_lock(&param_lock);
  for (int i = 0; i < param_count; i++)
    if (!strcmp(param_cache[i].name, name)) {
      int64_t v = param_cache[i].value;
      pthread_mutex_unlock(&param_lock);
      return v;
    }
  int64_t v = param_read(name, dflt);
  if (param_count < PARAM_SLOTS) param_cache[param_count++] = (typeof(param_cache[0])){name, v};
  pthread_mutex_unlock(&param_lock);
  return v;
}
