/* Fill the page cache with FILE in 4 KiB folios: drop its pages, then read it with readahead off
 * (POSIX_FADV_RANDOM: the read path allocates order-0 folios for what is asked). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror("open"); return 1; }
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    size_t bs = 1 << 20;
    char *buf = malloc(bs);
    off_t off = 0;
    ssize_t r;
    while ((r = pread(fd, buf, bs, off)) > 0) off += r;
    printf("read %lld bytes\n", (long long)off);
    return 0;
}
