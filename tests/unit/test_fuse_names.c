/* dcpfs name encoding (fuse/names.c): every key component has one name and
 * every name decodes back; names never contain '.' or '/'. */
#include "check_quiet.h"
#include <stdlib.h>
#include <string.h>

#include "names.h"

static void roundtrip(const char *comp, const char *want)
{
    char enc[DFS_NAME_MAX + 1], dec[DFS_NAME_MAX + 1];
    int n = dfs_name_encode(comp, strlen(comp), enc, sizeof enc);
    ck_assert_int_ge(n, 1);
    ck_assert_str_eq(enc, want);
    ck_assert_ptr_null(strchr(enc, '/'));
    ck_assert_ptr_null(strchr(enc, '.'));
    ck_assert_int_eq(dfs_name_decode(enc, dec, sizeof dec), (int)strlen(comp));
    ck_assert_str_eq(dec, comp);
}

START_TEST(test_plain)
{
    roundtrip("weight", "weight");
    roundtrip("0", "0");
}
END_TEST

START_TEST(test_escapes)
{
    roundtrip("", "%");
    roundtrip("%", "%25");
    roundtrip("a/b", "a%2Fb");
    roundtrip("50%/x", "50%25%2Fx");
    roundtrip("%2F", "%252F");
}
END_TEST

START_TEST(test_invalid_names)
{
    char dec[64];
    ck_assert_int_eq(dfs_name_decode("a.b", dec, sizeof dec), -1);
    ck_assert_int_eq(dfs_name_decode("%2f", dec, sizeof dec), -1);   /* not canonical */
    ck_assert_int_eq(dfs_name_decode("%zz", dec, sizeof dec), -1);
    ck_assert_int_eq(dfs_name_decode("a%", dec, sizeof dec), -1);
}
END_TEST

START_TEST(test_too_long)
{
    char comp[200], enc[DFS_NAME_MAX + 1];
    memset(comp, '/', sizeof comp);   /* 600 bytes once encoded */
    ck_assert_int_eq(dfs_name_encode(comp, sizeof comp, enc, sizeof enc), -1);
    memset(comp, 'a', sizeof comp);
    ck_assert_int_eq(dfs_name_encode(comp, sizeof comp, enc, sizeof enc), 200);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fuse_names");
    TCase *tc = tcase_create("names");
    tcase_add_test(tc, test_plain);
    tcase_add_test(tc, test_escapes);
    tcase_add_test(tc, test_invalid_names);
    tcase_add_test(tc, test_too_long);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
