/* Outputs that appear complete or not at all (see atomic.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic.h"
#include "internal.h"

int dcpw_tmp_name(const char *path, char *tmp, size_t cap, dcp_error *err)
{
    static atomic_uint counter;
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path + 1) : 0;
    /* ".NAME.tmp-PID-N" must stay one name of at most 255 bytes: a long NAME is
     * cut (PID-N keeps it unique); DST itself may have up to 255. */
    int bl = (int)strnlen(slash ? slash + 1 : path, 200);
    int n = snprintf(tmp, cap, "%.*s.%.*s.tmp-%ld-%u", dl, path, bl, slash ? slash + 1 : path, (long)getpid(),
                     atomic_fetch_add(&counter, 1));
    if (n < 0 || (size_t)n >= cap)
        return dcpi_err(err, ENAMETOOLONG, "%s: path too long", path);
    return 0;
}

int dcpw_tmp_create(const char *path, char *tmp, size_t cap, int *fd, dcp_error *err)
{
    if (dcpw_tmp_name(path, tmp, cap, err) < 0)
        return -1;
    *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (*fd < 0)
        return dcpi_err(err, errno, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    return 0;
}

int dcpw_fsync_dir(const char *dir, dcp_error *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dcpi_err(err, errno, "%s: cannot open the folder to fsync it: %s", dir, strerror(errno));
    int rc = 0;
    if (fsync(fd) < 0 && errno != EINVAL)   /* EINVAL: a filesystem without folder fsync */
        rc = dcpi_err(err, errno, "%s: fsync: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

static int parent_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return snprintf(out, cap, ".") < (int)cap ? 0 : -1;
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= cap)
        return -1;
    memcpy(out, path, n);
    out[n] = 0;
    return 0;
}

int dcpw_rename(const char *tmp, const char *path, int no_replace, int sync, dcp_error *err)
{
    if (!no_replace) {
        if (rename(tmp, path) < 0)
            return dcpi_err(err, errno, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    } else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) < 0) {
        int e = errno;
        if (e == EEXIST)
            return dcpi_err(err, EEXIST, "%s: already exists (appeared while it was written; not replaced)", path);
        if (e != EINVAL && e != ENOSYS && e != ENOTSUP)
            return dcpi_err(err, e, "%s: cannot rename %s into place: %s", path, tmp, strerror(e));
        /* The filesystem has no RENAME_NOREPLACE. A file: link fails if
         * path exists. A folder: check, then rename (a window remains). */
        struct stat st;
        if (lstat(tmp, &st) == 0 && !S_ISDIR(st.st_mode)) {
            if (link(tmp, path) < 0)
                return dcpi_err(err, errno, "%s: cannot link %s into place: %s", path, tmp, strerror(errno));
            unlink(tmp);
        } else {
            if (lstat(path, &st) == 0)
                return dcpi_err(err, EEXIST, "%s: already exists (appeared while it was written; not replaced)",
                                path);
            if (rename(tmp, path) < 0)
                return dcpi_err(err, errno, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        }
    }
    if (sync) {
        char dir[4096];
        if (parent_of(path, dir, sizeof dir) < 0)
            return dcpi_err(err, ENAMETOOLONG, "%s: path too long", path);
        return dcpw_fsync_dir(dir, err);
    }
    return 0;
}
