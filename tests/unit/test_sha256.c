/* Unit tests of the SHA-256 behind dcp verify's integrity.json check
 * (src/integrity/sha256.c): the FIPS 180-2 known answers, from memory and
 * from a file read in pieces of several sizes (one that ends exactly at the
 * end of a piece among them). */
#include "check_quiet.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "integrity/integrity.h"

static void hex(const unsigned char d[DCPI_SHA256_LEN], char out[2 * DCPI_SHA256_LEN + 1])
{
    for (int i = 0; i < DCPI_SHA256_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

#define ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define MILLION_A "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"

START_TEST(known_answers)
{
    unsigned char d[DCPI_SHA256_LEN];
    char h[2 * DCPI_SHA256_LEN + 1];
    ck_assert_int_eq(dcpi_sha256_mem("abc", 3, d), 0);
    hex(d, h);
    ck_assert_str_eq(h, ABC);
    ck_assert_int_eq(dcpi_sha256_mem("", 0, d), 0);
    hex(d, h);
    ck_assert_str_eq(h, EMPTY);
    ck_assert_int_eq(dcpi_sha256_mem("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, d), 0);
    hex(d, h);
    ck_assert_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}
END_TEST

static size_t steps;
static void count(void *ctx, size_t n)
{
    (void)ctx;
    steps += n;
}

START_TEST(from_a_file)
{
    char path[] = "/tmp/dcp-sha256.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    unlink(path);
    unsigned char d[DCPI_SHA256_LEN];
    char h[2 * DCPI_SHA256_LEN + 1];
    uint64_t bytes = 1;
    static char buf[1000000];
    ck_assert_int_eq(dcpi_sha256_fd(fd, buf, sizeof buf, d, &bytes, NULL, NULL), 0);   /* empty */
    hex(d, h);
    ck_assert_str_eq(h, EMPTY);
    ck_assert_uint_eq(bytes, 0);
    memset(buf, 'a', sizeof buf);
    ck_assert_int_eq(pwrite(fd, buf, sizeof buf, 0), (ssize_t)sizeof buf);
    size_t caps[] = {sizeof buf, 4096, 999999, 1u << 20, 7};
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
        steps = 0;
        memset(d, 0, sizeof d);
        ck_assert_int_eq(dcpi_sha256_fd(fd, buf, caps[i], d, &bytes, count, NULL), 0);
        hex(d, h);
        ck_assert_msg(!strcmp(h, MILLION_A), "pieces of %zu: %s", caps[i], h);
        ck_assert_uint_eq(bytes, sizeof buf);
        ck_assert_uint_eq(steps, sizeof buf);
        memset(buf, 'a', sizeof buf);   /* the reads went into it */
    }
    close(fd);
    ck_assert_int_ne(dcpi_sha256_fd(fd, buf, sizeof buf, d, &bytes, NULL, NULL), 0);   /* EBADF */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sha256");
    TCase *t = tcase_create("sha256");
    tcase_add_test(t, known_answers);
    tcase_add_test(t, from_a_file);
    suite_add_tcase(s, t);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
