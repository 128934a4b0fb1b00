/* The per-thread last error behind sluice_last_error(). */
#ifndef SLUICE_ERROR_H
#define SLUICE_ERROR_H

void sluice_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
