/* The pickle VM opcode by opcode, on hand-written byte strings: values,
 * containers, the memo (shared and mutated nodes), objects, persistent ids,
 * frames; then hostile input: every error names its reason and offset, and
 * truncated, flipped and random bytes never crash (run under ASan too);
 * streams: batches handed over in order and freed, memo references back
 * across them, hostile files. */
#include "check_quiet.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "pickle.h"

/* Byte strings are written as C literals: B("...") gives pointer and length. */
#define B(lit) (lit), (sizeof(lit) - 1)

static pk_doc *doc;

static const pk_node *ok(const char *b, size_t n)
{
    const pk_node *root;
    dcp_error err;
    int rc = pk_parse(b, n, "t.pkl", &doc, &root, &err);
    ck_assert_msg(rc == 0, "parse failed: %s", err.msg);
    ck_assert_ptr_nonnull(root);
    return root;
}

static void done(void)
{
    pk_free(doc);
    doc = NULL;
}

/* The parse fails and the message contains `want` (and names the source). */
static void bad(const char *b, size_t n, const char *want)
{
    pk_doc *d = (pk_doc *)1;
    const pk_node *root = (const pk_node *)1;
    dcp_error err;
    ck_assert_int_eq(pk_parse(b, n, "t.pkl", &d, &root, &err), -1);
    ck_assert_ptr_null(d);
    ck_assert_ptr_null(root);
    ck_assert_msg(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    ck_assert_msg(strncmp(err.msg, "t.pkl: ", 7) == 0, "error '%s' does not name the source", err.msg);
}

static int64_t ival(const pk_node *n)
{
    int64_t v = 0;
    ck_assert_msg(pk_int(n, &v), "not an int (type %d)", n ? (int)n->type : -1);
    return v;
}

static const char *sval(const pk_node *n)
{
    const char *s;
    ck_assert(pk_str(n, &s, NULL));
    return s;
}

/* ------------------------------------------------------------ scalars */

START_TEST(ints)
{
    /* BININT1, BININT2, BININT (signed), text INT and LONG, I00/I01 booleans */
    const pk_node *r = ok(B("\x80\x02(K\xffM\xff\xffJ\x00\x00\x00\x80J\xff\xff\xff\x7f"
                            "I-12\nL123456789012L\nI01\nI00\nt."));
    ck_assert_uint_eq(pk_len(r), 8);
    ck_assert_int_eq(ival(pk_item(r, 0)), 255);
    ck_assert_int_eq(ival(pk_item(r, 1)), 65535);
    ck_assert_int_eq(ival(pk_item(r, 2)), INT32_MIN);
    ck_assert_int_eq(ival(pk_item(r, 3)), INT32_MAX);
    ck_assert_int_eq(ival(pk_item(r, 4)), -12);
    ck_assert_int_eq(ival(pk_item(r, 5)), 123456789012LL);
    ck_assert(pk_item(r, 6)->type == PK_BOOL && pk_item(r, 6)->u.b);
    ck_assert(pk_item(r, 7)->type == PK_BOOL && !pk_item(r, 7)->u.b);
    ck_assert(pk_item(r, 8) == NULL);
    done();
    r = ok(B("\x80\x02I00\n."));
    ck_assert(r->type == PK_BOOL && !r->u.b);
    done();
}
END_TEST

START_TEST(longs)
{
    /* LONG1: empty (0), 5e9, -1, -2^63 in 8 bytes, a non-minimal 10-byte 7 and
     * -2 (fit int64: PK_INT), 2^64 (9 bytes: PK_BIGINT); LONG4 of 3 bytes and of
     * 12 bytes. */
    const pk_node *r = ok(B("\x80\x02("
                            "\x8a\x00"
                            "\x8a\x05\x00\xf2\x05\x2a\x01"
                            "\x8a\x01\xff"
                            "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"
                            "\x8a\x0a\x07\x00\x00\x00\x00\x00\x00\x00\x00\x00"
                            "\x8a\x0a\xfe\xff\xff\xff\xff\xff\xff\xff\xff\xff"
                            "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01"
                            "\x8b\x03\x00\x00\x00\x01\x02\x03"
                            "\x8b\x0c\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80"
                            "t."));
    ck_assert_uint_eq(pk_len(r), 9);
    ck_assert_int_eq(ival(pk_item(r, 0)), 0);
    ck_assert_int_eq(ival(pk_item(r, 1)), 5000000000LL);
    ck_assert_int_eq(ival(pk_item(r, 2)), -1);
    ck_assert_int_eq(ival(pk_item(r, 3)), INT64_MIN);
    ck_assert_int_eq(ival(pk_item(r, 4)), 7);
    ck_assert_int_eq(ival(pk_item(r, 5)), -2);
    const pk_node *big = pk_item(r, 6);
    ck_assert_int_eq(big->type, PK_BIGINT);
    ck_assert_uint_eq(big->u.s.len, 9);
    ck_assert_int_eq((unsigned char)big->u.s.p[8], 1);
    int64_t v;
    ck_assert(!pk_int(big, &v));
    ck_assert_int_eq(ival(pk_item(r, 7)), 0x030201);
    ck_assert_int_eq(pk_item(r, 8)->type, PK_BIGINT);
    ck_assert_uint_eq(pk_item(r, 8)->u.s.len, 12);
    done();
}
END_TEST

START_TEST(floats_and_none)
{
    const pk_node *r = ok(B("\x80\x02(G\xc0\x09\x21\xfb\x54\x44\x2d\x18G\x7f\xf0\x00\x00\x00\x00\x00\x00N\x88\x89t."));
    ck_assert_int_eq(pk_item(r, 0)->type, PK_FLOAT);
    ck_assert(pk_item(r, 0)->u.f == -3.141592653589793);
    ck_assert(pk_item(r, 1)->u.f > 1e308);   /* +inf */
    ck_assert_int_eq(pk_item(r, 2)->type, PK_NONE);
    ck_assert(pk_item(r, 3)->type == PK_BOOL && pk_item(r, 3)->u.b);
    ck_assert(pk_item(r, 4)->type == PK_BOOL && !pk_item(r, 4)->u.b);
    done();
}
END_TEST

START_TEST(strings_and_bytes)
{
    /* SHORT_BINUNICODE, BINUNICODE, BINUNICODE8 (UTF-8, embedded NUL kept),
     * SHORT_BINSTRING/BINSTRING (py2 str), SHORT_BINBYTES, BINBYTES, BINBYTES8 */
    const pk_node *r = ok(B("\x80\x04("
                            "\x8c\x02" "ab"
                            "X\x04\x00\x00\x00" "\xc3\xa9z\x00"
                            "\x8d\x03\x00\x00\x00\x00\x00\x00\x00" "xyz"
                            "U\x01" "s"
                            "T\x02\x00\x00\x00" "st"
                            "C\x03\x00\x01\x02"
                            "B\x01\x00\x00\x00\xff"
                            "\x8e\x00\x00\x00\x00\x00\x00\x00\x00"
                            "\x8c\x00"
                            "t."));
    ck_assert_uint_eq(pk_len(r), 9);
    const char *s;
    size_t n;
    ck_assert(pk_str(pk_item(r, 0), &s, &n) && n == 2 && !strcmp(s, "ab"));
    ck_assert(pk_str(pk_item(r, 1), &s, &n) && n == 4 && !memcmp(s, "\xc3\xa9z\x00", 4));
    ck_assert_str_eq(sval(pk_item(r, 2)), "xyz");
    ck_assert_str_eq(sval(pk_item(r, 3)), "s");
    ck_assert_str_eq(sval(pk_item(r, 4)), "st");
    ck_assert_int_eq(pk_item(r, 5)->type, PK_BYTES);
    ck_assert(pk_item(r, 5)->u.s.len == 3 && !memcmp(pk_item(r, 5)->u.s.p, "\x00\x01\x02", 3));
    ck_assert(pk_item(r, 6)->type == PK_BYTES && (unsigned char)pk_item(r, 6)->u.s.p[0] == 0xff);
    ck_assert(pk_item(r, 7)->type == PK_BYTES && pk_item(r, 7)->u.s.len == 0);
    ck_assert(pk_str(pk_item(r, 8), &s, &n) && n == 0 && s[0] == 0);
    ck_assert(!pk_str(pk_item(r, 5), &s, &n));   /* bytes are not str */
    done();
}
END_TEST

/* ------------------------------------------------------------ containers */

START_TEST(tuples_lists_dicts_sets)
{
    const pk_node *r = ok(B("\x80\x04("
                            ")"                                   /* () */
                            "K\x01\x85"                           /* (1,) */
                            "K\x01K\x02\x86"                      /* (1, 2) */
                            "K\x01K\x02K\x03\x87"                 /* (1, 2, 3) */
                            "(K\x04K\x05l"                        /* LIST [4, 5] */
                            "]K\x06" "a(K\x07K\x08" "e"           /* EMPTY_LIST APPEND APPENDS: [6, 7, 8] */
                            "(\x8c\x01k" "K\x01\x8c\x01k" "K\x02" "d" /* DICT {k: 1, k: 2}: the last wins */
                            "}\x8c\x01" "aK\x01s(\x8c\x01" "bK\x02\x8c\x01" "cK\x03u" /* SETITEM, SETITEMS */
                            "\x8f(K\x01K\x02\x90"                 /* EMPTY_SET ADDITEMS */
                            "(K\x09\x91"                          /* FROZENSET */
                            "]"                                   /* an empty list is a list */
                            "t."));
    ck_assert_int_eq(r->type, PK_TUPLE);
    ck_assert_uint_eq(pk_len(r), 11);
    ck_assert(pk_item(r, 0)->type == PK_TUPLE && pk_len(pk_item(r, 0)) == 0);
    ck_assert(pk_len(pk_item(r, 1)) == 1 && ival(pk_item(pk_item(r, 1), 0)) == 1);
    ck_assert(pk_len(pk_item(r, 2)) == 2 && ival(pk_item(pk_item(r, 2), 1)) == 2);
    ck_assert(pk_len(pk_item(r, 3)) == 3 && ival(pk_item(pk_item(r, 3), 2)) == 3);
    ck_assert(pk_item(r, 4)->type == PK_LIST && pk_len(pk_item(r, 4)) == 2 && ival(pk_item(pk_item(r, 4), 1)) == 5);
    const pk_node *l = pk_item(r, 5);
    ck_assert(l->type == PK_LIST && pk_len(l) == 3);
    for (size_t i = 0; i < 3; i++)
        ck_assert_int_eq(ival(pk_item(l, i)), 6 + (int64_t)i);
    ck_assert_int_eq(ival(pk_dict_get(pk_item(r, 6), "k")), 2);
    const pk_node *d = pk_item(r, 7);
    ck_assert(d->type == PK_DICT && pk_len(d) == 3);
    ck_assert_int_eq(ival(pk_dict_get(d, "a")), 1);
    ck_assert_int_eq(ival(pk_dict_get(d, "c")), 3);
    ck_assert_ptr_null(pk_dict_get(d, "zz"));
    ck_assert_ptr_eq(pk_as_dict(d), d);
    ck_assert(pk_item(d, 0) == NULL);   /* pk_item is for sequences */
    ck_assert(pk_item(r, 8)->type == PK_SET && pk_len(pk_item(r, 8)) == 2);
    ck_assert(pk_item(r, 9)->type == PK_FROZENSET && pk_len(pk_item(r, 9)) == 1);
    ck_assert(pk_item(r, 10)->type == PK_LIST && pk_len(pk_item(r, 10)) == 0);
    done();
}
END_TEST

/* Dict keys named as str() names them in a state-dict path. */
START_TEST(key_text_as_str_names_it)
{
    /* ("w", 7, -12, True, False, 1.5, None, 9223372036854775807) */
    const pk_node *r = ok(B("\x80\x04(\x8c\x01wK\x07J\xf4\xff\xff\xff\x88\x89G?\xf8\x00\x00\x00\x00\x00\x00N"
                            "\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7ft."));
    const char *want[] = {"w", "7", "-12", "True", "False", NULL, NULL, "9223372036854775807"};
    ck_assert_uint_eq(pk_len(r), 8);
    for (size_t i = 0; i < 8; i++) {
        char buf[PK_KEY_TEXT_MAX];
        const char *t;
        size_t n;
        bool got = pk_key_text(pk_item(r, i), buf, &t, &n);
        ck_assert_msg(got == (want[i] != NULL), "key %zu", i);
        if (got)
            ck_assert_msg(n == strlen(want[i]) && !memcmp(t, want[i], n), "key %zu: %.*s", i, (int)n, t);
    }
    ck_assert(!pk_key_text(NULL, NULL, NULL, NULL));
    done();
}
END_TEST

START_TEST(big_containers_grow)
{
    /* 5000 APPENDs one by one and 3 SETITEMS batches: amortised growth keeps order. */
    size_t n = 5000, cap = 16 + n * 3 + 3 * 1000 * 6;
    char *b = malloc(cap), *p = b;
    memcpy(p, "\x80\x04(]", 4);
    p += 4;
    for (size_t i = 0; i < n; i++) {
        *p++ = 'M';
        *p++ = (char)(i & 0xff);
        *p++ = (char)(i >> 8);
        *p++ = 'a';
    }
    *p++ = '}';
    for (int batch = 0; batch < 3; batch++) {
        *p++ = '(';
        for (int i = 0; i < 300; i++) {
            int k = batch * 300 + i;
            *p++ = 'M';
            *p++ = (char)(k & 0xff);
            *p++ = (char)(k >> 8);
            *p++ = 'K';
            *p++ = (char)(k % 200);
        }
        *p++ = 'u';
    }
    *p++ = 't';
    *p++ = '.';
    const pk_node *r = ok(b, (size_t)(p - b));
    const pk_node *l = pk_item(r, 0), *d = pk_item(r, 1);
    ck_assert_uint_eq(pk_len(l), n);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(ival(pk_item(l, i)), (int64_t)i);
    ck_assert_uint_eq(pk_len(d), 900);
    for (size_t i = 0; i < 900; i++) {
        ck_assert_int_eq(ival(d->u.dict.keys[i]), (int64_t)i);
        ck_assert_int_eq(ival(d->u.dict.vals[i]), (int64_t)(i % 200));
    }
    done();
    free(b);
}
END_TEST

START_TEST(stack_ops)
{
    /* POP, POP_MARK, DUP; POP of a bare MARK discards the mark (CPython) */
    const pk_node *r = ok(B("\x80\x02(K\x01K\x02" "0" "(K\x09K\x09" "1" "K\x03" "2" "(" "0" "t."));
    ck_assert_uint_eq(pk_len(r), 3);
    ck_assert_int_eq(ival(pk_item(r, 0)), 1);
    ck_assert_int_eq(ival(pk_item(r, 1)), 3);
    ck_assert_ptr_eq(pk_item(r, 1), pk_item(r, 2));   /* DUP shares */
    done();
}
END_TEST

/* ------------------------------------------------------------ memo */

START_TEST(memo_sharing_and_mutation)
{
    /* A list memoized (MEMOIZE 0) while empty, fetched again (BINGET 0) and only
     * then filled: both references see the items. A dict put with BINPUT 7,
     * LONG_BINPUT 300 and text PUT 9, read back by LONG_BINGET and text GET. */
    const pk_node *r = ok(B("\x80\x04(]\x94h\x00K\x01" "a" "0"           /* [1], one ref left on the stack */
                            "}q\x07r\x2c\x01\x00\x00p9\n" "\x8c\x01xK\x05s" "0"
                            "h\x07j\x2c\x01\x00\x00g9\n"
                            "h\x00K\x02" "a"                               /* append through the memo again */
                            "t."));
    ck_assert_uint_eq(pk_len(r), 5);
    const pk_node *l = pk_item(r, 0);
    ck_assert_int_eq(l->type, PK_LIST);
    ck_assert_ptr_eq(l, pk_item(r, 4));
    ck_assert_uint_eq(pk_len(l), 2);   /* mutations after memoization are shared */
    ck_assert_int_eq(ival(pk_item(l, 1)), 2);
    const pk_node *d = pk_item(r, 1);
    ck_assert_ptr_eq(d, pk_item(r, 2));
    ck_assert_ptr_eq(d, pk_item(r, 3));
    ck_assert_int_eq(ival(pk_dict_get(d, "x")), 5);
    done();
}
END_TEST

START_TEST(memo_cycles_parse)
{
    /* A list that contains itself: the VM builds the cycle without looping
     * (walkers bound their depth). */
    const pk_node *r = ok(B("\x80\x04]\x94h\x00" "a."));
    ck_assert_int_eq(r->type, PK_LIST);
    ck_assert_ptr_eq(pk_item(r, 0), r);
    done();
}
END_TEST

/* ------------------------------------------------------------ objects */

START_TEST(objects)
{
    /* GLOBAL + REDUCE; STACK_GLOBAL + NEWOBJ + BUILD(dict); NEWOBJ + BUILD(tuple);
     * NEWOBJ_EX; a REDUCE'd dict-like object (defaultdict) filled by SETITEMS; a list
     * subclass by APPENDS; OrderedDict() (torch.save's state dicts) becomes a plain dict */
    const pk_node *r = ok(B("\x80\x04("
                            "ctorch\nSize\n((K\x02K\x03tt" "R"
                            "\x8c\x03mod\x8c\x03" "Cls\x93)\x81}(\x8c\x01" "aK\x01u" "b"
                            "\x8c\x03mod\x8c\x05Props\x93)\x81(\x8c\x05torch\x8c\x07" "float32\x93\x89t" "b"
                            "\x8c\x03mod\x8c\x02" "Ex\x93K\x01\x85}\x92"
                            "\x8c\x03mod\x8c\x02" "DD\x93)R(\x8c\x01kK\x02u"
                            "\x8c\x03mod\x8c\x02Ls\x93)\x81(K\x07K\x08" "e"
                            "\x8c\x0b" "collections\x8c\x0bOrderedDict\x93)R\x8c\x01kK\x03s"
                            "t."));
    ck_assert_uint_eq(pk_len(r), 7);
    const pk_node *size = pk_item(r, 0);
    ck_assert_int_eq(size->type, PK_CALL);
    ck_assert_int_eq(size->u.call.kind, PK_REDUCE);
    ck_assert(pk_is_global(pk_call_global(size), "torch", "Size"));
    ck_assert(!pk_is_global(pk_call_global(size), "torch", "Sizes"));
    ck_assert_uint_eq(pk_len(pk_item(size->u.call.args, 0)), 2);
    ck_assert_ptr_null(size->u.call.state);

    const pk_node *obj = pk_item(r, 1);
    ck_assert_int_eq(obj->u.call.kind, PK_NEWOBJ);
    ck_assert(pk_is_global(pk_call_global(obj), "mod", "Cls"));
    ck_assert_uint_eq(pk_len(obj->u.call.args), 0);
    ck_assert_int_eq(ival(pk_dict_get(obj->u.call.state, "a")), 1);
    ck_assert_ptr_null(pk_call_items(obj));

    const pk_node *props = pk_item(r, 2);
    ck_assert_int_eq(props->u.call.state->type, PK_TUPLE);
    ck_assert(pk_is_global(pk_item(props->u.call.state, 0), "torch", "float32"));

    const pk_node *ex = pk_item(r, 3);
    ck_assert(ex->type == PK_CALL && ex->u.call.kind == PK_NEWOBJ && pk_len(ex->u.call.args) == 1);

    const pk_node *od = pk_item(r, 4);
    ck_assert(pk_is_global(pk_call_global(od), "mod", "DD"));
    ck_assert_int_eq(pk_call_items(od)->type, PK_DICT);
    ck_assert_int_eq(ival(pk_dict_get(pk_as_dict(od), "k")), 2);

    const pk_node *ls = pk_item(r, 5);
    ck_assert_int_eq(pk_call_items(ls)->type, PK_LIST);
    ck_assert_uint_eq(pk_len(pk_call_items(ls)), 2);
    ck_assert_ptr_null(pk_as_dict(ls));
    const pk_node *ordered = pk_item(r, 6);
    ck_assert_int_eq(ordered->type, PK_DICT);
    ck_assert_int_eq(ival(pk_dict_get(ordered, "k")), 3);
    ck_assert_ptr_null(pk_call_global(pk_item(r, 0)->u.call.args));   /* not a call */
    done();
}
END_TEST

START_TEST(persistent_ids)
{
    /* torch.save's storage reference: BINPERSID of ('storage', cls, key, loc, numel);
     * and a protocol-0 PERSID line. */
    const pk_node *r = ok(B("\x80\x02((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00" "0"
                            "X\x03\x00\x00\x00" "cpuK\x0ctQ" "Pabc\n" "t."));
    const pk_node *p = pk_item(r, 0);
    ck_assert_int_eq(p->type, PK_PERSID);
    ck_assert_uint_eq(pk_len(p->u.persid.pid), 5);
    ck_assert_str_eq(sval(pk_item(p->u.persid.pid, 0)), "storage");
    ck_assert(pk_is_global(pk_item(p->u.persid.pid, 1), "torch", "FloatStorage"));
    ck_assert_int_eq(ival(pk_item(p->u.persid.pid, 4)), 12);
    ck_assert_int_eq(pk_item(r, 1)->type, PK_PERSID);
    ck_assert_str_eq(sval(pk_item(r, 1)->u.persid.pid), "abc");
    done();
}
END_TEST

START_TEST(frames_and_protocols)
{
    /* Two frames with exact lengths; protocols 2 to 5 accepted. */
    const pk_node *r = ok(B("\x80\x05\x95\x03\x00\x00\x00\x00\x00\x00\x00(K\x01\x95\x02\x00\x00\x00\x00\x00\x00\x00t."));
    ck_assert_uint_eq(pk_len(r), 1);
    done();
    for (char proto = 2; proto <= 5; proto++) {
        char b[] = {'\x80', proto, 'N', '.'};
        ok(b, sizeof b);
        done();
    }
    /* Data after STOP is ignored (the pickle ends at STOP). */
    r = ok(B("\x80\x02K\x05.garbage"));
    ck_assert_int_eq(ival(r), 5);
    done();
}
END_TEST

/* ------------------------------------------------------------ hostile */

START_TEST(errors_name_reason_and_offset)
{
    bad(B(""), "empty");
    bad(B("hello"), "not a pickle");
    bad(B("\x80\x01N."), "not a pickle");
    bad(B("\x80\x06N."), "not a pickle");
    bad(B("\x80\x02N\x80\x09."), "unsupported pickle protocol");
    bad(B("\x80\x02K\x01\xff."), "unknown opcode 0xff at offset 4");
    bad(B("\x80\x05K\x01\x97."), "opcode 0x97 (NEXT_BUFFER");
    bad(B("\x80\x05K\x01\x98."), "opcode 0x98 (READONLY_BUFFER");
    bad(B("\x80\x05\x96\x00\x00\x00\x00\x00\x00\x00\x00."), "opcode 0x96 (BYTEARRAY8");
    bad(B("\x80\x02(i\nX\n."), "INST");
    bad(B("\x80\x02\x82\x01."), "EXT1");
    bad(B("\x80\x02"), "truncated pickle");
    bad(B("\x80\x02N"), "truncated pickle");                     /* no STOP */
    bad(B("\x80\x02M\x01"), "truncated pickle");
    bad(B("\x80\x02J\x01\x02\x03"), "truncated");
    bad(B("\x80\x02G\x00\x00"), "truncated");
    bad(B("\x80\x02\x63torch\nSize"), "unterminated line");
    bad(B("\x80\x02I12"), "unterminated line");
    bad(B("\x80\x02Ix\n."), "bad decimal");
    bad(B("\x80\x02L99999999999999999999999\n."), "bad decimal");
    bad(B("\x80\x02g-1\n."), "negative memo index");
}
END_TEST

START_TEST(huge_declared_lengths)
{
    bad(B("\x80\x04X\xff\xff\xff\xff" "ab."), "truncated");
    bad(B("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f" "ab."), "truncated");
    bad(B("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff" "ab."), "truncated");
    bad(B("\x80\x04\x8e\x00\x00\x00\x00\x01\x00\x00\x00" "ab."), "truncated");
    bad(B("\x80\x04" "B\x10\x00\x00\x00" "abc."), "a 16-byte string with 4 bytes left at offset 7");
    bad(B("\x80\x04\x8c\x05" "ab"), "truncated");
    bad(B("\x80\x04\x8a\x09\x00\x00"), "truncated");
    bad(B("\x80\x04\x8b\xff\xff\xff\xff\x00."), "negative LONG4 length");
    bad(B("\x80\x04\x8b\x00\x00\x00\x01\x00."), "truncated");
    bad(B("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff" "N."), "truncated");   /* a frame beyond the end */
}
END_TEST

START_TEST(memo_indexes)
{
    bad(B("\x80\x02h\x05."), "memo index not defined");
    bad(B("\x80\x02j\xff\xff\xff\xff."), "memo index not defined");
    bad(B("\x80\x02Nr\xff\xff\xff\x7f."), "memo index out of range");
    bad(B("\x80\x02Np99999999999\n."), "memo index out of range");
    bad(B("\x80\x02q\x01."), "stack underflow");
    bad(B("\x80\x04\x94."), "stack underflow");
    /* Sparse but plausible indexes (any BINPUT index) work. */
    const pk_node *r = ok(B("\x80\x02K\x07q\xfe" "0h\xfe."));
    ck_assert_int_eq(ival(r), 7);
    done();
}
END_TEST

START_TEST(stack_underflow_and_marks)
{
    static const struct { const char *b; size_t n; const char *want; } cases[] = {
        {B("\x80\x02."), "stack underflow"},
        {B("\x80\x02" "0."), "stack underflow"},
        {B("\x80\x02" "2."), "stack underflow"},
        {B("\x80\x02" "1."), "no MARK"},
        {B("\x80\x02t."), "no MARK"},
        {B("\x80\x02l."), "no MARK"},
        {B("\x80\x02" "d."), "no MARK"},
        {B("\x80\x02" "e."), "no MARK"},
        {B("\x80\x02u."), "no MARK"},
        {B("\x80\x02\x90."), "no MARK"},
        {B("\x80\x02\x91."), "no MARK"},
        {B("\x80\x02(K\x01" "e."), "stack underflow"},      /* APPENDS with nothing below the mark */
        {B("\x80\x02}(K\x01u."), "odd number"},
        {B("\x80\x02(K\x01" "d."), "odd number"},
        {B("\x80\x02(\x85."), "stack underflow"},           /* TUPLE1 may not reach below a mark */
        {B("\x80\x02K\x01\x86."), "stack underflow"},
        {B("\x80\x02\x87."), "stack underflow"},
        {B("\x80\x02" "a."), "stack underflow"},
        {B("\x80\x02K\x01" "a."), "stack underflow"},
        {B("\x80\x02K\x01K\x02" "a."), "APPEND to something that is not a list"},
        {B("\x80\x02K\x01K\x02K\x03s."), "SETITEM on something that is not a dict"},
        {B("\x80\x02](K\x01K\x02u."), "SETITEMS on something that is not a dict"},
        {B("\x80\x02}(K\x01" "e."), "APPENDS to something that is not a list"},
        {B("\x80\x02](K\x01\x90."), "ADDITEMS to a non-set"},
        {B("\x80\x02R."), "stack underflow"},
        {B("\x80\x02K\x01K\x02R."), "REDUCE arguments are not a tuple"},
        {B("\x80\x02K\x01K\x02\x81."), "NEWOBJ arguments are not a tuple"},
        {B("\x80\x02K\x01)K\x02\x92."), "bad NEWOBJ_EX"},
        {B("\x80\x02K\x01}b."), "BUILD on something that is not an object"},
        {B("\x80\x02K\x01K\x02\x93."), "STACK_GLOBAL needs two strings"},
        {B("\x80\x02Q."), "stack underflow"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        bad(cases[i].b, cases[i].n, cases[i].want);
    /* An object's items may not mix dict and list. */
    bad(B("\x80\x02\x63m\nC\n)R\x8c\x01kK\x01sK\x02" "a."), "APPEND");
}
END_TEST

START_TEST(deep_nesting)
{
    /* 200k nested 1-tuples and 200k nested lists: no recursion in the VM. */
    size_t n = 200000, len = 3 + 2 * n + 1;
    char *b = malloc(len + n);
    memcpy(b, "\x80\x04N", 3);
    memset(b + 3, '\x85', n);
    b[3 + n] = '.';
    const pk_node *r = ok(b, 4 + n);
    size_t depth = 0;
    while (r->type == PK_TUPLE) {
        r = pk_item(r, 0);
        depth++;
    }
    ck_assert_uint_eq(depth, n);
    done();
    memcpy(b, "\x80\x04", 2);
    memset(b + 2, ']', n);
    memset(b + 2 + n, 'a', n - 1);
    b[1 + 2 * n] = '.';
    ok(b, 2 + 2 * n);
    done();
    /* Unbounded MARK nesting is refused. */
    memset(b + 2, '(', n);
    bad(b, 2 + n, "too many nested MARKs");
    free(b);
}
END_TEST

/* Random opcode soup: every input parses or fails cleanly (ASan/UBSan check
 * the memory side). The alphabet is the opcodes plus small operands. */
START_TEST(random_opcode_soup)
{
    static const char alphabet[] = "\x80\x95.(012\x94hjqrpgN\x88\x89KMJIL\x8a\x8bGX\x8c\x8dTUCB\x8e)\x85\x86\x87t]ael"
                                   "\x8f\x90\x91}dsu\x93\x63RQP\x81\x92" "b\x00\x01\x02\x05\n\xff";
    srand(1234);
    unsigned char buf[96];
    int parsed = 0;
    for (int iter = 0; iter < 40000; iter++) {
        size_t n = 2 + (size_t)(rand() % 94);
        buf[0] = 0x80;
        buf[1] = 4;
        for (size_t i = 2; i < n; i++)
            buf[i] = (unsigned char)alphabet[rand() % (int)(sizeof alphabet - 1)];
        pk_doc *d;
        const pk_node *root;
        dcp_error err;
        if (pk_parse(buf, n, "soup", &d, &root, &err) == 0) {
            ck_assert_ptr_nonnull(root);
            parsed++;
            pk_free(d);
        } else {
            ck_assert_ptr_null(d);
            ck_assert(strstr(err.msg, "soup: ") == err.msg);
        }
    }
    ck_assert_int_gt(parsed, 0);
}
END_TEST

/* A real .metadata cut at every byte and with bytes flipped, straight into
 * the VM: every prefix fails with "truncated", the whole file parses. */
START_TEST(real_metadata_prefixes_and_flips)
{
    const char *top = getenv("top_srcdir");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/05_mixed_2ranks/ckpt/.metadata", top ? top : "..");
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    unsigned char data[65536];
    size_t n = fread(data, 1, sizeof data, f);
    fclose(f);
    ck_assert_uint_gt(n, 100);
    pk_doc *d;
    const pk_node *root;
    dcp_error err;
    ck_assert_int_eq(pk_parse(data, n, "m", &d, &root, &err), 0);
    pk_free(d);
    for (size_t cut = 0; cut < n; cut++) {
        unsigned char *copy = malloc(cut ? cut : 1);   /* exact size: ASan sees any overread */
        memcpy(copy, data, cut);
        ck_assert_int_eq(pk_parse(copy, cut, "m", &d, &root, &err), -1);
        ck_assert_msg(cut < 2 || strstr(err.msg, "truncated"), "cut %zu: %s", cut, err.msg);
        free(copy);
    }
    srand(99);
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 3; k++) {
            unsigned char *copy = malloc(n);
            memcpy(copy, data, n);
            copy[i] ^= (unsigned char)(1 + rand() % 255);
            if (pk_parse(copy, n, "m", &d, &root, &err) == 0)
                pk_free(d);
            free(copy);
        }
    }
}
END_TEST

/* ---------------------------------------------------------------- streams */

/* A Metadata-shaped pickle: m.M() with BUILD {'state_dict_metadata': {...}},
 * whose items come in two SETITEMS batches and one SETITEM. Batch 2 refers
 * back to a string and a global of batch 1 (and before it), the SETITEM to
 * batch 1's key; batch 1's tuple (1, 2) is memo 10. `tail` is batch 2's
 * last value: "h\x02" (the global) or "h\x0a" (the released tuple). */
static size_t stream_pickle(char *out, const char *tail)
{
    static const char head[] =
        "\x80\x04"
        "\x8c\x01m\x94" "\x8c\x01M\x94" "\x93\x94" ")\x81\x94"      /* memo 0-3: m.M() */
        "}\x94("                                                    /* memo 4: its state */
        "\x8c\x13state_dict_metadata\x94" "}\x94"                   /* memo 5, 6 */
        "(" "\x8c\x02k0\x94" "\x8c\x06shared\x94"                   /* batch 1: memo 7, 8 */
        "\x8c\x02k1\x94" "K\x01K\x02\x86\x94" "u"                   /* memo 9, 10 */
        "(" "\x8c\x02k2\x94" "h\x08" "\x8c\x02k3\x94";              /* batch 2: memo 11, 12 */
    static const char end[] =
        "u"
        "\x8c\x02k4\x94" "h\x07" "s"                                /* a SETITEM: memo 13 */
        "u" "b" ".";
    size_t n = 0;
    memcpy(out + n, head, sizeof head - 1);
    n += sizeof head - 1;
    memcpy(out + n, tail, 2);
    n += 2;
    memcpy(out + n, end, sizeof end - 1);
    return n + sizeof end - 1;
}

typedef struct sink {
    char seen[8][32];
    int n;
    size_t bytes;
    int fail_at;      /* fail the nth item (1-based), 0: never */
} sink;

static int sink_items(void *ctx, pk_node *const *stack, size_t floor, size_t base, pk_node *const *kv, size_t n)
{
    sink *k = ctx;
    const char *f;
    if (floor != 2 || !pk_str(stack[base - 1], &f, NULL) || strcmp(f, "state_dict_metadata"))
        return 0;
    for (size_t i = 0; i < n; i++) {
        const pk_node *v = kv[2 * i + 1];
        const char *key = sval(kv[2 * i]);
        ck_assert_int_lt(k->n, 8);
        if (k->fail_at && k->n + 1 == k->fail_at)
            return -1;
        if (v->type == PK_STR)
            snprintf(k->seen[k->n++], 32, "%s=str:%s", key, sval(v));
        else if (v->type == PK_GLOBAL)
            snprintf(k->seen[k->n++], 32, "%s=global:%s.%s", key, v->u.global.module, v->u.global.name);
        else
            snprintf(k->seen[k->n++], 32, "%s=type%d:%zu", key, (int)v->type, pk_len(v));
    }
    return 1;
}

static void sink_bytes(void *ctx, const void *p, size_t n)
{
    (void)p;
    ((sink *)ctx)->bytes += n;
}

/* A file holding b (size n); its fd. */
static int file_of(const char *b, size_t n)
{
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fflush(f);
    int fd = dup(fileno(f));
    fclose(f);
    return fd;
}

START_TEST(stream_batches_in_order_and_backrefs)
{
    char b[512];
    size_t n = stream_pickle(b, "h\x02");
    int fd = file_of(b, n);
    sink k = {0};
    pk_stream s = {.fd = fd, .size = n, .bytes = sink_bytes, .items = sink_items, .ctx = &k};
    pk_doc *d;
    const pk_node *root;
    dcp_error err;
    ck_assert_msg(pk_parse_stream(&s, "t.pkl", &d, &root, &err) == 0, "%s", err.msg);
    static const char *want[] = {"k0=str:shared", "k1=type7:2", "k2=str:shared", "k3=global:m.M", "k4=str:k0"};
    ck_assert_int_eq(k.n, 5);
    for (int i = 0; i < 5; i++)
        ck_assert_str_eq(k.seen[i], want[i]);
    ck_assert_uint_eq(k.bytes, n);               /* every byte seen once */
    ck_assert_uint_eq(s.batches, 2);
    ck_assert_uint_ge(s.memo_released, 1);       /* the tuple (1, 2) */
    ck_assert_uint_ge(s.memo_kept, 2);
    /* What was consumed is not in the tree; the rest is. */
    ck_assert(pk_is_global(pk_call_global(root), "m", "M"));
    const pk_node *sdm = pk_dict_get(root->u.call.state, "state_dict_metadata");
    ck_assert_ptr_nonnull(sdm);
    ck_assert_uint_eq(pk_len(sdm), 0);
    pk_free(d);
    /* The same bytes in memory, no consumer: the whole tree. */
    const pk_node *r2 = ok(b, n);
    ck_assert_uint_eq(pk_len(pk_dict_get(r2->u.call.state, "state_dict_metadata")), 5);
    done();
    close(fd);
}
END_TEST

START_TEST(stream_released_backref_and_consumer_error)
{
    char b[512];
    size_t n = stream_pickle(b, "h\x0a");
    int fd = file_of(b, n);
    sink k = {0};
    pk_stream s = {.fd = fd, .size = n, .items = sink_items, .ctx = &k};
    pk_doc *d = (pk_doc *)1;
    const pk_node *root;
    dcp_error err;
    ck_assert_int_eq(pk_parse_stream(&s, "t.pkl", &d, &root, &err), -1);
    ck_assert_ptr_null(d);
    ck_assert_int_eq(err.code, PK_ERR_RELEASED);
    ck_assert_msg(strstr(err.msg, "memo index 10") && strstr(err.msg, "released"), "%s", err.msg);
    /* Without a consumer the same stream parses (nothing is released). */
    pk_stream whole = {.fd = fd, .size = n};
    ck_assert_msg(pk_parse_stream(&whole, "t.pkl", &d, &root, &err) == 0, "%s", err.msg);
    pk_free(d);
    /* A consumer's failure ends the parse. */
    sink f = {.fail_at = 3};
    pk_stream s3 = {.fd = fd, .size = n, .items = sink_items, .ctx = &f};
    ck_assert_int_eq(pk_parse_stream(&s3, "t.pkl", &d, &root, &err), -1);
    ck_assert_int_eq(f.n, 2);
    close(fd);
}
END_TEST

START_TEST(stream_hostile_input)
{
    char b[512];
    size_t n = stream_pickle(b, "h\x02");
    pk_doc *d;
    const pk_node *root;
    dcp_error err;
    /* Every truncation fails cleanly, naming it. */
    for (size_t cut = 0; cut < n; cut++) {
        int fd = file_of(b, cut);
        sink k = {0};
        pk_stream s = {.fd = fd, .size = cut, .bytes = sink_bytes, .items = sink_items, .ctx = &k};
        ck_assert_int_eq(pk_parse_stream(&s, "t.pkl", &d, &root, &err), -1);
        ck_assert_msg(cut < 2 || strstr(err.msg, "truncated"), "cut %zu: %s", cut, err.msg);
        close(fd);
    }
    /* A file shorter than it was said to be: a read error, not a hang. */
    int fd = file_of(b, n);
    sink k = {0};
    pk_stream s = {.fd = fd, .size = n + 100, .bytes = sink_bytes, .items = sink_items, .ctx = &k};
    ck_assert_int_eq(pk_parse_stream(&s, "t.pkl", &d, &root, &err), -1);
    ck_assert_msg(strstr(err.msg, "shrank"), "%s", err.msg);
    close(fd);
    /* Huge declared sizes are refused before anything is allocated. */
    static const char big_str[] = "\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x3fxx.";
    static const char big_frame[] = "\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x40N.";
    static const char big_long[] = "\x80\x04\x8b\xff\xff\xff\x7fxx.";
    const char *cases[] = {big_str, big_frame, big_long};
    size_t lens[] = {sizeof big_str - 1, sizeof big_frame - 1, sizeof big_long - 1};
    for (int i = 0; i < 3; i++) {
        fd = file_of(cases[i], lens[i]);
        pk_stream h = {.fd = fd, .size = lens[i]};
        ck_assert_int_eq(pk_parse_stream(&h, "t.pkl", &d, &root, &err), -1);
        ck_assert_msg(strstr(err.msg, "truncated"), "case %d: %s", i, err.msg);
        close(fd);
    }
}
END_TEST

static int take_all(void *ctx, pk_node *const *stack, size_t floor, size_t base, pk_node *const *kv, size_t n)
{
    (void)stack, (void)floor, (void)base;
    for (size_t i = 0; i < 2 * n; i++)   /* what is handed over is whole */
        if (kv[i]->type == PK_STR)
            ck_assert_uint_eq(strlen(kv[i]->u.s.p), kv[i]->u.s.len);
    ++*(size_t *)ctx;
    return 1;
}

/* A consumer that takes every batch, nested ones too (a batch inside a
 * batch that is taken later): memo entries kept across an inner batch must
 * not point into the outer one's freed nodes (run under ASan too). */
START_TEST(stream_nested_batches)
{
    const char *top = getenv("top_srcdir");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/05_mixed_2ranks/ckpt/.metadata", top ? top : "..");
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char data[65536];
    size_t n = fread(data, 1, sizeof data, f);
    fclose(f);
    int fd = file_of(data, n);
    size_t taken = 0;
    pk_stream s = {.fd = fd, .size = n, .items = take_all, .ctx = &taken};
    pk_doc *d;
    const pk_node *root;
    dcp_error err;
    int rc = pk_parse_stream(&s, "m", &d, &root, &err);
    ck_assert_msg(rc == 0 || err.code == PK_ERR_RELEASED, "%s", err.msg);
    if (rc == 0)
        pk_free(d);
    ck_assert_uint_gt(taken, 10);
    ck_assert_uint_eq(s.batches, taken);
    close(fd);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("pickle");
    TCase *v = tcase_create("values");
    tcase_add_test(v, ints);
    tcase_add_test(v, longs);
    tcase_add_test(v, floats_and_none);
    tcase_add_test(v, strings_and_bytes);
    tcase_add_test(v, tuples_lists_dicts_sets);
    tcase_add_test(v, key_text_as_str_names_it);
    tcase_add_test(v, big_containers_grow);
    tcase_add_test(v, stack_ops);
    tcase_add_test(v, memo_sharing_and_mutation);
    tcase_add_test(v, memo_cycles_parse);
    tcase_add_test(v, objects);
    tcase_add_test(v, persistent_ids);
    tcase_add_test(v, frames_and_protocols);
    suite_add_tcase(s, v);
    TCase *h = tcase_create("hostile");
    tcase_set_timeout(h, 300);
    tcase_add_test(h, errors_name_reason_and_offset);
    tcase_add_test(h, huge_declared_lengths);
    tcase_add_test(h, memo_indexes);
    tcase_add_test(h, stack_underflow_and_marks);
    tcase_add_test(h, deep_nesting);
    tcase_add_test(h, random_opcode_soup);
    tcase_add_test(h, real_metadata_prefixes_and_flips);
    suite_add_tcase(s, h);
    TCase *st = tcase_create("stream");
    tcase_add_test(st, stream_batches_in_order_and_backrefs);
    tcase_add_test(st, stream_released_backref_and_consumer_error);
    tcase_add_test(st, stream_hostile_input);
    tcase_add_test(st, stream_nested_batches);
    suite_add_tcase(s, st);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
