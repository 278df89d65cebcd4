# Core and CLI integration tests.
TESTS += tests/cli-fixtures.sh tests/cli-fixtures-large.sh tests/cli-errors.sh
dist_check_SCRIPTS += tests/cli-fixtures.sh tests/cli-fixtures-large.sh tests/cli-errors.sh
EXTRA_DIST += tests/check_fixture.py
