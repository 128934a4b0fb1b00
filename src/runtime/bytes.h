/* Byte counts in messages and reports, one format everywhere: "21.03 GiB" from 1 GiB up, else
 * "143.4 MiB". */
#ifndef SLUICE_BYTES_H
#define SLUICE_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

static inline const char *bytes_str(uint64_t b, char *out, size_t cap) {
    if (b >= (1ull << 30)) snprintf(out, cap, "%.2f GiB", (double)b / 1073741824.0);
    else snprintf(out, cap, "%.1f MiB", (double)b / 1048576.0);
    return out;
}

#endif
