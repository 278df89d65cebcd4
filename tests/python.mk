# The Python package (python/, dcpfs._native built with cffi against libdcp) and its pytest
# suites. `make check` builds the package against this build tree (libdcp-uninstalled.pc)
# into $(abs_top_builddir)/python-pkg; tests/python_build.sh records why when it cannot
# (no python3, numpy, cffi or setuptools), and the tests then skip with that reason.
PYTHON_TESTS = tests/python-open.sh tests/python-reader.sh tests/python-load.sh tests/python-load-torchrun.sh tests/python-types.sh \
	tests/python-megatron-fold.sh
TESTS += $(PYTHON_TESTS)
EXTRA_DIST += $(PYTHON_TESTS) tests/python_lib.sh tests/python_build.sh tests/load_torchrun.py

# The package's files and its tests, whoever wrote them (found at make time, relative to
# the source tree); the package is rebuilt when one of its own files changes.
PYTHON_PKG_FILES = $(patsubst $(top_srcdir)/%,%,$(wildcard \
	$(top_srcdir)/python/pyproject.toml $(top_srcdir)/python/setup.py $(top_srcdir)/python/dcpfs/*.py \
	$(top_srcdir)/python/dcpfs/py.typed))
PYTHON_TEST_FILES = $(patsubst $(top_srcdir)/%,%,$(wildcard $(top_srcdir)/python/tests/*.py))
EXTRA_DIST += $(PYTHON_PKG_FILES) $(PYTHON_TEST_FILES)

check_DATA = python-pkg.stamp
python-pkg.stamp: $(addprefix $(top_srcdir)/,$(PYTHON_PKG_FILES)) libdcp.la libdcp-uninstalled.pc \
		$(top_srcdir)/tests/python_build.sh
	$(AM_V_GEN)$(SHELL) $(top_srcdir)/tests/python_build.sh '$(abs_top_srcdir)' '$(abs_top_builddir)' && touch $@

AM_TESTS_ENVIRONMENT += DCP_SANITIZED='$(if $(SAN_LDFLAGS),yes,)'; export DCP_SANITIZED;

clean-local: clean-python-pkg
clean-python-pkg:
	rm -rf python-pkg python-pkg.tmp python-pkg.skip python-pkg.log python-pkg.stamp
.PHONY: clean-python-pkg
