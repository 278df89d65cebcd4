# make fuzz: libFuzzer runs of the hostile-input entry points (a .metadata
# pickle, a shard's torch.save blob, a Hugging Face safetensors file), each for
# FUZZ_SECONDS. Needs a clang build of libdcp:
#   configure CC=clang CFLAGS='-O1 -g -fsanitize=fuzzer-no-link,address,undefined'
# Not part of `make check`: a fuzz run is open-ended. Crashes land in tests/fuzz/out/.
FUZZ_SECONDS = 300
EXTRA_DIST += tests/fuzz/fuzz_open.c
fuzz: libdcp.la
	@set -e; mkdir -p tests/fuzz/out; for m in 0 1 2; do \
	  $(CC) -DMODE=$$m -O1 -g -fsanitize=fuzzer,address,undefined -I$(top_srcdir)/include \
	    $(top_srcdir)/tests/fuzz/fuzz_open.c -o tests/fuzz/out/fuzz_open$$m .libs/libdcp.so \
	    -Wl,-rpath,$(abs_top_builddir)/.libs; \
	  mkdir -p tests/fuzz/out/corpus$$m; \
	  FIXTURES='$(abs_top_srcdir)/tests/fixtures' tests/fuzz/out/fuzz_open$$m \
	    -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
	    -artifact_prefix=tests/fuzz/out/ tests/fuzz/out/corpus$$m; \
	done
clean-local: clean-fuzz
clean-fuzz:
	rm -rf tests/fuzz/out
.PHONY: fuzz clean-fuzz
