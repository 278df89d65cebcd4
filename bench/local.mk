# Reader threads against io_uring, into fresh memory (bench/bench-read.sh).
noinst_PROGRAMS += bench/read_probe
bench_read_probe_SOURCES = bench/read_probe.c
bench_read_probe_CFLAGS = $(AM_CFLAGS) $(LIBURING_CFLAGS) -pthread
bench_read_probe_LDADD = $(LIBURING_LIBS) -lpthread
# make bench: run every bench/bench-*.sh against the built tree and print its report.
EXTRA_DIST += $(wildcard $(srcdir)/bench/*.sh) $(wildcard $(srcdir)/bench/*.py)
bench: all
	@set -e; for b in $(srcdir)/bench/bench-*.sh; do \
	  [ -e "$$b" ] || continue; \
	  echo "== $$b"; \
	  top_srcdir='$(abs_top_srcdir)' top_builddir='$(abs_top_builddir)' MPIEXEC='$(MPIEXEC)' $(SHELL) "$$b"; \
	done
.PHONY: bench
