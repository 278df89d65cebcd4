# The Python package: dcpfs.open, Checkpoint.read/read_bytes/info on every fixture and PyTorch save; errors (python/tests/test_open.py).
. "$top_srcdir/tests/python_lib.sh"
run_pytest test_open.py
