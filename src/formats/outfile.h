/* Output files: every writer here (synth, repack, convert, logits) builds its output under a
 * temporary name beside the target and renames it over the target when complete, so a failure
 * never leaves a partial file. A rename over a path that is not a regular file would replace it:
 * as root, `sluice synth -o /dev/null` would turn /dev/null into a 20 GB plain file. */
#ifndef SLUICE_OUTFILE_H
#define SLUICE_OUTFILE_H

#include <stddef.h>

/* 0 when path does not exist or is a regular file (after symbolic links); else -1 with a
 * one-line cause in err. */
int outfile_check(const char *path, char *err, size_t err_len);

#endif
