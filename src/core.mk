# libdcp: the core. No FUSE, MPI or CUDA here.
lib_LTLIBRARIES += libdcp.la
include_HEADERS += include/dcp.h include/dcp_file.h include/dcp_gplan.h
noinst_HEADERS += src/internal.h src/pickle.h src/sized_opts.h
libdcp_la_SOURCES = \
	src/util.c \
	src/keys.c \
	src/dtype.c \
	src/cast.c \
	src/model.c src/store.h src/store_mem.c src/store_spill.c src/chunk_record.c \
	src/open.c src/probe.c src/probe.h \
	src/identity.c \
	src/pickle.c \
	src/metadata.c \
	src/zip.c src/zip.h \
	src/torchsave.c \
	src/blob.c \
	src/safetensors.c src/safetensors.h \
	src/format.c \
	src/single_file.c src/single_file.h \
	src/hf_index.c \
	src/megatron_config.c \
	src/megatron_fold.c \
	src/rankfiles.c \
	src/tiling.c \
	src/planner.c \
	src/files.c src/files.h \
	src/reader.c \
	src/gplan.c \
	src/abi_0_1.c
libdcp_la_CFLAGS = $(AM_CFLAGS) $(ZSTD_CFLAGS) $(JANSSON_CFLAGS) -pthread
libdcp_la_LIBADD = $(ZSTD_LIBS) $(JANSSON_LIBS) -lpthread
# Exports: the public dcp_* calls, each with its symbol version (DCP_0.1,
# DCP_0.2: src/libdcp.map; tests/abi-symbols.sh checks the built library).
# -version-info CURRENT:REVISION:AGE: 1:0:1 since 0.2.0 added calls.
libdcp_la_LDFLAGS = $(AM_LDFLAGS) -version-info 1:0:1 -Wl,--version-script=$(srcdir)/src/libdcp.map
EXTRA_libdcp_la_DEPENDENCIES = $(srcdir)/src/libdcp.map
EXTRA_DIST += src/libdcp.map
dist_man_MANS += man/dcp_gplan.3 man/dcp_dtype.3 man/dcp_file.3
