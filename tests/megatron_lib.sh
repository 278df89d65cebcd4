# Shared by the tests of Megatron-Core's own saves (tests/export-megatron-fsdp.sh,
# tests/interop-megatron-releases.sh; sourced instead of tests/python_lib.sh, fuse_lib.sh and
# load_lib.sh, which it sources): dcp, a dcpfs mount (its getfattr) and dcpload read each
# checkpoint, so skip without them; DCP_RECIPE_PATH names the shipped recipes (dcp convert
# --to hf). The caller then asks for its releases (need_megatron, tests/lib.sh).
. "$top_srcdir/tests/python_lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need getfattr
need_fuse
export DCP_RECIPE_PATH="$top_srcdir/recipes"
