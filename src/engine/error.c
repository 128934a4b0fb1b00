#include "engine/error.h"

#include <stdarg.h>
#include <stdio.h>

#include "sluice.h"

static _Thread_local char last_error[1024];

void sluice_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

const char *sluice_last_error(void) { return last_error[0] ? last_error : "no error"; }
