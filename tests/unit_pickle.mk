# Pickle VM (opcodes, memo, hostile bytes) and the .metadata interpreter (fixtures
# against manifests, PyTorch 2.x saves and synthetic variants in tests/data/metadata).
check_PROGRAMS += tests/unit/test_pickle tests/unit/test_metadata
TESTS += tests/unit/test_pickle tests/unit/test_metadata
tests_unit_test_pickle_SOURCES = tests/unit/test_pickle.c
tests_unit_test_pickle_CFLAGS = $(UNIT_TEST_FLAGS)
tests_unit_test_pickle_LDADD = $(UNIT_TEST_LIBS)
EXTRA_tests_unit_test_pickle_DEPENDENCIES = libdcp.la
tests_unit_test_metadata_SOURCES = tests/unit/test_metadata.c
tests_unit_test_metadata_CFLAGS = $(UNIT_TEST_FLAGS) $(JANSSON_CFLAGS)
tests_unit_test_metadata_LDADD = $(UNIT_TEST_LIBS) $(JANSSON_LIBS)
EXTRA_tests_unit_test_metadata_DEPENDENCIES = libdcp.la
EXTRA_DIST += tests/data/gen_metadata.py tests/data/metadata tests/data/hf_sharded
