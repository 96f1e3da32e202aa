/* err.h — the launcher's one way to report a failure into a caller's message buffer. */
#ifndef ATTNRUN_LAUNCH_ERR_H
#define ATTNRUN_LAUNCH_ERR_H

#include <stddef.h>

/* Formats the message into err[errlen] and returns -1 (so: return launch_fail(...)). */
int launch_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
