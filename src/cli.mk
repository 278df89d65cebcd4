# The dcp command line tool: one file per subcommand.
bin_PROGRAMS += dcp
dcp_SOURCES = \
	src/cli/main.c src/cli/cli.h src/cli/util.c src/cli/below.c src/cli/progress.c \
	src/cli/cmd_ls.c src/cli/cmd_cat.c src/cli/cmd_info.c src/cli/cmd_layout.c \
	src/cli/cmd_convert.c src/cli/cmd_synth.c src/cli/cmd_verify.c src/cli/cmd_diff.c \
	src/cli/cmd_digest.c
dcp_CFLAGS = $(AM_CFLAGS) $(XXHASH_CFLAGS)
dcp_LDADD = libdcp.la $(XXHASH_LIBS)
dist_man_MANS += man/dcp.1 man/libdcp.3 man/dcp-verify.1 man/dcp-diff.1 man/dcp-formats.7
