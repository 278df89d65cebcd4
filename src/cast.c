/* dcpi_cast: floating-point elements converted as torch's CPU .to() does,
 * for dcp digest --dtype (integrity/digest.c) and the casts of an export
 * (write/hf_view.c): one implementation, so a digest of the cast equals the
 * digest of the export.
 *
 * Every source goes to
 * float32 first (exact for float16, bfloat16 and float8; float64 rounds to
 * nearest even, as C's conversion does under the default rounding mode, the
 * same double rounding torch does for float64 -> bfloat16/float16), then to
 * the target, rounding to nearest even. NaN: bfloat16 0xFFFF from float32
 * and float64 (torch's AVX2 and AVX-512 kernels), 0x7FC0 from float16 and
 * float8 (its scalar conversion, which it uses there); float16 as F16C's
 * vcvtps2ph (sign, quiet bit, top 10 payload bits). Checked against torch
 * 2.13 on x86 (tests/cli-digest-cast.sh: every float16, bfloat16 and float8
 * value, random float32 bit patterns). */
#include <stdint.h>
#include <string.h>

#include "internal.h"

static inline float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f)   /* inf, NaN (quieted, payload kept) */
        return f32_of_bits(sign | 0x7f800000u | (mant ? 0x400000u | (mant << 13) : 0));
    if (exp == 0) {    /* zero, subnormal: mant * 2^-24, exact in float32 */
        float v = (float)mant * f32_of_bits(0x33800000u);
        return sign ? -v : v;
    }
    return f32_of_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline uint16_t f16_from_f32(float f)
{
    uint32_t x = bits_of_f32(f), sign = (x >> 16) & 0x8000, a = x & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x477ff000u)   /* 65520 and above round to infinity */
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) {  /* below 2^-14: a float16 subnormal or zero */
        /* adding 0.5 (whose ulp is 2^-24, float16's smallest step) rounds
         * to nearest even in float32 arithmetic */
        float r = f32_of_bits(a) + 0.5f;
        return (uint16_t)(sign | (bits_of_f32(r) - 0x3f000000u));
    }
    uint32_t odd = (a >> 13) & 1;
    a += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
    return (uint16_t)(sign | (a >> 13));
}

static inline uint16_t bf16_from_f32(float f, uint16_t nan)
{
    uint32_t x = bits_of_f32(f);
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
    return (x & 0x7fffffffu) > 0x7f800000u ? nan : (uint16_t)r;   /* a select, not a branch */
}

/* float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN. */
static inline float f32_from_e4m3fn(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80) << 24, exp = (b >> 3) & 0xf, mant = b & 7;
    if (exp == 0xf && mant == 7)
        return f32_of_bits(sign | 0x7ff00000u);   /* as torch: the mantissa bits kept */
    if (exp == 0) {
        float v = (float)mant * f32_of_bits(0x3b000000u);   /* 2^-9 */
        return sign ? -v : v;
    }
    return f32_of_bits(sign | ((exp + 120) << 23) | (mant << 20));
}

int dcpi_castable(dcp_dtype dt)
{
    switch (dt) {
    case DCP_FLOAT64: case DCP_FLOAT32: case DCP_FLOAT16: case DCP_BFLOAT16:
    case DCP_FLOAT8_E4M3FN: case DCP_FLOAT8_E5M2:
        return 1;
    default:
        return 0;
    }
}



/* Casts go through a block of float32 values, each stage one loop without
 * a switch inside, which the compiler can vectorise (a cast to bfloat16 runs
 * at several hundred MB/s more than with a switch per element). */
#define CAST_BLOCK 4096

static void decode_block(const unsigned char *src, dcp_dtype from, float *f, size_t n)
{
    uint16_t h;
    switch (from) {
    case DCP_FLOAT64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);
            f[i] = (float)d;
        }
        break;
    case DCP_FLOAT32:
        memcpy(f, src, 4 * n);
        break;
    case DCP_FLOAT16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&h, src + 2 * i, 2);
            f[i] = f32_from_f16(h);
        }
        break;
    case DCP_BFLOAT16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&h, src + 2 * i, 2);
            f[i] = f32_of_bits((uint32_t)h << 16);
        }
        break;
    case DCP_FLOAT8_E5M2:
        for (size_t i = 0; i < n; i++)
            f[i] = f32_from_f16((uint16_t)(src[i] << 8));
        break;
    default:   /* DCP_FLOAT8_E4M3FN */
        for (size_t i = 0; i < n; i++)
            f[i] = f32_from_e4m3fn(src[i]);
        break;
    }
}

static void encode_block(const float *f, dcp_dtype to, uint16_t nan16, unsigned char *dst, size_t n)
{
    uint16_t h;
    switch (to) {
    case DCP_FLOAT64:   /* exact: the sources are float32 or narrower */
        for (size_t i = 0; i < n; i++) {
            double d = (double)f[i];
            memcpy(dst + 8 * i, &d, 8);
        }
        break;
    case DCP_FLOAT32:
        memcpy(dst, f, 4 * n);
        break;
    case DCP_FLOAT16:
        for (size_t i = 0; i < n; i++) {
            h = f16_from_f32(f[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        break;
    default:   /* DCP_BFLOAT16 */
        for (size_t i = 0; i < n; i++) {
            h = bf16_from_f32(f[i], nan16);
            memcpy(dst + 2 * i, &h, 2);
        }
        break;
    }
}

void dcpi_cast(const void *src_, dcp_dtype from, void *dst_, dcp_dtype to, size_t n)
{
    const unsigned char *src = src_;
    unsigned char *dst = dst_;
    size_t in = dcp_dtype_size(from), out = dcp_dtype_size(to);
    if (from == to) {   /* float64 must not pass through float32 */
        memcpy(dst, src, n * in);
        return;
    }
    /* torch's vectorised float32/float64 -> bfloat16 writes NaN as 0xFFFF,
     * its scalar conversion from float16 and float8 as 0x7FC0 */
    uint16_t nan16 = from == DCP_FLOAT32 || from == DCP_FLOAT64 ? 0xffff : 0x7fc0;
    float f[CAST_BLOCK];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CAST_BLOCK ? n - done : CAST_BLOCK;
        decode_block(src + done * in, from, f, k);
        encode_block(f, to, nan16, dst + done * out, k);
        done += k;
    }
}
