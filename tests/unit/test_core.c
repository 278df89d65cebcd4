/* Unit tests of the core's readers: the pickle VM, the metadata model and the
 * record locator, on hand-made bytes, on the bundled PyTorch fixtures (against
 * their manifests) and on corrupted copies of them (never a crash). */
#include "check_quiet.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "pickle.h"
#include "zip.h"

/* The chunks of an entry of a parsed model (they stay until dcp_close). */
static const dcp_chunk *chunks_of(dcp_checkpoint *ck, const dcp_entry *e)
{
    const dcp_chunk *c;
    dcp_error err;
    ck_assert_msg(dcp_entry_chunks(ck, e, &c, &err) == 0, "%s", err.msg);
    return c;
}

static char fixtures[4096];

static void *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc(n ? (size_t)n : 1);
    ck_assert(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert(f != NULL);
    ck_assert(fwrite(b, 1, n, f) == n);
    fclose(f);
}

/* A scratch copy of a fixture checkpoint. */
static char *copy_fixture(const char *name)
{
    static char tmpl[64];
    strcpy(tmpl, "/tmp/dcp-unit.XXXXXX");
    ck_assert(mkdtemp(tmpl) != NULL);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cp -r '%s/%s/ckpt/.' '%s' && chmod -R u+w '%s'", fixtures, name, tmpl, tmpl);
    ck_assert(system(cmd) == 0);
    return tmpl;
}

static void remove_tree(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert(system(cmd) == 0);
}

/* ------------------------------------------------------------ pickle */

static const pk_node *parse_ok(const char *bytes, size_t n, pk_doc **doc)
{
    const pk_node *root;
    dcp_error err;
    int rc = pk_parse(bytes, n, "test", doc, &root, &err);
    ck_assert_msg(rc == 0, "parse failed: %s", err.msg);
    return root;
}

static void parse_fails(const char *bytes, size_t n, const char *want)
{
    pk_doc *doc;
    const pk_node *root;
    dcp_error err;
    ck_assert_int_eq(pk_parse(bytes, n, "test", &doc, &root, &err), -1);
    ck_assert_msg(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
}

START_TEST(pickle_scalars)
{
    /* PROTO 2, MARK, ints of each width, LONG1 2^40 and -1, floats, strings, TUPLE, STOP */
    static const char b[] = "\x80\x02(K\x07M\x34\x12J\xfe\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x01\xff"
                            "G\x3f\xf8\x00\x00\x00\x00\x00\x00X\x03\x00\x00\x00" "abcC\x02hi\x88\x89Nt.";
    pk_doc *doc;
    const pk_node *r = parse_ok(b, sizeof b - 1, &doc);
    ck_assert_int_eq(r->type, PK_TUPLE);
    ck_assert_uint_eq(pk_len(r), 11);
    int64_t v;
    ck_assert(pk_int(pk_item(r, 0), &v) && v == 7);
    ck_assert(pk_int(pk_item(r, 1), &v) && v == 0x1234);
    ck_assert(pk_int(pk_item(r, 2), &v) && v == -2);
    ck_assert(pk_int(pk_item(r, 3), &v) && v == (int64_t)1 << 40);
    ck_assert(pk_int(pk_item(r, 4), &v) && v == -1);
    ck_assert(pk_item(r, 5)->type == PK_FLOAT && pk_item(r, 5)->u.f == 1.5);
    const char *s;
    size_t n;
    ck_assert(pk_str(pk_item(r, 6), &s, &n) && n == 3 && !memcmp(s, "abc", 3));
    ck_assert(pk_item(r, 7)->type == PK_BYTES && pk_item(r, 7)->u.s.len == 2);
    ck_assert(pk_item(r, 8)->type == PK_BOOL && pk_item(r, 8)->u.b);
    ck_assert(pk_item(r, 9)->type == PK_BOOL && !pk_item(r, 9)->u.b);
    ck_assert(pk_item(r, 10)->type == PK_NONE);
    pk_free(doc);
}
END_TEST

START_TEST(pickle_objects_and_memo)
{
    /* Protocol 4: FRAME, STACK_GLOBAL m.C, EMPTY_TUPLE NEWOBJ, dict state via MEMOIZE/BINGET
     * sharing a string, BUILD; then a list appended after memoization (APPENDS), and
     * REDUCE(torch.Size, ((2,3),)). */
    static const char b[] =
        "\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00"
        "\x8c\x01m\x94\x8c\x01""C\x94\x93\x94)\x81\x94}\x94(\x8c\x01k\x94\x8c\x01v\x94u"
        "b"                                       /* BUILD {k: v} */
        "]\x94(h\x05h\x06" "e"                       /* [ 'k', 'v' ] via memo 5 and 6 */
        "\x8c\x05torch\x8c\x04Size\x93K\x02K\x03\x86\x85R"
        "\x87.";
    pk_doc *doc;
    const pk_node *r = parse_ok(b, sizeof b - 1, &doc);
    ck_assert_int_eq(r->type, PK_TUPLE);
    const pk_node *obj = pk_item(r, 0);
    ck_assert(pk_is_global(pk_call_global(obj), "m", "C"));
    ck_assert_int_eq(obj->u.call.kind, PK_NEWOBJ);
    const char *s;
    ck_assert(pk_str(pk_dict_get(obj->u.call.state, "k"), &s, NULL) && !strcmp(s, "v"));
    const pk_node *list = pk_item(r, 1);
    ck_assert_uint_eq(pk_len(list), 2);
    ck_assert_ptr_eq(pk_item(list, 0), obj->u.call.state->u.dict.keys[0]);   /* shared, not copied */
    const pk_node *size = pk_item(r, 2);
    ck_assert(pk_is_global(pk_call_global(size), "torch", "Size"));
    ck_assert_uint_eq(pk_len(pk_item(size->u.call.args, 0)), 2);
    pk_free(doc);
}
END_TEST

START_TEST(pickle_protocol2_globals_and_persid)
{
    /* data.pkl shape: GLOBAL, MARK ... TUPLE BINPERSID, BINPUT/BINGET, OrderedDict() */
    static const char b[] = "\x80\x02\x63torch._utils\n_rebuild_tensor_v2\nq\x00((X\x07\x00\x00\x00storageq\x01"
                            "ctorch\nFloatStorage\nq\x02X\x01\x00\x00\x00" "0X\x03\x00\x00\x00" "cpuK\x0ctQK\x00K\x04K\x03"
                            "\x86K\x01K\x04\x86\x89\x63\x63ollections\nOrderedDict\n)Rtq\x03Rq\x04.";
    pk_doc *doc;
    const pk_node *r = parse_ok(b, sizeof b - 1, &doc);
    ck_assert(pk_is_global(pk_call_global(r), "torch._utils", "_rebuild_tensor_v2"));
    const pk_node *st = pk_item(r->u.call.args, 0);
    ck_assert_int_eq(st->type, PK_PERSID);
    ck_assert(pk_is_global(pk_item(st->u.persid.pid, 1), "torch", "FloatStorage"));
    pk_free(doc);
}
END_TEST

START_TEST(pickle_hostile)
{
    parse_fails("", 0, "empty");
    parse_fails("hello", 5, "not a pickle");
    parse_fails("\x80\x02", 2, "truncated");
    parse_fails("\x80\x02X\xff\xff\xff\x7f", 7, "truncated");           /* 2 GiB string in 7 bytes */
    parse_fails("\x80\x02h\x05.", 4, "memo");                           /* undefined memo */
    parse_fails("\x80\x02r\xff\xff\xff\x7f.", 8, "");                   /* memo put with empty stack */
    parse_fails("\x80\x02q\x01.", 4, "underflow");
    parse_fails("\x80\x02t.", 3, "MARK");                               /* TUPLE without MARK */
    parse_fails("\x80\x02R.", 3, "underflow");
    parse_fails("\x80\x02K\x01K\x02R.", 7, "tuple");                    /* REDUCE args not a tuple */
    parse_fails("\x80\x02K\x01\x97.", 5, "opcode 0x97");                /* protocol-5 buffers */
    parse_fails("\x80\x02}K\x01u.", 6, "MARK");
    parse_fails("\x80\x02K\x01" "a.", 5, "underflow");                     /* APPEND without a list */
    parse_fails("\x80\x02]K\x01}u.", 7, "MARK");
    parse_fails("\x80\x02N\x8a\xff", 5, "truncated");
    /* Deep nesting is iterative: 100k EMPTY_LIST+APPEND levels parse without recursion. */
    size_t n = 2 + 100000 * 2 + 1;
    char *deep = malloc(n + 1);
    deep[0] = '\x80';
    deep[1] = 2;
    memset(deep + 2, ']', 100000);
    memset(deep + 2 + 100000, 'a', 99999);
    deep[n - 2] = '.';
    pk_doc *doc;
    const pk_node *root;
    dcp_error err;
    ck_assert_int_eq(pk_parse(deep, n - 1, "deep", &doc, &root, &err), 0);
    pk_free(doc);
    free(deep);
}
END_TEST

/* Every prefix and many single-byte corruptions of a real .metadata: an error
 * or a success, never a crash (the sanitizer build checks memory safety). */
START_TEST(metadata_truncated_and_flipped)
{
    char *dir = copy_fixture("05_mixed_2ranks");
    char meta[4200];
    snprintf(meta, sizeof meta, "%s/.metadata", dir);
    size_t n;
    unsigned char *orig = slurp(meta, &n);
    dcp_checkpoint *ck;
    dcp_error err;
    for (size_t cut = 0; cut < n; cut += 1 + cut / 64) {
        spit(meta, orig, cut);
        ck_assert_int_eq(dcp_open(dir, 0, &ck, &err), -1);
        ck_assert_msg(strstr(err.msg, ".metadata") != NULL, "error lacks the file: %s", err.msg);
    }
    unsigned char *copy = malloc(n);
    srand(5);
    for (size_t i = 0; i < n; i += 3) {
        memcpy(copy, orig, n);
        copy[i] ^= (unsigned char)(1 + rand() % 255);
        spit(meta, copy, n);
        if (dcp_open(dir, 0, &ck, &err) == 0) {
            for (size_t k = 0; k < dcp_num_entries(ck); k++) {   /* whatever was parsed must be usable */
                void *buf;
                uint64_t len;
                if (dcp_read_entry(ck, dcp_entry_at(ck, k), &buf, &len, &err) == 0)
                    free(buf);
            }
            dcp_close(ck);
        }
    }
    free(copy);
    free(orig);
    remove_tree(dir);
}
END_TEST

/* ------------------------------------------------------------ fixtures */

static json_t *manifest(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s/expected/manifest.json", fixtures, name);
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    ck_assert_msg(m != NULL, "%s: %s", path, je.text);
    return m;
}

static void check_fixture(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s/ckpt", fixtures, name);
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_msg(dcp_open(path, 0, &ck, &err) == 0, "%s", err.msg);
    json_t *m = manifest(name), *entries = json_object_get(m, "entries"), *e;
    size_t i;
    ck_assert_uint_eq(dcp_num_entries(ck), json_array_size(entries));
    json_array_foreach(entries, i, e) {
        const char *key = json_string_value(json_object_get(e, "key"));
        const dcp_entry *de = dcp_find(ck, key);
        ck_assert_msg(de != NULL, "%s: %s missing", name, key);
        if (!strcmp(json_string_value(json_object_get(e, "kind")), "bytes")) {
            ck_assert_int_eq(de->kind, DCP_KIND_BYTES);
            json_t *loc = json_object_get(e, "location");
            ck_assert_str_eq(dcp_file_name(ck, de->blob.file), json_string_value(json_object_get(loc, "file")));
            ck_assert_uint_eq(de->blob.offset, json_integer_value(json_object_get(loc, "offset")));
            ck_assert_uint_eq(de->blob.length, json_integer_value(json_object_get(loc, "length")));
            continue;
        }
        ck_assert_int_eq(de->kind, DCP_KIND_TENSOR);
        ck_assert_str_eq(dcp_dtype_name(de->dtype), json_string_value(json_object_get(e, "dtype")));
        json_t *chunks = json_object_get(e, "chunks"), *c;
        size_t j;
        ck_assert_uint_eq(de->nchunks, json_array_size(chunks));
        json_array_foreach(chunks, j, c) {
            /* Chunk order follows the metadata, as in the manifest. */
            const dcp_chunk *dc = &chunks_of(ck, de)[j];
            json_t *offs = json_object_get(c, "offsets");
            for (int d = 0; d < de->ndim; d++)
                ck_assert_int_eq(dc->offsets[d], json_integer_value(json_array_get(offs, (size_t)d)));
            ck_assert_str_eq(dcp_file_name(ck, dc->blob.file), json_string_value(json_object_get(c, "file")));
            ck_assert_uint_eq(dc->blob.offset, json_integer_value(json_object_get(c, "offset")));
            ck_assert_uint_eq(dc->blob.length, json_integer_value(json_object_get(c, "length")));
            json_t *st = json_object_get(c, "stored_tensor");
            if (!st)
                continue;
            const dcp_record *r;
            ck_assert_msg(dcp_chunk_record(ck, de, j, &r, &err) == 0, "%s", err.msg);
            ck_assert_uint_eq(r->data_offset, json_integer_value(json_object_get(st, "data_offset_in_file")));
            json_t *stride = json_object_get(st, "stride");
            for (int d = 0; d < de->ndim; d++)
                ck_assert_int_eq(r->stride[d], json_integer_value(json_array_get(stride, (size_t)d)));
            ck_assert_int_eq(r->storage_offset, json_integer_value(json_object_get(st, "storage_offset")));
        }
    }
    json_decref(m);
    dcp_close(ck);
}

START_TEST(fixtures_match_manifest)
{
    static const char *names[] = {"01_single_plain", "02_rowwise_4ranks", "03_colwise_4ranks",
                                  "04_block_4ranks", "05_mixed_2ranks", "08_single_file_per_rank"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        check_fixture(names[i]);
}
END_TEST

START_TEST(transposed_views_keep_their_strides)
{
    dcp_checkpoint *ck;
    dcp_error err;
    char path[4200];
    snprintf(path, sizeof path, "%s/01_single_plain/ckpt", fixtures);
    ck_assert_msg(dcp_open(path, 0, &ck, &err) == 0, "%s", err.msg);
    const dcp_entry *t = dcp_find(ck, "views.transposed"), *s = dcp_find(ck, "views.slice_of_transposed");
    const dcp_record *r;
    ck_assert(dcp_chunk_record(ck, t, 0, &r, &err) == 0);
    ck_assert(r->stride[0] == 1 && r->stride[1] == 10);
    ck_assert(dcp_chunk_record(ck, s, 0, &r, &err) == 0);
    ck_assert(r->stride[0] == 1 && r->stride[1] == 12);
    ck_assert_str_eq(dcp_get_info(ck)->generation, "torch 1.13 (torch.distributed._shard.checkpoint)");
    dcp_close(ck);
}
END_TEST

/* The lookups of the error contract: a key that is not there is -1 with
 * DCP_ENOTFOUND and a message naming the folder and the key; the calls of
 * 0.1 give the same entries, or NULL. */
START_TEST(lookups_tell_not_found_from_found)
{
    dcp_checkpoint *ck;
    dcp_error err;
    char path[4200];
    snprintf(path, sizeof path, "%s/01_single_plain/ckpt", fixtures);
    ck_assert_msg(dcp_open(path, 0, &ck, &err) == 0, "%s", err.msg);
    const dcp_entry *e = (const dcp_entry *)&err;   /* set to NULL on a miss */
    ck_assert_int_eq(dcp_find_entry(ck, "views.transposed", &e, &err), 0);
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->key, "views.transposed");
    ck_assert_ptr_eq(e, dcp_find(ck, "views.transposed"));

    memset(&err, 0, sizeof err);
    ck_assert_int_eq(dcp_find_entry(ck, "views.no_such", &e, &err), -1);
    ck_assert_ptr_null(e);
    ck_assert_int_eq(err.code, DCP_ENOTFOUND);
    char want[4300];
    snprintf(want, sizeof want, "%s: views.no_such: no such key", path);
    ck_assert_str_eq(err.msg, want);
    ck_assert_ptr_null(dcp_find(ck, "views.no_such"));
    ck_assert_int_eq(dcp_find_entry(ck, "", &e, &err), -1);
    ck_assert_int_eq(err.code, DCP_ENOTFOUND);

    size_t n = dcp_num_entries(ck);
    ck_assert_uint_gt(n, 0);
    ck_assert_int_eq(dcp_get_entry(ck, n - 1, &e, &err), 0);
    ck_assert_ptr_eq(e, dcp_entry_at(ck, n - 1));
    ck_assert_int_eq(dcp_get_entry(ck, n, &e, &err), -1);
    ck_assert_ptr_null(e);
    ck_assert_int_eq(err.code, DCP_ENOTFOUND);
    snprintf(want, sizeof want, "%s: entry %zu: no such entry (the checkpoint has %zu)", path, n, n);
    ck_assert_str_eq(err.msg, want);
    ck_assert_ptr_null(dcp_entry_at(ck, n));
    ck_assert_int_eq(dcp_get_entry(ck, SIZE_MAX, &e, &err), -1);
    ck_assert_int_eq(err.code, DCP_ENOTFOUND);
    /* no errno value is DCP_ENOTFOUND: "not there" never reads as a failure */
    ck_assert_int_ne(DCP_ENOTFOUND, ENOENT);
    ck_assert_int_gt(DCP_ENOTFOUND, 4095);
    dcp_close(ck);
}
END_TEST

/* Corrupt every byte of a shard that holds several blobs (08): each read is a
 * success or an error naming the file, never a crash or a wrong-sized read. */
START_TEST(records_corrupted)
{
    char *dir = copy_fixture("08_single_file_per_rank");
    char shard[4200];
    snprintf(shard, sizeof shard, "%s/__0_0.distcp", dir);
    size_t n;
    unsigned char *orig = slurp(shard, &n), *copy = malloc(n);
    dcp_error err;
    int errors = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(copy, orig, n);
        copy[i] ^= 0x5a;
        spit(shard, copy, n);
        dcp_checkpoint *ck;
        ck_assert_msg(dcp_open(dir, 0, &ck, &err) == 0, "%s", err.msg);
        for (size_t k = 0; k < dcp_num_entries(ck); k++) {
            void *buf;
            uint64_t len;
            if (dcp_read_entry(ck, dcp_entry_at(ck, k), &buf, &len, &err) == 0) {
                free(buf);
            } else {
                errors++;
                ck_assert_msg(strstr(err.msg, "__0_0.distcp") || strstr(err.msg, "chunk"),
                              "error names no file: %s", err.msg);
            }
        }
        dcp_close(ck);
    }
    ck_assert_int_gt(errors, 100);   /* the headers and records are checked, not trusted */
    /* Truncations: every read that needs the missing bytes fails with EIO. */
    for (size_t cut = 0; cut < n; cut += 37) {
        spit(shard, orig, cut);
        dcp_checkpoint *ck;
        ck_assert(dcp_open(dir, 0, &ck, &err) == 0);
        const dcp_entry *w = dcp_find(ck, "a.weight");
        void *buf;
        uint64_t len;
        if (dcp_read_entry(ck, w, &buf, &len, &err) == 0)
            free(buf);
        else
            ck_assert_msg(err.code == EIO, "%s", err.msg);
        dcp_close(ck);
    }
    free(copy);
    free(orig);
    remove_tree(dir);
}
END_TEST

/* A blob whose central directory uses zip64 extra fields for every size and offset. */
static size_t build_zip64_blob(unsigned char *out, const char *pkl, size_t pkl_len, const void *data,
                               size_t data_len)
{
    size_t pos = 0;
    struct { const char *name; const void *p; size_t n; size_t lh; } rec[2] = {
        {"archive/data.pkl", pkl, pkl_len, 0}, {"archive/data/0", data, data_len, 0}};
#define PUT16(v) do { out[pos++] = (unsigned char)((v) & 0xff); out[pos++] = (unsigned char)(((v) >> 8) & 0xff); } while (0)
#define PUT32(v) do { for (int k_ = 0; k_ < 4; k_++) out[pos++] = (unsigned char)(((uint64_t)(v) >> (8 * k_)) & 0xff); } while (0)
#define PUT64(v) do { for (int k_ = 0; k_ < 8; k_++) out[pos++] = (unsigned char)(((uint64_t)(v) >> (8 * k_)) & 0xff); } while (0)
    for (int r = 0; r < 2; r++) {
        rec[r].lh = pos;
        size_t nl = strlen(rec[r].name);
        memcpy(out + pos, "PK\3\4", 4); pos += 4;
        PUT16(45); PUT16(0x0800); PUT16(0); PUT32(0); PUT32(0); PUT32(0); PUT32(0);
        PUT16(nl); PUT16(0);
        memcpy(out + pos, rec[r].name, nl); pos += nl;
        memcpy(out + pos, rec[r].p, rec[r].n); pos += rec[r].n;
    }
    size_t cd = pos;
    for (int r = 0; r < 2; r++) {
        size_t nl = strlen(rec[r].name);
        memcpy(out + pos, "PK\1\2", 4); pos += 4;
        PUT16(45); PUT16(45); PUT16(0x0800); PUT16(0); PUT32(0); PUT32(0);
        PUT32(0xffffffffu); PUT32(0xffffffffu);
        PUT16(nl); PUT16(28); PUT16(0); PUT16(0); PUT16(0); PUT32(0); PUT32(0xffffffffu);
        memcpy(out + pos, rec[r].name, nl); pos += nl;
        PUT16(1); PUT16(24); PUT64(rec[r].n); PUT64(rec[r].n); PUT64(rec[r].lh);
    }
    size_t cd_size = pos - cd, z64 = pos;
    memcpy(out + pos, "PK\6\6", 4); pos += 4;
    PUT64(44); PUT16(45); PUT16(45); PUT32(0); PUT32(0); PUT64(2); PUT64(2); PUT64(cd_size); PUT64(cd);
    memcpy(out + pos, "PK\6\7", 4); pos += 4;
    PUT32(0); PUT64(z64); PUT32(1);
    memcpy(out + pos, "PK\5\6", 4); pos += 4;
    PUT16(0); PUT16(0); PUT16(0xffff); PUT16(0xffff); PUT32(0xffffffffu); PUT32(0xffffffffu); PUT16(0);
    return pos;
}

START_TEST(zip64_central_directory)
{
    /* The zip reader on a blob whose central directory puts every size and
     * offset in zip64 extra fields (as torch.save does past 4 GiB). */
    char *dir = copy_fixture("01_single_plain");
    char path[4200];
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert(dcp_open(dir, 0, &ck, &err) == 0);
    const dcp_entry *e = dcp_find(ck, "dtypes.float32");
    snprintf(path, sizeof path, "%s/%s", dir, dcp_file_name(ck, chunks_of(ck, e)[0].blob.file));
    void *want;
    uint64_t wlen;
    ck_assert(dcp_read_entry(ck, e, &want, &wlen, &err) == 0);
    dcp_close(ck);
    /* data.pkl: _rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', 15), 0, (3,5), (5,1), False, OrderedDict()) */
    static const char pkl[] = "\x80\x02\x63torch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
                              "ctorch\nFloatStorage\nX\x01\x00\x00\x00" "0X\x03\x00\x00\x00" "cpuK\x0ftQK\x00K\x03K\x05"
                              "\x86K\x05K\x01\x86\x89\x63\x63ollections\nOrderedDict\n)Rtr.";
    unsigned char blob[4096];
    size_t n = build_zip64_blob(blob, pkl, sizeof pkl - 1, want, wlen);
    spit(path, blob, n);
    dcpi_zip z;
    dcp_blob b = {.file = 0, .offset = 0, .length = n};
    dcp_checkpoint *ck2;
    ck_assert(dcp_open(dir, 0, &ck2, &err) == 0);
    e = dcp_find(ck2, "dtypes.float32");
    b.file = chunks_of(ck2, e)[0].blob.file;
    ck_assert_msg(dcpi_zip_open(ck2, &b, "dtypes.float32", &z, &err) == 0, "%s", err.msg);
    const dcpi_zip_entry *ze = dcpi_zip_find(&z, "data/0");
    ck_assert(ze != NULL);
    ck_assert_uint_eq(ze->size, wlen);
    uint64_t start;
    ck_assert(dcpi_zip_data(ck2, &b, "dtypes.float32", ze, n, &start, &err) == 0);
    unsigned char back[64];
    ck_assert(dcpi_blob_read(ck2, &b, back, wlen, start, "dtypes.float32", &err) == 0);
    ck_assert(!memcmp(back, want, wlen));
    dcpi_zip_close(&z);
    dcp_close(ck2);
    free(want);
    remove_tree(dir);
}
END_TEST

/* The version macros agree with each other and with the library. */
START_TEST(version_numbers)
{
    ck_assert_uint_eq(dcp_version_number(), DCP_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", DCP_VERSION_MAJOR, DCP_VERSION_MINOR, DCP_VERSION_PATCH);
    ck_assert_str_eq(DCP_VERSION_STRING, want);
    ck_assert_str_eq(dcp_version(), want);
    ck_assert_int_eq(DCP_VERSION_NUMBER,
                     DCP_VERSION_MAJOR * 10000 + DCP_VERSION_MINOR * 100 + DCP_VERSION_PATCH);
}
END_TEST

int main(void)
{
    const char *top = getenv("top_srcdir");
    snprintf(fixtures, sizeof fixtures, "%s/tests/fixtures", top ? top : "..");
    Suite *s = suite_create("core");
    TCase *v = tcase_create("version");
    tcase_add_test(v, version_numbers);
    suite_add_tcase(s, v);
    TCase *p = tcase_create("pickle");
    tcase_add_test(p, pickle_scalars);
    tcase_add_test(p, pickle_objects_and_memo);
    tcase_add_test(p, pickle_protocol2_globals_and_persid);
    tcase_add_test(p, pickle_hostile);
    suite_add_tcase(s, p);
    TCase *m = tcase_create("metadata");
    tcase_set_timeout(m, 120);
    tcase_add_test(m, fixtures_match_manifest);
    tcase_add_test(m, transposed_views_keep_their_strides);
    tcase_add_test(m, lookups_tell_not_found_from_found);
    tcase_add_test(m, metadata_truncated_and_flipped);
    suite_add_tcase(s, m);
    TCase *r = tcase_create("records");
    tcase_set_timeout(r, 300);
    tcase_add_test(r, records_corrupted);
    tcase_add_test(r, zip64_central_directory);
    suite_add_tcase(s, r);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
