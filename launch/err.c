/* err.c — launch_fail: format a failure message into the caller's buffer. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>

int launch_fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}
