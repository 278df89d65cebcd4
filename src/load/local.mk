# libdcpload, the collective MPI loader, and dcpload (issue 6). A front end:
# only these files include MPI (and CUDA when configure found it).
lib_LTLIBRARIES += libdcpload.la
include_HEADERS += include/dcp_load.h
noinst_HEADERS += src/load/load.h src/load/device.h
libdcpload_la_SOURCES = \
	src/load/util.c \
	src/load/agree.c \
	src/load/nodes.c \
	src/load/transfer.c \
	src/load/identity.c \
	src/load/request.c \
	src/load/groups.c \
	src/load/device_fake.c \
	src/load/dest.c \
	src/load/mapped.c \
	src/load/ipc.c \
	src/load/exec.c \
	src/load/independent.c \
	src/load/api.c
libdcpload_la_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS) -pthread
libdcpload_la_LIBADD = libdcp.la $(MPI_LIBS) -lpthread -lrt
# Exports: the dcp_load* calls, with their symbol versions (DCP_LOAD_0.1, DCP_LOAD_0.2:
# src/load/libdcpload.map); -version-info 1:0:1 since 0.2.0 added a version.
libdcpload_la_LDFLAGS = $(AM_LDFLAGS) -version-info 1:0:1 -Wl,--version-script=$(srcdir)/src/load/libdcpload.map
EXTRA_libdcpload_la_DEPENDENCIES = $(srcdir)/src/load/libdcpload.map
EXTRA_DIST += src/load/libdcpload.map

bin_PROGRAMS += dcpload
dcpload_SOURCES = src/load/dcpload.c
dcpload_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS) $(XXHASH_CFLAGS)
dcpload_LDADD = libdcpload.la libdcp.la $(MPI_LIBS) $(XXHASH_LIBS)

if HAVE_CUDA
# the device layer over CUDA (device.h); device_fake.c is the test-only stand-in
libdcpload_la_SOURCES += src/load/device_cuda.c
libdcpload_la_CFLAGS += $(CUDA_CFLAGS)
libdcpload_la_LIBADD += $(CUDA_LIBS)
dcpload_CFLAGS += $(CUDA_CFLAGS)
dcpload_LDADD += $(CUDA_LIBS)
endif

dist_man_MANS += man/dcpload.1 man/dcp_load.3

# bench-load.sh's baseline: a parallel raw read of the same bytes (pread only).
noinst_PROGRAMS += bench/load_raw
bench_load_raw_SOURCES = bench/load_raw.c
bench_load_raw_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS)
bench_load_raw_LDADD = $(MPI_LIBS)
