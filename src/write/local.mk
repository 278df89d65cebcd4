# Writers, converters and synth (issue 4; include/dcp_write.h): part of libdcp.
include_HEADERS += include/dcp_write.h
noinst_HEADERS += src/write/keypaths.h src/write/pickle_write.h src/write/value_blob.h src/write/zip_write.h src/write/atomic.h \
	src/write/st_header.h
libdcp_la_SOURCES += \
	src/write/atomic.c \
	src/write/pickle_write.c \
	src/write/value_blob.c \
	src/write/zip_write.c \
	src/write/dcp_writer.c \
	src/write/torchsave_writer.c \
	src/write/safetensors_writer.c \
	src/write/convert.c \
	src/write/keypaths.c \
	src/write/size.c \
	src/write/synth.c
libdcp_la_CFLAGS += $(ZLIB_CFLAGS) $(LIBDEFLATE_CFLAGS)
libdcp_la_LIBADD += $(ZLIB_LIBS) $(LIBDEFLATE_LIBS)
dist_man_MANS += man/dcp-convert.1 man/dcp-synth.1 man/dcp_write.3
