/* Check's assertions, less a write() per assertion that passes.
 *
 * Check's ck_assert_msg (and every ck_assert_* built on it) records the
 * place of each assertion that passes (_mark_point: a message written to a
 * temporary file), so that a test that crashes can name the last one. The
 * unit tests assert in loops, millions of times: those writes were most of
 * test_gplan's and test_reader's time (half of it in ext4's write path).
 * A crash still names its test, and the sanitizer build prints its stack;
 * a failed assertion reports as before. Include this instead of <check.h>. */
#ifndef DCP_TESTS_CHECK_QUIET_H
#define DCP_TESTS_CHECK_QUIET_H

#include <check.h>

#undef ck_assert_msg
#define ck_assert_msg(expr, ...) \
    ((expr) ? (void)0 : _ck_assert_failed(__FILE__, __LINE__, "Assertion '" #expr "' failed", ##__VA_ARGS__))

#endif
