/* Reading data files (files.c), for the other readers of the core: plan
 * execution (reader.c) and the blob decoder. The fd cache and exact reads;
 * dcpi_ck_fd, dcpi_ck_file_size and dcpi_pread_full are in internal.h. */
#ifndef DCP_FILES_H
#define DCP_FILES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "dcp.h"

/* Take a use of file's fd (opening it if needed) and its size; release it
 * after the read. With pin, it is never closed before dcp_close and needs
 * no release. */
int dcpi_fd_acquire(dcp_checkpoint *ck, uint32_t file, const char *key, int pin, int *fd,
                    uint64_t *size, dcp_error *err);
void dcpi_fd_release(dcp_checkpoint *ck, uint32_t file);
/* How many data files' fds are open now, pinned ones included (tests). */
size_t dcpi_files_open(dcp_checkpoint *ck);

/* Note each data file's device and inode now (dcp_open, right after the
 * metadata was read): a file opened later must be the same one, else the
 * read fails with EIO (the checkpoint was replaced). Missing files are
 * left to the read that needs them. */
void dcpi_files_note_identity(dcp_checkpoint *ck);
/* After reading data file `file` through fd: 0 when it is still the file
 * noted (same device, inode, size and mtime), else -1 with EIO naming the
 * file and key (replaced, or written to in place: the bytes read may be the
 * new save's, not those the model describes). */
int dcpi_file_unchanged(dcp_checkpoint *ck, uint32_t file, int fd, const char *key, dcp_error *err);

/* Read iov[0..cnt) (not modified) from offset off: all of it, up to end of
 * file, or with RWF_NOWAIT in flags the prefix in the page cache. Large
 * reads go in pieces on several threads (dcp_read_threads). *got: the bytes
 * that arrived, a prefix. Returns 0 or an errno (never an error for what
 * RWF_NOWAIT could not read at once). */
int dcpi_preadv_exact(int fd, const struct iovec *iov, int cnt, uint64_t off, int flags, size_t *got);
int dcpi_pread_exact(int fd, void *buf, size_t len, uint64_t off, size_t *got);
/* The dcp_read_threads() budget is shared by the threads reading at once:
 * a read is split only into the threads left of it, so callers that read on
 * many threads of their own read each request whole. For tests: count n more
 * (or, negative, fewer) threads as reading; and how many piece threads have
 * been started so far. */
void dcpi_read_budget_hold(int n);
unsigned long dcpi_read_pieces_started(void);

/* EOVERFLOW when [off, off+len) cannot be in any file. */
int dcpi_check_range(dcp_checkpoint *ck, uint32_t file, const char *key, uint64_t off, uint64_t len,
                     dcp_error *err);
/* The error of a failed (e) or short read of [off, off+want) from fd: file,
 * key, offset, and the file's size now (it may have shrunk since it was opened). */
int dcpi_read_error(dcp_checkpoint *ck, uint32_t file, const char *key, uint64_t off, uint64_t want, int fd,
                    int e, dcp_error *err);

#endif
