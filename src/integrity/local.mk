# Integrity: structural verification, digests, the SQLite catalog (issue 5).
include_HEADERS += include/dcp_integrity.h
libdcp_la_SOURCES += src/integrity/coverage.c src/integrity/digest.c src/integrity/hashing.c \
	src/integrity/catalog.c src/integrity/modelcache.c src/integrity/recordcache.c src/integrity/rowcodec.c \
	src/integrity/manifest.c src/integrity/sha256.c src/integrity/zipcrc.c
libdcp_la_CFLAGS += $(SQLITE_CFLAGS) $(XXHASH_CFLAGS) $(LIBCRYPTO_CFLAGS)
libdcp_la_LIBADD += $(SQLITE_LIBS) $(XXHASH_LIBS) $(LIBCRYPTO_LIBS)
noinst_HEADERS += src/integrity/integrity.h
dist_man_MANS += man/dcp_integrity.3
