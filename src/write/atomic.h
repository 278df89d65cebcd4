/* Outputs that appear complete or not at all: a temporary name beside the
 * destination, fsync, rename (optionally refusing to replace), fsync of the
 * folder. */
#ifndef DCP_WRITE_ATOMIC_H
#define DCP_WRITE_ATOMIC_H

#include <stddef.h>

#include "dcp_write.h"

/* "<dir>/.<name>.tmp-<pid>-<n>" for path "<dir>/<name>" (no trailing '/').
 * Returns 0, or -1 (ENAMETOOLONG) with err filled. */
int dcpw_tmp_name(const char *path, char *tmp, size_t cap, dcp_error *err);

/* Create a temporary file beside path (O_EXCL), its name in tmp. */
int dcpw_tmp_create(const char *path, char *tmp, size_t cap, int *fd, dcp_error *err);

/* Rename tmp to path. no_replace: fail with EEXIST if path exists
 * (renameat2 RENAME_NOREPLACE; where the filesystem lacks it, link+unlink
 * for files, a check then rename for folders, which has a window). sync:
 * fsync path's folder afterwards. */
int dcpw_rename(const char *tmp, const char *path, int no_replace, int sync, dcp_error *err);

/* fsync a folder by path. */
int dcpw_fsync_dir(const char *dir, dcp_error *err);

/* Abandon an unfinished DCP writer (dcp_writer.c) and remove what it made:
 * the rank files it created, and dir (the folder given to dcp_ckpt_create)
 * when it made the folder, only if empty. After dcp_ckpt_finish succeeded
 * it only frees, as dcp_ckpt_free. */
void dcpw_ckpt_discard(dcp_ckpt_writer *w, const char *dir);

/* dcp_ckpt_finish that fails with ECANCELED (removing .metadata.tmp) when
 * cancel is not NULL and *cancel is set just before .metadata is renamed
 * into place: a signal while the data files are synced or .metadata is
 * written stops the writer as one between its pieces does. */
int dcpw_ckpt_finish(dcp_ckpt_writer *w, volatile sig_atomic_t *cancel, dcp_error *err);

#endif
