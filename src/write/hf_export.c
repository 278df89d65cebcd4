/* dcp_export_hf: a checkpoint written as a Hugging Face model folder.
 *
 * The folder is the view hf_plan.c lays out (dcp_hf_view_build), each of its
 * files written with the bytes hf_view.c renders (dcp_hf_view_read), 1 MiB
 * at a time through a 4 MiB staging buffer for casts: nothing here knows
 * the layout, so a dcpfs mount of the same view (-o view=hf:NAME) holds the
 * same bytes. The folder is written under a temporary name, every file and
 * the folder fsynced, and renamed into place at the end, never replacing
 * anything, as dcp_convert_files does. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic.h"
#include "hf.h"
#include "sized_opts.h"

#define PIECE (1u << 20)             /* bytes rendered and written at a time */
#define STAGE_BYTES (4u << 20)       /* source bytes staged for a cast */

static void remove_tmp(const char *p)
{
    DIR *d = opendir(p);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlinkat(dirfd(d), de->d_name, 0);
    if (d)
        closedir(d);
    rmdir(p);
}

typedef struct writer {
    const dcp_hf_view *v;
    const dcp_export_options *opt;
    unsigned char *piece, *stage;
    dcp_plan plan;
    uint64_t done;                   /* tensor bytes written (progress) */
} writer;

/* File i of the view as dir/NAME. */
static int write_file(writer *w, const char *dir, size_t i, dcp_error *err)
{
    const dcp_hf_file *f = &w->v->pub[i];
    uint64_t head = w->v->files[i].count ? w->v->files[i].head_len : f->size;
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, f->name) >= sizeof path)
        return dcpi_err(err, ENAMETOOLONG, "%s: path too long", dir);
    int rc = 0, fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        return dcpi_err(err, errno, "%s: cannot create: %s", path, strerror(errno));
    for (uint64_t off = 0; rc == 0 && off < f->size;) {
        size_t got, done = 0;
        if (w->opt->cancel && *w->opt->cancel) {   /* the caller asked to stop: removed as on any error */
            rc = dcpi_err(err, ECANCELED, "%s: interrupted: nothing was written", path);
            break;
        }
        if (dcp_hf_view_read(w->v, i, off, w->piece, PIECE, &got, &w->plan, w->stage, STAGE_BYTES, err) < 0) {
            rc = dcpi_err_prefix(err, "%s", path);
            break;
        }
        if (got == 0) {
            rc = dcpi_err(err, EIO, "%s: the view ends at %llu bytes of %llu", path, (unsigned long long)off,
                          (unsigned long long)f->size);
            break;
        }
        while (rc == 0 && done < got) {
            ssize_t n = write(fd, w->piece + done, got - done);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                rc = dcpi_err(err, n < 0 ? errno : EIO, "%s: write: %s", path,
                              n < 0 ? strerror(errno) : "no progress");
            else
                done += (size_t)n;
        }
        /* Progress counts tensor bytes, the headers and JSON files aside. */
        uint64_t a = off > head ? off : head, b = off + got;
        if (rc == 0 && b > a) {
            w->done += b - a;
            if (w->opt->progress)
                w->opt->progress(w->opt->progress_ctx, w->done, w->v->total);
        }
        off += got;
    }
    if (rc == 0 && !(w->opt->flags & DCP_EXPORT_NO_SYNC) && fsync(fd) < 0)
        rc = dcpi_err(err, errno, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) < 0 && rc == 0)
        rc = dcpi_err(err, errno, "%s: close: %s", path, strerror(errno));
    return rc;
}

static int open_source(const char *srcp, const dcp_export_options *opt, dcp_checkpoint **ck, dcp_error *err)
{
    struct stat st;
    if (stat(srcp, &st) < 0)
        return dcpi_err(err, errno, "%s: cannot open: %s", srcp, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        dcp_open_options oo = DCP_OPEN_OPTIONS_INIT;
        oo.flags = opt->flags & DCP_EXPORT_RANK ? DCP_OPEN_RANK : 0;
        oo.rank = opt->rank;
        return dcp_open_ex(srcp, &oo, ck, err);
    }
    if (opt->flags & DCP_EXPORT_RANK)
        return dcpi_err(err, EINVAL, "%s: rank %u's view is of a rank-local checkpoint folder, its __%u.metadata; "
                        "this is a single file", srcp, opt->rank, opt->rank);
    return dcp_open_file(srcp, DCP_FORMAT_AUTO, ck, NULL, err);
}

int dcp_export_hf(const char *srcp, const char *dst_in, const dcp_export_options *caller, dcp_error *err)
{
    if (!srcp || !dst_in || !caller)
        return dcpi_err(err, EINVAL, "dcp_export_hf: a source, a destination and options are needed");
    dcp_export_options o;
    const dcp_export_options *opt = &o;
    /* At least the first sized layout (0.2), which ends at the field named. */
    if (dcpi_sized_opts(&o, sizeof o, DCPI_OPTS_MIN(dcp_export_options, skipped_ctx), caller, "dcp_export_hf",
                        "DCP_EXPORT_OPTIONS_INIT", err) < 0)
        return -1;
    if (opt->dtype != DCP_DTYPE_INVALID && !hf_is_float(opt->dtype))
        return dcpi_err(err, EINVAL, "%s: --dtype %s: float32, float16, bfloat16 or float64", dst_in,
                        dcp_dtype_name(opt->dtype) ? dcp_dtype_name(opt->dtype) : "?");
    char dst[4096];
    size_t dl = strlen(dst_in);
    while (dl > 1 && dst_in[dl - 1] == '/')
        dl--;
    if (dl >= sizeof dst)
        return dcpi_err(err, ENAMETOOLONG, "%s: path too long", dst_in);
    memcpy(dst, dst_in, dl);
    dst[dl] = 0;
    struct stat st;
    if (lstat(dst, &st) == 0)
        return dcpi_err(err, EEXIST, "%s: already exists (an export never overwrites)", dst);
    /* The recipe and the config before the source: their errors first. */
    if (dcp_export_check(opt, err) < 0)
        return -1;

    dcp_checkpoint *ck = NULL;
    dcp_hf_view *v = NULL;
    writer w = {.opt = opt};
    dcp_plan_init(&w.plan);
    char tmp[4200] = "";
    int rc = open_source(srcp, opt, &ck, err);
    if (rc == 0 && dcpi_path_inside(dst, ck))   /* it would join the source */
        rc = dcpi_err(err, EINVAL, "%s: lies inside the source checkpoint %s, which an export never writes into", dst,
                      srcp);
    if (rc == 0)
        rc = hf_view_build(ck, srcp, opt, &v, err);
    w.v = v;
    if (rc == 0 && (!(w.piece = malloc(PIECE)) || !(w.stage = malloc(STAGE_BYTES))))
        rc = dcpi_err(err, ENOMEM, "%s: out of memory", srcp);
    if (rc == 0 && (rc = dcpw_tmp_name(dst, tmp, sizeof tmp, err)) == 0 && mkdir(tmp, 0777) < 0) {
        rc = dcpi_err(err, errno, "%s: cannot create: %s", tmp, strerror(errno));
        tmp[0] = 0;
    }
    for (size_t i = 0; rc == 0 && i < v->nfiles; i++)
        rc = write_file(&w, tmp, i, err);
    int sync = !(opt->flags & DCP_EXPORT_NO_SYNC);
    if (rc == 0 && sync)
        rc = dcpw_fsync_dir(tmp, err);
    if (rc == 0 && opt->cancel && *opt->cancel)   /* a signal while the last file was synced */
        rc = dcpi_err(err, ECANCELED, "%s: interrupted: nothing was written", dst);
    if (rc == 0)
        rc = dcpw_rename(tmp, dst, 1, sync, err);
    if (rc < 0 && tmp[0])
        remove_tmp(tmp);
    free(w.piece);
    free(w.stage);
    dcp_plan_free(&w.plan);
    dcp_hf_view_free(v);
    dcp_close(ck);
    return rc;
}
