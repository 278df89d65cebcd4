# The catalog, verification and digests (issue 5). The integration scripts
# (tests/integrity-*.sh, tests/catalog-*.sh) are listed in tests/core.mk.
check_PROGRAMS += tests/unit/test_catalog
TESTS += tests/unit/test_catalog
tests_unit_test_catalog_SOURCES = tests/unit/test_catalog.c
tests_unit_test_catalog_CFLAGS = $(UNIT_TEST_FLAGS) $(SQLITE_CFLAGS)
tests_unit_test_catalog_LDADD = $(UNIT_TEST_LIBS)
EXTRA_tests_unit_test_catalog_DEPENDENCIES = libdcp.la
check_PROGRAMS += tests/unit/test_catalog_served
TESTS += tests/unit/test_catalog_served
tests_unit_test_catalog_served_SOURCES = tests/unit/test_catalog_served.c
tests_unit_test_catalog_served_CFLAGS = $(UNIT_TEST_FLAGS) $(SQLITE_CFLAGS)
tests_unit_test_catalog_served_LDADD = $(UNIT_TEST_LIBS)
EXTRA_tests_unit_test_catalog_served_DEPENDENCIES = libdcp.la
check_PROGRAMS += tests/unit/test_sha256
TESTS += tests/unit/test_sha256
tests_unit_test_sha256_SOURCES = tests/unit/test_sha256.c
tests_unit_test_sha256_CFLAGS = $(UNIT_TEST_FLAGS) $(SQLITE_CFLAGS)
tests_unit_test_sha256_LDADD = $(UNIT_TEST_LIBS)
EXTRA_tests_unit_test_sha256_DEPENDENCIES = libdcp.la

CATALOG_TESTS = tests/catalog-location.sh tests/catalog-fuse.sh
TESTS += $(CATALOG_TESTS)
dist_check_SCRIPTS += $(CATALOG_TESTS)
