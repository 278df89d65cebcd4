# The Python package: collective loading from Python (dcpfs._collective) (python/tests/test_load.py).
. "$top_srcdir/tests/python_lib.sh"
run_pytest test_load.py torch
