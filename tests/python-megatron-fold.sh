# The Python package: Megatron-Core's reformulated optimizer states loaded in their original shapes into DTensors (python/tests/test_megatron_fold.py).
. "$top_srcdir/tests/python_lib.sh"
run_pytest test_megatron_fold.py torch
