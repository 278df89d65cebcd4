"""dcpfs: the compiled part (dcpfs._native, cffi API mode) is declared here;
everything else is in pyproject.toml. libdcp is found with pkg-config
(see dcpfs/_build.py)."""
from setuptools import setup

setup(cffi_modules=["dcpfs/_build.py:ffibuilder"])
