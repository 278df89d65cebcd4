/* Every dtype PyTorch can store: torch name, element size, storage class,
 * safetensors and numpy spellings. */
#include <string.h>

#include "dcp.h"

struct dtype_row {
    const char *name;        /* torch attribute name */
    unsigned size;           /* bytes per element (container) */
    unsigned swap;           /* byte-swap unit */
    const char *storage;     /* typed storage class, NULL = UntypedStorage + v3 */
    const char *st;          /* safetensors */
    const char *np;          /* numpy descr */
};

static const struct dtype_row rows[DCP_DTYPE_COUNT] = {
    [DCP_FLOAT64] = {"float64", 8, 8, "DoubleStorage", "F64", "<f8"},
    [DCP_FLOAT32] = {"float32", 4, 4, "FloatStorage", "F32", "<f4"},
    [DCP_FLOAT16] = {"float16", 2, 2, "HalfStorage", "F16", "<f2"},
    [DCP_BFLOAT16] = {"bfloat16", 2, 2, "BFloat16Storage", "BF16", NULL},
    /* safetensors names complex64 (C64) only: a "C128" header fails its load */
    [DCP_COMPLEX128] = {"complex128", 16, 8, "ComplexDoubleStorage", NULL, "<c16"},
    [DCP_COMPLEX64] = {"complex64", 8, 4, "ComplexFloatStorage", "C64", "<c8"},
    [DCP_COMPLEX32] = {"complex32", 4, 2, NULL, NULL, NULL},
    [DCP_INT64] = {"int64", 8, 8, "LongStorage", "I64", "<i8"},
    [DCP_INT32] = {"int32", 4, 4, "IntStorage", "I32", "<i4"},
    [DCP_INT16] = {"int16", 2, 2, "ShortStorage", "I16", "<i2"},
    [DCP_INT8] = {"int8", 1, 1, "CharStorage", "I8", "|i1"},
    [DCP_UINT64] = {"uint64", 8, 8, NULL, "U64", "<u8"},
    [DCP_UINT32] = {"uint32", 4, 4, NULL, "U32", "<u4"},
    [DCP_UINT16] = {"uint16", 2, 2, NULL, "U16", "<u2"},
    [DCP_UINT8] = {"uint8", 1, 1, "ByteStorage", "U8", "|u1"},
    [DCP_BOOL] = {"bool", 1, 1, "BoolStorage", "BOOL", "|b1"},
    [DCP_FLOAT8_E4M3FN] = {"float8_e4m3fn", 1, 1, NULL, "F8_E4M3", NULL},
    [DCP_FLOAT8_E5M2] = {"float8_e5m2", 1, 1, NULL, "F8_E5M2", NULL},
    [DCP_FLOAT8_E4M3FNUZ] = {"float8_e4m3fnuz", 1, 1, NULL, NULL, NULL},
    [DCP_FLOAT8_E5M2FNUZ] = {"float8_e5m2fnuz", 1, 1, NULL, NULL, NULL},
    [DCP_FLOAT8_E8M0FNU] = {"float8_e8m0fnu", 1, 1, NULL, "F8_E8M0", NULL},
    [DCP_FLOAT4_E2M1FN_X2] = {"float4_e2m1fn_x2", 1, 1, NULL, "F4", NULL},
    [DCP_QINT8] = {"qint8", 1, 1, "QInt8Storage", NULL, NULL},
    [DCP_QUINT8] = {"quint8", 1, 1, "QUInt8Storage", NULL, NULL},
    [DCP_QINT32] = {"qint32", 4, 4, "QInt32Storage", NULL, NULL},
    [DCP_QUINT4X2] = {"quint4x2", 1, 1, "QUInt4x2Storage", NULL, NULL},
    [DCP_QUINT2X4] = {"quint2x4", 1, 1, "QUInt2x4Storage", NULL, NULL},
    [DCP_BITS8] = {"bits8", 1, 1, NULL, NULL, NULL},
    [DCP_BITS16] = {"bits16", 2, 2, NULL, NULL, NULL},
    [DCP_BITS1X8] = {"bits1x8", 1, 1, NULL, NULL, NULL},
    [DCP_BITS2X4] = {"bits2x4", 1, 1, NULL, NULL, NULL},
    [DCP_BITS4X2] = {"bits4x2", 1, 1, NULL, NULL, NULL},
};

static int valid(dcp_dtype dt) { return dt > DCP_DTYPE_INVALID && dt < DCP_DTYPE_COUNT; }

const char *dcp_dtype_name(dcp_dtype dt) { return valid(dt) ? rows[dt].name : NULL; }
size_t dcp_dtype_size(dcp_dtype dt) { return valid(dt) ? rows[dt].size : 0; }
size_t dcp_dtype_swap_unit(dcp_dtype dt) { return valid(dt) ? rows[dt].swap : 0; }
const char *dcp_dtype_storage(dcp_dtype dt) { return valid(dt) ? rows[dt].storage : NULL; }
const char *dcp_dtype_safetensors(dcp_dtype dt) { return valid(dt) ? rows[dt].st : NULL; }
const char *dcp_dtype_numpy(dcp_dtype dt) { return valid(dt) ? rows[dt].np : NULL; }

dcp_dtype dcp_dtype_from_name(const char *name)
{
    if (!name)
        return DCP_DTYPE_INVALID;
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    for (int i = 1; i < DCP_DTYPE_COUNT; i++)
        if (strcmp(rows[i].name, name) == 0)
            return (dcp_dtype)i;
    return DCP_DTYPE_INVALID;
}

dcp_dtype dcp_dtype_from_storage(const char *cls)
{
    if (!cls)
        return DCP_DTYPE_INVALID;
    for (int i = 1; i < DCP_DTYPE_COUNT; i++)
        if (rows[i].storage && strcmp(rows[i].storage, cls) == 0)
            return (dcp_dtype)i;
    return DCP_DTYPE_INVALID;
}

dcp_dtype dcp_dtype_from_safetensors(const char *name)
{
    if (!name)
        return DCP_DTYPE_INVALID;
    for (int i = 1; i < DCP_DTYPE_COUNT; i++)
        if (rows[i].st && strcmp(rows[i].st, name) == 0)
            return (dcp_dtype)i;
    return DCP_DTYPE_INVALID;
}
