/* The dcp command line tool: shared declarations. */
#ifndef DCP_CLI_H
#define DCP_CLI_H

#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include "dcp.h"

/* Each subcommand: argc/argv start at the subcommand name. Returns the exit status. */
int cmd_ls(int argc, char **argv);
int cmd_cat(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_layout(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_digest(int argc, char **argv);

/* Print "dcp: <message>" to stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* dcp [--catalog PATH | --no-catalog]: how cli_open uses the catalog. */
extern int cli_catalog_enabled;
extern const char *cli_catalog_path;
/* dcp --megatron-fold: cli_open asks for DCP_OPEN_MEGATRON_FOLD. */
extern int cli_megatron_fold;
/* dcp --rank R: cli_open asks for DCP_OPEN_RANK (rank R's view of a
 * rank-local checkpoint); -1 without it. cli_parse_rank sets it from text
 * (a decimal rank), or prints the error and returns -1. */
extern long cli_rank;
int cli_parse_rank(const char *text);
/* Open a checkpoint (through the catalog unless disabled) or print the error; NULL on failure. */
dcp_checkpoint *cli_open(const char *path);
/* Set by cli_open when it refused a partial checkpoint (dcp_probe_folder). */
extern int cli_open_partial;
/* The entry named key, else -1 with the error printed: "PATH: KEY: no such
 * key", naming (a few of) the keys under it when it is a dotted prefix of
 * some ("model.layers.0" for model.layers.0.attn.weight). */
int cli_find_key(dcp_checkpoint *ck, const char *path, const char *key, const dcp_entry **out);
/* After "not a checkpoint" for a folder (libdcp's message names the
 * checkpoint folders one level below it): on stderr, the one Megatron-LM's
 * latest_checkpointed_iteration.txt names and how many saves below it did not
 * finish, if any (below.c). */
void cli_hint_checkpoints_below(const char *folder);
/* The exit status after cli_open failed: 3 for a partial checkpoint, else 1. */
int cli_open_status(void);
/* --dtype NAME of digest and diff: a floating dtype to compare values in
 * (*as), else an error printed and -1. */
int cli_float_dtype(const char *name, dcp_dtype *as);
/* Write s as a JSON string (with quotes). */
void cli_json_string(FILE *f, const char *s);
/* s for a line of text output: s itself, or (when it holds control bytes,
 * which would forge lines or reach the terminal, or bytes that are not
 * strict UTF-8) a copy with them written as \n, \t, \r, \xHH, valid until
 * the call after next. --json gives names exactly (dcp_key_json). */
const char *cli_text(const char *s);
/* The columns s (UTF-8, as cli_text gives) takes on a terminal: wcwidth of
 * each character, in a UTF-8 locale whatever the environment's (the text is
 * UTF-8 whatever it is): 2 for CJK, 0 for combining marks. */
size_t cli_text_width(const char *s);
/* Write s, then spaces up to width columns (none when it is wider): a column
 * of a text table, padded by display width (printf's %-*s pads by bytes). */
void cli_pad(FILE *f, const char *s, size_t width);
/* Write a shape as a JSON array "[a,b]". */
void cli_json_shape(FILE *f, const int64_t *v, int n);
/* Human-readable byte count ("1.5 MiB"). buf must hold 32 bytes. */
const char *cli_human_bytes(uint64_t n, char *buf);
/* Write all of buf to fd 1; -1 on error. */
int cli_write_stdout(const void *buf, size_t len);
/* Fill err for a failed write to stdout; returns -1. */
int cli_err_stdout(dcp_error *err);
/* dcp_progress_fn for a progress bar on stderr (a terminal only); ctx is a label string. */
void cli_progress(void *label, uint64_t done, uint64_t total);
/* Ctrl-C, a scheduler's SIGTERM, a closed terminal: after cli_catch_signals,
 * SIGINT, SIGTERM and SIGHUP only set cli_stop_signal (the signal), which a
 * writer's cancel flag points at, so it stops at its next piece and removes
 * what it wrote. cli_end_by_signal, after the message, raises the signal again
 * with its default action for the status a shell expects (130, 143, 129). */
extern volatile sig_atomic_t cli_stop_signal;
void cli_catch_signals(void);
void cli_end_by_signal(void);

#endif
