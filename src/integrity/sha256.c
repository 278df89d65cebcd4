/* SHA-256 for Megatron-Core's integrity.json (manifest.c), from OpenSSL's
 * libcrypto: the only file of the library that knows which. EVP dispatches
 * to the CPU's SHA extensions where there are any (about 1 GB/s a core). */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>

#include "files.h"
#include "integrity.h"

int dcpi_sha256_mem(const void *data, size_t len, unsigned char out[DCPI_SHA256_LEN])
{
    unsigned n = 0;
    return EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) == 1 && n == DCPI_SHA256_LEN ? 0 : -1;
}

int dcpi_sha256_fd(int fd, void *buf, size_t cap, unsigned char out[DCPI_SHA256_LEN], uint64_t *bytes,
                   void (*step)(void *ctx, size_t n), void *ctx)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c)
        return ENOMEM;
    int e = EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 ? 0 : EIO;
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint64_t off = 0;
    while (!e) {
        size_t got = 0;
        e = dcpi_pread_exact(fd, buf, cap, off, &got);
        if (!e && got && EVP_DigestUpdate(c, buf, got) != 1)
            e = EIO;
        off += got;
        if (step && got)
            step(ctx, got);
        if (got < cap)
            break;
    }
    unsigned n = 0;
    if (!e && (EVP_DigestFinal_ex(c, out, &n) != 1 || n != DCPI_SHA256_LEN))
        e = EIO;
    EVP_MD_CTX_free(c);
    *bytes = off;
    return e;
}
