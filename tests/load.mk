# The collective loader (libdcpload, dcpload): real mpiexec runs.
LOAD_TESTS = tests/load-fixtures.sh tests/load-units.sh tests/load-errors.sh tests/load-api.sh \
	tests/load-interop.sh tests/load-file.sh tests/load-dcpload.sh tests/load-large.sh
TESTS += $(LOAD_TESTS)
dist_check_SCRIPTS += $(LOAD_TESTS)
EXTRA_DIST += tests/load_lib.sh tests/load_check.py tests/load_torch_save.py tests/load.supp

# An MPI program driving the library directly (run by tests/load-api.sh).
check_PROGRAMS += tests/load_api
tests_load_api_SOURCES = tests/load_api.c
tests_load_api_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS)
tests_load_api_LDADD = libdcpload.la libdcp.la $(MPI_LIBS)

# The global plan without MPI (Check): the same on every rank, units within
# the staging size, fragments covering every op once. It reaches loader
# internals (ldi_*), which libdcpload.so does not export, so it links the
# loader's objects.
check_PROGRAMS += tests/unit/test_gplan
TESTS += tests/unit/test_gplan
tests_unit_test_gplan_SOURCES = tests/unit/test_gplan.c
tests_unit_test_gplan_CFLAGS = $(UNIT_TEST_FLAGS) $(MPI_CFLAGS)
tests_unit_test_gplan_LDADD = $(libdcpload_la_OBJECTS) libdcp.la $(libdcpload_la_LIBADD) $(CHECK_LIBS)
EXTRA_tests_unit_test_gplan_DEPENDENCIES = libdcpload.la
