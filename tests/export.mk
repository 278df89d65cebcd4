# Export recipes (issue 15): dcp convert --to hf.
EXPORT_TESTS = tests/export-recipes.sh tests/export-hf.sh tests/export-torchtitan.sh tests/export-megatron.sh \
	tests/export-megatron-fsdp.sh
TESTS += $(EXPORT_TESTS)
dist_check_SCRIPTS += $(EXPORT_TESTS)
EXTRA_DIST += tests/interop/export_hf.py tests/interop/export_torchtitan.py tests/interop/export_megatron.py \
	tests/interop/save_fsdp_dtensor.py
