# Writers, converters and synth (issue 4): unit tests and integration scripts.
check_PROGRAMS += tests/unit/test_writer
TESTS += tests/unit/test_writer
tests_unit_test_writer_SOURCES = tests/unit/test_writer.c
tests_unit_test_writer_CFLAGS = $(UNIT_TEST_FLAGS)
tests_unit_test_writer_LDADD = $(UNIT_TEST_LIBS)
EXTRA_tests_unit_test_writer_DEPENDENCIES = libdcp.la
# Options that can grow and the DCP_0.1 calls with the old layouts (dcp.h, options).
check_PROGRAMS += tests/unit/test_options
TESTS += tests/unit/test_options
tests_unit_test_options_SOURCES = tests/unit/test_options.c
tests_unit_test_options_CFLAGS = $(UNIT_TEST_FLAGS)
# Linked to the shared libdcp (public calls only), where the symbol versions are.
tests_unit_test_options_LDADD = libdcp.la $(CHECK_LIBS) -ldl
EXTRA_tests_unit_test_options_DEPENDENCIES = libdcp.la

WRITER_TESTS = tests/writer-roundtrip.sh tests/writer-synth.sh tests/writer-errors.sh tests/writer-rss.sh \
	tests/writer-zipcrc.sh tests/writer-synth-full.sh \
	tests/writer-pyread.sh \
	tests/interop-writer.sh
TESTS += $(WRITER_TESTS)
dist_check_SCRIPTS += $(WRITER_TESTS)
EXTRA_DIST += tests/writer_check.py tests/writer_zipcheck.py tests/interop/writer_load.py tests/interop/writer_synth_expect.py tests/interop/writer_values.py tests/interop/writer_nesting.py
