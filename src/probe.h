/* libdcp internals: what a folder holds (probe.c), for dcp_open's message. */
#ifndef DCP_PROBE_H
#define DCP_PROBE_H

#include "dcp.h"

/* dcp_probe_folder on an open folder: dirfd (O_PATH or O_RDONLY, a
 * directory), path for messages and for the folder-name rule. */
int dcpi_probe_at(int dirfd, const char *path, dcp_folder_probe *out, dcp_error *err);

#endif
