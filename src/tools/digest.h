/* SHA-256 through OpenSSL's EVP interface (libcrypto): evidence hashes and model file hashes. */
#ifndef SLUICE_DIGEST_H
#define SLUICE_DIGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct digest digest;

digest *digest_new(void);                               /* SHA-256; NULL on failure */
bool digest_update(digest *d, const void *p, size_t n);
/* Finish: 64 lowercase hex digits and a NUL into hex[65]; frees d. */
bool digest_final(digest *d, char hex[65]);

/* SHA-256 of a buffer. */
bool digest_buffer(const void *p, size_t n, char hex[65]);

/* A model file's identity. full: SHA-256 of the whole file (what sha256sum prints). fast:
 * SHA-256 over the file size (u64, little-endian), the first MiB and the last MiB, so that a
 * 20 GB file is identified in milliseconds. *size receives the file size. */
bool digest_file(const char *path, bool full, char hex[65], uint64_t *size, char *err,
                 size_t err_len);

#endif
