# The Python package: the torch.distributed StorageReader (dcpfs.torch) on top of the Checkpoint API (python/tests/test_reader.py).
. "$top_srcdir/tests/python_lib.sh"
run_pytest test_reader.py torch
