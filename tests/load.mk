# The collective loader (libdcpload, dcpload): real mpiexec runs.
LOAD_TESTS = tests/load-fixtures.sh tests/load-direct.sh tests/load-units.sh tests/load-errors.sh tests/load-api.sh \
	tests/load-interop.sh tests/load-file.sh tests/load-dcpload.sh tests/load-large.sh tests/load-faults.sh \
	tests/load-nodes.sh tests/load-device.sh
TESTS += $(LOAD_TESTS)
dist_check_SCRIPTS += $(LOAD_TESTS)
EXTRA_DIST += tests/load_lib.sh tests/load_check.py tests/load_torch_save.py tests/load.supp

# An MPI program driving the library directly (run by tests/load-api.sh).
check_PROGRAMS += tests/load_api
tests_load_api_SOURCES = tests/load_api.c
tests_load_api_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS)
tests_load_api_LDADD = libdcpload.la libdcp.la $(MPI_LIBS) -ldl
