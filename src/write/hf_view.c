/* dcp_hf_view_read: any byte range of any file of a Hugging Face export
 * (hf_plan.c lays the folder out), rendered from the source on demand. Both
 * dcp_export_hf (hf_export.c, 1 MiB at a time) and dcpfs's -o view=hf
 * (whatever range a reader asks for) read through here, so the two are the
 * same bytes.
 *
 * An output's rows are source rows through a row map; rows that stay
 * adjacent form runs, and each run is a contiguous byte range of the source
 * tensor's C-order image, planned and read through dcp_plan_bytes: a
 * permutation reads row by row, a rename in large pieces, and only the
 * touched rows of the touched outputs are read (memory: the caller's buffer,
 * its plan and its staging buffer; never a whole tensor). Casts read source
 * elements into the caller's staging buffer, as many at a time as it holds,
 * and round to nearest even. Bytes of an element cut by the range's ends are
 * rendered whole into a small buffer and trimmed. A transposed output's rows
 * are source columns: blocks of them are read (every mapped row, as many
 * columns as the staging buffer holds) and transposed in memory
 * (render_transposed). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "hf.h"

/* ------------------------------------------------------------ dtype casts */

int hf_is_float(dcp_dtype d)
{
    return d == DCP_FLOAT32 || d == DCP_FLOAT16 || d == DCP_BFLOAT16 || d == DCP_FLOAT64;
}

/* n elements of dtype in at src to dtype out at dst (both floating point),
 * as torch's .to() and dcp digest --dtype cast them (cast.c). */
void hf_cast(dcp_dtype in, const void *src, dcp_dtype out, void *dst, size_t n)
{
    dcpi_cast(src, in, dst, out, n);
}

/* ------------------------------------------------------------ rendering */

/* Source rows [ra, rb) (mapped) by columns [c, c + bc) of output o into
 * stage, row after row (bc elements each): a plan per run of source rows
 * that stay adjacent when the box spans whole rows, else one per row. */
static int read_box(const dcp_hf_view *v, const hf_out *o, int64_t ra, int64_t rb, uint64_t c, uint64_t bc,
                    unsigned char *stage, dcp_plan *plan, dcp_error *err)
{
    size_t isz = dcp_dtype_size(o->in);
    int whole = c == 0 && bc == o->row_elems;
    for (int64_t r = ra; r < rb;) {
        int64_t s = rcp_map_row(o->maps, o->nmaps, r), k = 1;
        while (whole && r + k < rb && rcp_map_row(o->maps, o->nmaps, r + k) == s + k)
            k++;
        uint64_t soff = (o->base + (uint64_t)s * o->row_elems + c) * isz, len = (uint64_t)k * bc * isz;
        if (dcp_plan_bytes(v->ck, o->entry, soff, len, plan, err) < 0)
            return dcpi_err_prefix(err, "%s", o->key);
        if (plan->nbytes != len)
            return dcpi_err(err, EIO, "%s: %s: short read for %s", v->srcp, o->entry->key, o->key);
        if (dcp_plan_execute(v->ck, plan, stage + (uint64_t)(r - ra) * bc * isz, err) < 0)
            return -1;
        r += k;
    }
    return 0;
}

/* Elements [el, el + n) of a transposed output: output row c is source
 * column c, so a range of output rows is a box of source columns (every
 * mapped row) read into the staging buffer, as many columns as it holds,
 * then transposed (and cast) into dst. A range within one output row, or a
 * column longer than the staging buffer, reads only the rows it needs. */
static int render_transposed(const dcp_hf_view *v, const hf_out *o, uint64_t el, uint64_t n, unsigned char *dst,
                             dcp_plan *plan, unsigned char *stage, size_t stage_len, dcp_error *err)
{
    size_t isz = dcp_dtype_size(o->in), osz = dcp_dtype_size(o->out);
    uint64_t R = (uint64_t)o->rows, cap = stage_len / isz;
    if (!cap)
        return dcpi_err(err, EINVAL, "%s: %s: a transpose needs a staging buffer of at least %zu bytes", v->srcp,
                        o->key, isz);
    while (n) {
        uint64_t c = el / R, r = el % R, ra, rb, bc, cnt;
        if (r + n <= R || R > cap) {
            /* Within output row c: source rows [r, rb) of column c. */
            ra = r;
            rb = R - r < n ? R : r + n;
            if (rb - ra > cap)
                rb = ra + cap;
            bc = 1;
        } else {
            /* Whole columns: every row, columns [c, c + bc). */
            ra = 0;
            rb = R;
            bc = (r + n + R - 1) / R;
            if (bc > cap / R)
                bc = cap / R;
            if (bc > o->row_elems - c)
                bc = o->row_elems - c;
        }
        if (read_box(v, o, (int64_t)ra, (int64_t)rb, c, bc, stage, plan, err) < 0)
            return -1;
        /* Box element (row i, column j) is output element (c + j) * R + ra + i. */
        uint64_t h = rb - ra, first = r - ra, end = bc * h;
        if (end - first > n)
            end = first + n;
        cnt = end - first;
        for (uint64_t q = first; q < end; q++) {
            const unsigned char *src = stage + ((q % h) * bc + q / h) * isz;
            if (o->in == o->out)
                memcpy(dst, src, isz);
            else
                hf_cast(o->in, src, o->out, dst, 1);
            dst += osz;
        }
        el += cnt;
        n -= cnt;
    }
    return 0;
}

/* Elements [el, el + n) of output o into dst. */
static int render_elems(const dcp_hf_view *v, const hf_out *o, uint64_t el, uint64_t n, unsigned char *dst,
                        dcp_plan *plan, unsigned char *stage, size_t stage_len, dcp_error *err)
{
    size_t isz = dcp_dtype_size(o->in), osz = dcp_dtype_size(o->out);
    int same = o->in == o->out;
    uint64_t stage_elems = stage_len / isz;
    if (o->transpose)
        return render_transposed(v, o, el, n, dst, plan, stage, stage_len, err);
    if (!same && !stage_elems)
        return dcpi_err(err, EINVAL, "%s: %s: a cast needs a staging buffer of at least %zu bytes", v->srcp, o->key,
                        isz);
    while (n) {
        int64_t r = (int64_t)(el / o->row_elems);
        uint64_t c = el % o->row_elems;
        int64_t s = rcp_map_row(o->maps, o->nmaps, r);
        uint64_t cnt = o->row_elems - c;
        if (cnt > n)
            cnt = n;
        /* Following rows whose sources follow too join the run. */
        for (int64_t rr = r, ss = s; cnt < n && rr + 1 < o->rows; rr++, ss++) {
            if (!same && cnt >= stage_elems)
                break;
            if (rcp_map_row(o->maps, o->nmaps, rr + 1) != ss + 1)
                break;
            cnt += n - cnt < o->row_elems ? n - cnt : o->row_elems;
        }
        if (!same && cnt > stage_elems)
            cnt = stage_elems;
        uint64_t soff = (o->base + (uint64_t)s * o->row_elems + c) * isz;
        if (dcp_plan_bytes(v->ck, o->entry, soff, cnt * isz, plan, err) < 0)
            return dcpi_err_prefix(err, "%s", o->key);
        if (plan->nbytes != cnt * isz)
            return dcpi_err(err, EIO, "%s: %s: short read for %s", v->srcp, o->entry->key, o->key);
        if (dcp_plan_execute(v->ck, plan, same ? dst : stage, err) < 0)
            return -1;
        if (!same)
            hf_cast(o->in, stage, o->out, dst, (size_t)cnt);
        dst += cnt * osz;
        el += cnt;
        n -= cnt;
    }
    return 0;
}

/* Bytes [a, b) of output o (relative to its first byte) into dst. */
static int render_out(const dcp_hf_view *v, const hf_out *o, uint64_t a, uint64_t b, unsigned char *dst,
                      dcp_plan *plan, unsigned char *stage, size_t stage_len, dcp_error *err)
{
    uint64_t osz = dcp_dtype_size(o->out);
    while (a < b) {
        uint64_t ea = a - a % osz;
        if (ea != a || b - a < osz) {
            /* An element cut by the range: render it whole. */
            unsigned char tmp[16];
            if (render_elems(v, o, ea / osz, 1, tmp, plan, stage, stage_len, err) < 0)
                return -1;
            uint64_t n = (ea + osz < b ? ea + osz : b) - a;
            memcpy(dst, tmp + (a - ea), (size_t)n);
            dst += n;
            a += n;
            continue;
        }
        uint64_t n = (b - a) / osz;
        if (render_elems(v, o, a / osz, n, dst, plan, stage, stage_len, err) < 0)
            return -1;
        dst += n * osz;
        a += n * osz;
    }
    return 0;
}

int dcp_hf_view_read(const dcp_hf_view *v, size_t file, uint64_t off, void *buf, size_t len, size_t *got,
                     dcp_plan *plan, void *stage, size_t stage_len, dcp_error *err)
{
    if (got)
        *got = 0;
    if (!v || !got || !plan || (!buf && len) || (!stage && stage_len))
        return dcpi_err(err, EINVAL, "dcp_hf_view_read: a view, a buffer, a plan and a place for the count are "
                        "needed");
    if (file >= v->nfiles)
        return dcpi_err(err, EINVAL, "%s: the export has %zu files, not %zu", v->srcp, v->nfiles, file + 1);
    const hf_file *f = &v->files[file];
    uint64_t size = v->pub[file].size;
    if (off >= size)
        return 0;
    if (len > size - off)
        len = (size_t)(size - off);
    unsigned char *dst = buf;
    uint64_t end = off + len;
    if (off < f->head_len) {
        size_t n = (size_t)((end < f->head_len ? end : f->head_len) - off);
        memcpy(dst, f->head + off, n);
        dst += n;
        off += n;
    }
    /* The first output reaching past off. */
    const hf_out *o = v->outs + f->first;
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o[mid].at + o[mid].nbytes <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < f->count && off < end; i++) {
        uint64_t a = off - o[i].at, b = (end < o[i].at + o[i].nbytes ? end : o[i].at + o[i].nbytes) - o[i].at;
        if (b > a && render_out(v, &o[i], a, b, dst, plan, stage, stage_len, err) < 0)
            return dcpi_err_prefix(err, "%s", v->pub[file].name);
        dst += b - a;
        off += b - a;
    }
    *got = len;
    return 0;
}
