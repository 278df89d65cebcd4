# Core and CLI integration tests.
CORE_TESTS = tests/cli-fixtures.sh tests/cli-fixtures-large.sh tests/cli-errors.sh tests/cli-faults.sh \
	tests/interop-dtensor.sh tests/metadata-rss.sh tests/core-layers.sh tests/cli-digest.sh \
	tests/cli-digest-cast.sh tests/cli-partial.sh tests/keys-not-utf8.sh tests/cli-columns.sh
TESTS += $(CORE_TESTS)
dist_check_SCRIPTS += $(CORE_TESTS)
# Per-rank DTensor files (torch-checkpointing, verl; src/rankfiles.c).
TESTS += tests/cli-rankfiles.sh tests/interop-rankfiles.sh
dist_check_SCRIPTS += tests/cli-rankfiles.sh tests/interop-rankfiles.sh
EXTRA_DIST += tests/interop/save_rankfiles.py tests/data/rankfiles
# Tensor subclasses torch.save pickled with their values (torchao's float8 training weights).
TESTS += tests/interop-subclasses.sh
dist_check_SCRIPTS += tests/interop-subclasses.sh
EXTRA_DIST += tests/interop/save_subclasses.py tests/data/subclasses
# Megatron-Core releases' own saves (tests/interop/megatron-releases.txt).
TESTS += tests/interop-megatron-releases.sh
dist_check_SCRIPTS += tests/interop-megatron-releases.sh
EXTRA_DIST += tests/interop/megatron_releases.py tests/interop/megatron-releases.txt tests/interop/install-megatron-releases.sh \
	tests/megatron_lib.sh
# Megatron-Core's reformulated optimizer states folded back (DCP_OPEN_MEGATRON_FOLD), without megatron-core.
TESTS += tests/interop-megatron-fold.sh
dist_check_SCRIPTS += tests/interop-megatron-fold.sh
EXTRA_DIST += tests/interop/save_reformulated.py tests/truth_check.py
# PyTorch releases' own saves, 2.0 to 2.15 (tests/data/torch-releases, made once a release).
TESTS += tests/interop-torch-releases.sh
dist_check_SCRIPTS += tests/interop-torch-releases.sh
EXTRA_DIST += tests/data/torch-releases tests/interop/save_torch_release.py tests/interop/check_releases.py
EXTRA_DIST += tests/core_layers.py tests/check_fixture.py tests/interop/save_dtensor.py tests/interop/check_truth.py tests/interop/make_megatron.py tests/interop/save_integrity.py

# Every unit test includes check_quiet.h for <check.h>: no write() per passing assertion.
noinst_HEADERS += tests/unit/check_quiet.h

# Pickle VM, metadata model and record locator (Check).
check_PROGRAMS += tests/unit/test_core
TESTS += tests/unit/test_core
tests_unit_test_core_SOURCES = tests/unit/test_core.c
tests_unit_test_core_CFLAGS = $(UNIT_TEST_FLAGS) $(JANSSON_CFLAGS)
tests_unit_test_core_LDADD = $(UNIT_TEST_LIBS) $(JANSSON_LIBS)
EXTRA_tests_unit_test_core_DEPENDENCIES = libdcp.la

# dcp_probe_folder: partial checkpoints told from complete ones and from none.
check_PROGRAMS += tests/unit/test_probe
TESTS += tests/unit/test_probe
tests_unit_test_probe_SOURCES = tests/unit/test_probe.c
tests_unit_test_probe_CFLAGS = $(UNIT_TEST_FLAGS)
tests_unit_test_probe_LDADD = $(UNIT_TEST_LIBS)
EXTRA_tests_unit_test_probe_DEPENDENCIES = libdcp.la

# Verification, digests, the catalog and diffs.
INTEGRITY_TESTS = tests/integrity-verify.sh tests/integrity-manifest.sh tests/integrity-unreadable.sh tests/integrity-diff.sh tests/integrity-diff-formats.sh tests/catalog-model.sh tests/catalog-spill.sh
TESTS += $(INTEGRITY_TESTS)
dist_check_SCRIPTS += $(INTEGRITY_TESTS)
EXTRA_DIST += tests/flip_record.py

# The ABI: exported symbols and their versions against tests/abi; a man page for every public call.
ABI_TESTS = tests/abi-symbols.sh tests/man-coverage.sh
TESTS += $(ABI_TESTS)
dist_check_SCRIPTS += $(ABI_TESTS)
EXTRA_DIST += tests/abi/libdcp.symbols tests/abi/libdcpload.symbols tests/public_protos.awk
