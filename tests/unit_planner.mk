# Planner and reader unit tests (Check). They reach libdcp internals
# (dcpi_*), which libdcp.so does not export, so they link the core's objects.
UNIT_PLANNER_TESTS = tests/unit/test_planner tests/unit/test_reader
check_PROGRAMS += $(UNIT_PLANNER_TESTS)
TESTS += $(UNIT_PLANNER_TESTS)
noinst_HEADERS += tests/unit/planner_ck.h
UNIT_PLANNER_LDADD = $(libdcp_la_OBJECTS) $(libdcp_la_LIBADD) $(CHECK_LIBS)

tests_unit_test_planner_SOURCES = tests/unit/test_planner.c
tests_unit_test_planner_CFLAGS = $(UNIT_TEST_FLAGS)
tests_unit_test_planner_LDADD = $(UNIT_PLANNER_LDADD)
EXTRA_tests_unit_test_planner_DEPENDENCIES = libdcp.la

tests_unit_test_reader_SOURCES = tests/unit/test_reader.c
tests_unit_test_reader_CFLAGS = $(UNIT_TEST_FLAGS)
tests_unit_test_reader_LDADD = $(UNIT_PLANNER_LDADD)
EXTRA_tests_unit_test_reader_DEPENDENCIES = libdcp.la

# libdcp's global load plan (Check, dcp_gplan.h): the request codec against
# hostile blocks, the same plan on every rank, units within the staging
# size, fragments covering every op once, and the plan run in one process
# (packed deliveries, placed fragments) giving dcp_plan_execute's bytes.
# Public API only, so it links libdcp.la (no MPI).
check_PROGRAMS += tests/unit/test_gplan
TESTS += tests/unit/test_gplan
tests_unit_test_gplan_SOURCES = tests/unit/test_gplan.c
tests_unit_test_gplan_CFLAGS = $(UNIT_TEST_FLAGS)
tests_unit_test_gplan_LDADD = libdcp.la $(CHECK_LIBS)
