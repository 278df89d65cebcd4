# Tests: Check unit tests (tests/unit) and integration scripts (tests/*.sh).
# A test that cannot run here exits 77 (skip).
TEST_EXTENSIONS = .sh
SH_LOG_COMPILER = $(SHELL)
AM_TESTS_ENVIRONMENT = \
	top_srcdir='$(abs_top_srcdir)'; top_builddir='$(abs_top_builddir)'; \
	MPIEXEC='$(MPIEXEC)'; \
	XDG_CACHE_HOME='$(abs_top_builddir)/tests/cache'; \
	export top_srcdir top_builddir MPIEXEC XDG_CACHE_HOME;

# Unit tests link the core's objects directly so they can reach internals (dcpi_*),
# which libdcp.so does not export; add EXTRA_<prog>_DEPENDENCIES = libdcp.la.
UNIT_TEST_FLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) -pthread
UNIT_TEST_LIBS = $(libdcp_la_OBJECTS) $(libdcp_la_LIBADD) $(CHECK_LIBS)

EXTRA_DIST += tests/fixtures tests/lib.sh
# The catalog the tests' dcp and dcpfs use (never the user's ~/.cache).
clean-local: clean-test-cache
clean-test-cache:
	rm -rf tests/cache
.PHONY: clean-test-cache

include tests/core.mk
include tests/unit_pickle.mk
include tests/unit_record.mk
include tests/unit_planner.mk
include tests/writer.mk
include tests/export.mk
include tests/catalog.mk
include tests/fuse.mk
include tests/load.mk
include tests/python.mk
include tests/fuzz/local.mk
