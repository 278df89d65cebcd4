# Core and CLI integration tests.
CORE_TESTS = tests/cli-fixtures.sh tests/cli-fixtures-large.sh tests/cli-errors.sh tests/interop-dtensor.sh
TESTS += $(CORE_TESTS)
dist_check_SCRIPTS += $(CORE_TESTS)
EXTRA_DIST += tests/check_fixture.py tests/interop/save_dtensor.py tests/interop/check_truth.py tests/interop/make_megatron.py
