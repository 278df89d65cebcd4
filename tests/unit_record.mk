# Record locator unit tests (Check): the torch.save zip reader and blob reads
# (test_zip), the record locator on fixtures, built archives and hostile
# data.pkl, SAFETENSORS-format shards and the Hugging Face layout (test_record).
# They reach libdcp internals (dcpi_*), so they link the core's objects.
UNIT_RECORD_TESTS = tests/unit/test_zip tests/unit/test_record
check_PROGRAMS += $(UNIT_RECORD_TESTS)
TESTS += $(UNIT_RECORD_TESTS)
noinst_HEADERS += tests/unit/zipbuild.h

tests_unit_test_zip_SOURCES = tests/unit/test_zip.c
tests_unit_test_zip_CFLAGS = $(UNIT_TEST_FLAGS) $(JANSSON_CFLAGS) $(ZSTD_CFLAGS)
tests_unit_test_zip_LDADD = $(UNIT_TEST_LIBS) $(JANSSON_LIBS) $(ZSTD_LIBS)
EXTRA_tests_unit_test_zip_DEPENDENCIES = libdcp.la

tests_unit_test_record_SOURCES = tests/unit/test_record.c
tests_unit_test_record_CFLAGS = $(UNIT_TEST_FLAGS) $(JANSSON_CFLAGS) $(ZSTD_CFLAGS)
tests_unit_test_record_LDADD = $(UNIT_TEST_LIBS) $(JANSSON_LIBS) $(ZSTD_LIBS)
EXTRA_tests_unit_test_record_DEPENDENCIES = libdcp.la

# PyTorch interop: every serialization a single process can write, via dcp cat.
INTEROP_FORMATS_TESTS = tests/interop-formats.sh
TESTS += $(INTEROP_FORMATS_TESTS)
dist_check_SCRIPTS += $(INTEROP_FORMATS_TESTS)
EXTRA_DIST += tests/interop/save_formats.py
