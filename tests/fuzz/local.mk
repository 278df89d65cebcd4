# Fuzzing. `make fuzz` builds libdcp's sources and the harnesses with clang's
# libFuzzer, ASan and UBSan (whatever compiler configured the tree) and runs
# every target from its committed seeds for FUZZ_SECONDS each
# (tests/fuzz/run.sh; exit 77 when clang or libFuzzer is missing). New
# crash inputs land in tests/fuzz/out/; copy them to tests/fuzz/crashes/TARGET/.
# `make check` replays every seed and crash input through the same harnesses
# built by the normal compiler (tests/fuzz-regress.sh), without libFuzzer.
FUZZ_SECONDS = 60
FUZZ_CC = clang
FUZZ_TARGETS = metadata spilled megatron ranklocal shard zstd safetensors torchfile hfindex mcoreconfig rankfile recipe rows sidecar manifest
FUZZ_HARNESSES = tests/fuzz/fuzz_open.c tests/fuzz/fuzz_catalog.c
EXTRA_DIST += $(FUZZ_HARNESSES) tests/fuzz/run.sh tests/fuzz/corpus tests/fuzz/crashes tests/fuzz/dict

check_PROGRAMS += tests/fuzz/replay_open tests/fuzz/replay_catalog
tests_fuzz_replay_open_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_open.c
tests_fuzz_replay_open_LDADD = libdcp.la
tests_fuzz_replay_catalog_SOURCES = tests/fuzz/replay.c tests/fuzz/fuzz_catalog.c
tests_fuzz_replay_catalog_CFLAGS = $(AM_CFLAGS) $(SQLITE_CFLAGS) $(XXHASH_CFLAGS)
tests_fuzz_replay_catalog_LDADD = libdcp.la $(SQLITE_LIBS) $(XXHASH_LIBS)
TESTS += tests/fuzz-regress.sh
dist_check_SCRIPTS += tests/fuzz-regress.sh

fuzz:
	@FUZZ_CC='$(FUZZ_CC)' FUZZ_SECONDS='$(FUZZ_SECONDS)' FUZZ_TARGETS='$(FUZZ_TARGETS)' \
	  FUZZ_SOURCES='$(filter %.c,$(libdcp_la_SOURCES))' \
	  FUZZ_CPPFLAGS='-include $(abs_top_builddir)/config.h -I$(abs_top_srcdir)/include -I$(abs_top_srcdir)/src -I$(abs_top_builddir) $(ZSTD_CFLAGS) $(JANSSON_CFLAGS) $(SQLITE_CFLAGS) $(XXHASH_CFLAGS) $(ZLIB_CFLAGS) $(LIBDEFLATE_CFLAGS)' \
	  FUZZ_LIBS='$(libdcp_la_LIBADD)' \
	  $(SHELL) $(abs_top_srcdir)/tests/fuzz/run.sh '$(abs_top_srcdir)' tests/fuzz/out
clean-local: clean-fuzz
clean-fuzz:
	rm -rf tests/fuzz/out
.PHONY: fuzz clean-fuzz
