# dcpfs: the read-only FUSE filesystem (fuse/), and the minimal passthrough
# mount bench/bench-fuse.sh compares it with.
bin_PROGRAMS += dcpfs
dcpfs_SOURCES = \
	fuse/dcpfs.h fuse/main.c fuse/log.c fuse/names.c fuse/names.h fuse/tree.c \
	fuse/scan.c fuse/ops.c fuse/loop.c fuse/read.c fuse/npy.c fuse/verify.c fuse/stview.c \
	fuse/hfview.c fuse/notify.c
dcpfs_CFLAGS = $(AM_CFLAGS) $(FUSE_CFLAGS) $(XXHASH_CFLAGS) -pthread
dcpfs_LDADD = libdcp.la $(FUSE_LIBS) $(XXHASH_LIBS) -lpthread
dist_man_MANS += man/dcpfs.1

# The benchmark's baseline: a minimal libfuse passthrough of one folder.
noinst_PROGRAMS += bench/passthrough
bench_passthrough_SOURCES = bench/passthrough.c
bench_passthrough_CFLAGS = $(AM_CFLAGS) $(FUSE_CFLAGS) -pthread
bench_passthrough_LDADD = $(FUSE_LIBS) -lpthread
# What share of a file's cached pages are large folios (the re-read lines).
noinst_PROGRAMS += bench/folios
bench_folios_SOURCES = bench/folios.c
