/* SHA-256 via libcrypto's EVP (see digest.h). */
#include "tools/digest.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct digest {
    EVP_MD_CTX *ctx;
};

digest *digest_new(void) {
    digest *d = malloc(sizeof *d);
    if (!d) return NULL;
    d->ctx = EVP_MD_CTX_new();
    if (!d->ctx || EVP_DigestInit_ex(d->ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(d->ctx);
        free(d);
        return NULL;
    }
    return d;
}

bool digest_update(digest *d, const void *p, size_t n) {
    return n == 0 || EVP_DigestUpdate(d->ctx, p, n) == 1;
}

bool digest_final(digest *d, char hex[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    bool ok = EVP_DigestFinal_ex(d->ctx, md, &len) == 1 && len == 32;
    for (unsigned i = 0; ok && i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    if (!ok) hex[0] = 0;
    EVP_MD_CTX_free(d->ctx);
    free(d);
    return ok;
}

bool digest_buffer(const void *p, size_t n, char hex[65]) {
    digest *d = digest_new();
    if (!d) return false;
    if (!digest_update(d, p, n)) {
        digest_final(d, hex);
        return false;
    }
    return digest_final(d, hex);
}

static bool hash_range(digest *d, int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t cap) {
    while (len > 0) {
        size_t want = len < cap ? (size_t)len : cap;
        ssize_t k = pread(fd, buf, want, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        if (!digest_update(d, buf, (size_t)k)) return false;
        off += (uint64_t)k;
        len -= (uint64_t)k;
    }
    return true;
}

bool digest_file(const char *path, bool full, char hex[65], uint64_t *size, char *err,
                 size_t n) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, n, "%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return false;
    }
    const uint64_t sz = (uint64_t)st.st_size, mib = 1u << 20;
    *size = sz;
    enum { BUF = 4 << 20 };
    uint8_t *buf = malloc(BUF);
    digest *d = digest_new();
    bool ok = buf && d;
    if (ok && full) {
        ok = hash_range(d, fd, 0, sz, buf, BUF);
    } else if (ok) {
        uint8_t le[8];
        for (int i = 0; i < 8; i++) le[i] = (uint8_t)(sz >> (8 * i));
        uint64_t head = sz < mib ? sz : mib;
        ok = digest_update(d, le, 8) && hash_range(d, fd, 0, head, buf, BUF) &&
             hash_range(d, fd, sz - head, head, buf, BUF);
    }
    if (d) ok = digest_final(d, hex) && ok;
    if (!ok) snprintf(err, n, "%s: cannot hash the file", path);
    free(buf);
    close(fd);
    return ok;
}
