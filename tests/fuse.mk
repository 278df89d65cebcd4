# dcpfs tests: they really mount (skip, exit 77, without /dev/fuse or fusermount3).
TESTS += \
	tests/fuse-fixtures.sh \
	tests/fuse-npy.sh \
	tests/fuse-concurrent.sh \
	tests/fuse-folder.sh \
	tests/fuse-errors.sh \
	tests/fuse-names.sh \
	tests/fuse-interop.sh \
	tests/fuse-verify.sh \
	tests/fuse-safetensors.sh \
	tests/fuse-faults.sh tests/fuse-walk.sh tests/fuse-partial.sh \
	tests/fuse-partial-churn.sh tests/fuse-folder-rotation.sh
EXTRA_DIST += \
	tests/fuse-fixtures.sh tests/fuse-npy.sh tests/fuse-concurrent.sh tests/fuse-folder.sh \
	tests/fuse-errors.sh tests/fuse-names.sh tests/fuse-interop.sh tests/fuse-verify.sh \
	tests/fuse-safetensors.sh tests/fuse-faults.sh tests/fuse-walk.sh tests/fuse-partial.sh \
	tests/fuse-partial-churn.sh tests/fuse-folder-rotation.sh tests/fuse_lib.sh tests/fuse_check.py tests/fuse_readers.py tests/fuse_torch_save.py
# A checkpoint saved again under the same folder name while mounted (torch's dcp.save).
TESTS += tests/fuse-resave.sh
EXTRA_DIST += tests/fuse-resave.sh tests/fuse_resave.py
# Per-rank DTensor files (torch-checkpointing, verl) through the mount.
TESTS += tests/fuse-rankfiles.sh
EXTRA_DIST += tests/fuse-rankfiles.sh

# The key-component encoding, without a mount.
check_PROGRAMS += tests/unit/test_fuse_names
tests_unit_test_fuse_names_SOURCES = tests/unit/test_fuse_names.c fuse/names.c fuse/names.h
tests_unit_test_fuse_names_CFLAGS = $(UNIT_TEST_FLAGS) -I$(top_srcdir)/fuse
tests_unit_test_fuse_names_LDADD = $(CHECK_LIBS)
TESTS += tests/unit/test_fuse_names
# -o view=hf:RECIPE: the mount is the export (dcp convert --to hf), byte for byte.
TESTS += tests/fuse-hfview.sh
EXTRA_DIST += tests/fuse-hfview.sh
