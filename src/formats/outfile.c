/* Output files: refuse targets that a rename would destroy (see outfile.h). */
#include "formats/outfile.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int outfile_check(const char *path, char *err, size_t err_len) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return 0; /* a new file */
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st.st_mode)) return 0;
    snprintf(err, err_len,
             "%s: not a regular file (%s); the output is written beside it and renamed over it",
             path, S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) ? "a character device"
                   : S_ISBLK(st.st_mode) ? "a block device" : S_ISFIFO(st.st_mode) ? "a pipe" : "a special file");
    return -1;
}
