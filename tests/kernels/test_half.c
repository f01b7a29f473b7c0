/*
 * test_half.c - Check suite for the FP16/BF16 conversions of
 * ampprobe/numerics.h and kernels/half.c.
 *
 * The CPU's F16C unit (vcvtps2ph / vcvtph2ps, round to nearest even) is the
 * reference for binary16: all 65,536 binary16 values, a stratified sample of
 * binary32 patterns in the default run, and all 2^32 patterns in the test
 * case that runs only with AMPPROBE_EXTENDED=1 (CTest label `extended`).
 * Where the CPU has no F16C those cases print a SKIP line and pass. bfloat16
 * is checked against a reference written here from first principles (pick the
 * nearer of the two neighbouring bfloat16 values in double arithmetic, ties
 * to the even one) and against known values.
 */
#include <check.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/numerics.h"

/* Check's ck_assert_* talk to the parent process on every call (to record
 * the last line reached); in loops over millions of values test first and
 * call Check only on a failure. */
#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) ck_abort_msg(__VA_ARGS__);                                    \
  } while (0)
#define EXPECT_EQ(a, b)                                                        \
  EXPECT((uint64_t)(a) == (uint64_t)(b), "%s == %s: 0x%llx vs 0x%llx", #a, #b, \
         (unsigned long long)(a), (unsigned long long)(b))

static int have_f16c(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}

#define SKIP_WITHOUT_F16C()                                                    \
  do {                                                                         \
    if (!have_f16c()) {                                                        \
      printf("SKIP: %s: this CPU has no F16C, no hardware reference\n",         \
             __func__);                                                        \
      return;                                                                  \
    }                                                                          \
  } while (0)

__attribute__((target("avx,f16c"))) static uint16_t hw_f32_to_f16(uint32_t bits) {
  __m128 v = _mm_castsi128_ps(_mm_cvtsi32_si128((int)bits));
  return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT), 0);
}

__attribute__((target("avx,f16c"))) static uint32_t hw_f16_to_f32(uint16_t h) {
  __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(h));
  return (uint32_t)_mm_cvtsi128_si32(_mm_castps_si128(v));
}

/* Eight at a time, for the exhaustive run. out(8) <- bits(8). */
__attribute__((target("avx,f16c"))) static void hw_f32_to_f16_8(uint16_t *out,
                                                              const uint32_t *bits) {
  __m256 v = _mm256_loadu_ps((const float *)(const void *)bits);
  _mm_storeu_si128((__m128i *)(void *)out, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

/* ---- binary16 ------------------------------------------------------------- */

START_TEST(test_f16_roundtrip_all) {
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    float f = probe_f16_to_f32(h);
    uint16_t back = probe_f32_to_f16(f);
    int is_nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
    if (is_nan) {
      EXPECT(isnan(f), "0x%04x: NaN did not stay NaN", h);
      /* Quiet NaNs come back unchanged; signalling ones come back quiet. */
      EXPECT_EQ(back, h | 0x0200u);
    } else {
      EXPECT(back == h, "0x%04x -> %a -> 0x%04x", h, (double)f, back);
    }
  }
}
END_TEST

/* Value check of f16 -> f32 that does not use the bit layout: the value of a
 * finite binary16 is (-1)^s * m * 2^(e-25) with m the 11-bit significand. */
START_TEST(test_f16_to_f32_values) {
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) continue;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    if (s) v = -v;
    float f = probe_f16_to_f32(h);
    EXPECT((double)f == v && (signbit(f) != 0) == s, "0x%04x", h);
  }
}
END_TEST

START_TEST(test_f16_to_f32_vs_f16c) {
  SKIP_WITHOUT_F16C();
  for (uint32_t i = 0; i < 65536; i++) {
    uint32_t mine = probe_f32_bits(probe_f16_to_f32((uint16_t)i));
    uint32_t hw = hw_f16_to_f32((uint16_t)i);
    EXPECT(mine == hw, "0x%04x: 0x%08x vs F16C 0x%08x", i, mine, hw);
  }
}
END_TEST

static void check_f32_to_f16(uint32_t bits) {
  uint16_t mine = probe_f32_to_f16(probe_f32_from_bits(bits));
  uint16_t hw = hw_f32_to_f16(bits);
  EXPECT(mine == hw, "0x%08x: 0x%04x vs F16C 0x%04x", bits, mine, hw);
}

/* Every exponent and sign; mantissas at and around every rounding tie that
 * matters (normal results round at bit 13, subnormal results at bit
 * 13 + (113 - e)), the extremes, and random ones. */
START_TEST(test_f32_to_f16_stratified) {
  SKIP_WITHOUT_F16C();
  uint64_t checked = 0;
  for (uint32_t sign = 0; sign < 2; sign++) {
    for (uint32_t e = 0; e < 256; e++) {
      uint32_t base = (sign << 31) | (e << 23);
      static const uint32_t fixed[] = {0, 1, 2, 0x7fffff, 0x7ffffe, 0x400000, 0x3fffff, 0x400001};
      for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++, checked++)
        check_f32_to_f16(base | fixed[k]);
      for (int shift = 1; shift <= 23; shift++) { /* ties at every position */
        uint32_t half = 1u << (shift - 1);
        for (uint32_t hi = 0; hi < 4; hi++) {
          uint32_t m = ((hi << shift) | half) & 0x7fffffu;
          for (int d = -2; d <= 2; d++, checked++)
            check_f32_to_f16(base | ((m + (uint32_t)d) & 0x7fffffu));
          uint32_t top = (0x7fffffu & ~((1u << shift) - 1u)) | half; /* odd high part */
          for (int d = -1; d <= 1; d++, checked++)
            check_f32_to_f16(base | ((top + (uint32_t)d) & 0x7fffffu));
        }
      }
      for (int r = 0; r < 512; r++, checked++)
        check_f32_to_f16(base | (uint32_t)(rng_next() & 0x7fffffu));
    }
  }
  /* The boundaries by value: 65504, 65520, 2^-14, 2^-24, 2^-25, each with
   * its neighbours (a few ulps either side), both signs. */
  static const float edges[] = {65504.0f, 65520.0f, 65536.0f, 6.103515625e-05f,
                                5.9604644775390625e-08f, 2.98023223876953125e-08f,
                                4.470348358154296875e-08f /* 1.5 * 2^-25 */};
  for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++)
    for (int d = -8; d <= 8; d++)
      for (uint32_t sign = 0; sign < 2; sign++, checked++)
        check_f32_to_f16((sign << 31) | (uint32_t)((int32_t)probe_f32_bits(edges[k]) + d));
  /* Plus a million random patterns. */
  for (int r = 0; r < (1 << 20); r++, checked++) check_f32_to_f16((uint32_t)rng_next());
  ck_assert_uint_gt(checked, 1000000);
}
END_TEST

START_TEST(test_f32_to_f16_known) {
  static const struct {
    float f;
    uint16_t h;
  } known[] = {
      {1.0f, 0x3c00},           {-2.0f, 0xc000},         {65504.0f, 0x7bff},
      {65519.0f, 0x7bff},       {65520.0f, 0x7c00},      {1e10f, 0x7c00},
      {6.103515625e-05f, 0x0400}, {5.9604644775390625e-08f, 0x0001},
      {2.98023223876953125e-08f, 0x0000}, /* 2^-25: tie, to even (0) */
      {2.98023259404e-08f, 0x0001},       /* just above 2^-25 */
      {-0.0f, 0x8000},          {0.0f, 0x0000},
      {1.00048828125f, 0x3c00}, /* 1 + 2^-11: tie, to even */
      {1.00146484375f, 0x3c02}, /* 1 + 3*2^-11: tie, to even (up) */
  };
  for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
    ck_assert_msg(probe_f32_to_f16(known[k].f) == known[k].h, "%a", (double)known[k].f);
  ck_assert_uint_eq(probe_f32_to_f16(INFINITY), 0x7c00);
  ck_assert_uint_eq(probe_f32_to_f16(-INFINITY), 0xfc00);
  uint16_t n = probe_f32_to_f16(NAN);
  ck_assert((n & 0x7c00) == 0x7c00 && (n & 0x3ff));
}
END_TEST

/* All 2^32 binary32 patterns against F16C: only with AMPPROBE_EXTENDED=1. */
START_TEST(test_f32_to_f16_exhaustive) {
  if (!getenv("AMPPROBE_EXTENDED")) {
    printf("SKIP: %s: set AMPPROBE_EXTENDED=1 (make test-extended)\n", __func__);
    return;
  }
  SKIP_WITHOUT_F16C();
  uint32_t bits[8];
  uint16_t hw[8];
  uint64_t bad = 0;
  for (uint64_t i = 0; i < (1ull << 32); i += 8) {
    for (int k = 0; k < 8; k++) bits[k] = (uint32_t)(i + (uint64_t)k);
    hw_f32_to_f16_8(hw, bits);
    for (int k = 0; k < 8; k++) {
      if (probe_f32_to_f16(probe_f32_from_bits(bits[k])) != hw[k] && bad++ < 5)
        printf("mismatch at 0x%08x\n", bits[k]);
    }
  }
  ck_assert_uint_eq(bad, 0);
}
END_TEST

/* ---- bfloat16 --------------------------------------------------------------- */

/* Reference: the two bfloat16 neighbours of x (truncation and the next one
 * away from zero) are compared by distance in double, which holds every
 * difference exactly; ties go to the one with an even last bit. Overflow
 * past the largest finite bfloat16 behaves as if the next value were 2^128. */
static uint16_t ref_f32_to_bf16(uint32_t bits) {
  float x = probe_f32_from_bits(bits);
  if (isnan(x)) return 0xffff; /* checked separately */
  if (isinf(x)) return (uint16_t)(bits >> 16);
  uint16_t lo = (uint16_t)(bits >> 16);
  uint16_t hi = (uint16_t)(lo + 1);
  double ax = fabs((double)x);
  double vlo = fabs((double)probe_bf16_to_f32(lo));
  double vhi = (hi & 0x7fff) == 0x7f80 ? ldexp(1.0, 128) : fabs((double)probe_bf16_to_f32(hi));
  double dlo = ax - vlo, dhi = vhi - ax;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

START_TEST(test_bf16_vs_reference) {
  uint64_t checked = 0;
  for (uint32_t sign = 0; sign < 2; sign++)
    for (uint32_t e = 0; e < 255; e++)
      for (uint32_t m = 0; m < 0x10000u; m += 0x3fu, checked++) {
        /* low half around the tie (0x8000) and spread over the rest */
        uint32_t bits = (sign << 31) | (e << 23) | ((rng_next() & 0x7f) << 16) | m;
        EXPECT_EQ(probe_f32_to_bf16(probe_f32_from_bits(bits)), ref_f32_to_bf16(bits));
        uint32_t tie = (bits & 0xffff0000u) | 0x8000u;
        for (int d = -1; d <= 1; d++) {
          uint32_t b2 = tie + (uint32_t)d;
          EXPECT_EQ(probe_f32_to_bf16(probe_f32_from_bits(b2)), ref_f32_to_bf16(b2));
        }
      }
  for (int r = 0; r < (1 << 20); r++) {
    uint32_t bits = (uint32_t)rng_next();
    float x = probe_f32_from_bits(bits);
    uint16_t b = probe_f32_to_bf16(x);
    if (isnan(x))
      EXPECT(isnan(probe_bf16_to_f32(b)), "0x%08x", bits);
    else
      EXPECT_EQ(b, ref_f32_to_bf16(bits));
  }
  ck_assert_uint_gt(checked, 100000);
}
END_TEST

START_TEST(test_bf16_known) {
  static const struct {
    uint32_t in;
    uint16_t out;
  } known[] = {
      {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80}, /* tie, even stays */
      {0x3f818000u, 0x3f82},                        /* tie, odd rounds up */
      {0x3f808001u, 0x3f81}, {0x3f807fffu, 0x3f80},
      {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to inf */
      {0x7f7f7fffu, 0x7f7f}, {0x80000000u, 0x8000},
      {0x00008000u, 0x0000}, {0x00018000u, 0x0002}, /* subnormal ties */
      {0xff800000u, 0xff80},
  };
  for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
    ck_assert_uint_eq(probe_f32_to_bf16(probe_f32_from_bits(known[k].in)), known[k].out);
  uint16_t n = probe_f32_to_bf16(probe_f32_from_bits(0x7f800001u)); /* sNaN */
  ck_assert(isnan(probe_bf16_to_f32(n)));
  for (uint32_t i = 0; i < 65536; i++) {
    float f = probe_bf16_to_f32((uint16_t)i);
    EXPECT_EQ(probe_f32_bits(f), i << 16);
    if (!isnan(f)) EXPECT_EQ(probe_f32_to_bf16(f), i);
  }
}
END_TEST

/* ---- array versions against the scalar ones --------------------------------- */

START_TEST(test_arrays_match_scalar) {
  enum { N = 300 };
  float in[N + 8], outf[N + 8];
  uint16_t h[N + 8], outh[N + 8];
  for (int off = 0; off < 4; off++) {
    for (size_t n = 0; n <= 67; n += (n < 20 ? 1 : 7)) {
      for (size_t i = 0; i < N + 8; i++) {
        uint32_t b = (uint32_t)rng_next();
        if (i % 3) b = (b & 0x807fffffu) | ((uint32_t)(100 + rng_next() % 50) << 23); /* mostly in range */
        in[i] = probe_f32_from_bits(b);
        h[i] = (uint16_t)rng_next();
      }
      memset(outh, 0xab, sizeof outh);
      probe_f32_to_f16_array(outh + off, in + off, n);
      for (size_t i = 0; i < n; i++)
        EXPECT_EQ(outh[off + i], probe_f32_to_f16(in[off + i]));
      ck_assert_uint_eq(outh[off + n], 0xabab); /* nothing written past n */
      memset(outf, 0xab, sizeof outf);
      probe_f16_to_f32_array(outf + off, h + off, n);
      for (size_t i = 0; i < n; i++)
        EXPECT_EQ(probe_f32_bits(outf[off + i]), probe_f32_bits(probe_f16_to_f32(h[off + i])));
      ck_assert_uint_eq(probe_f32_bits(outf[off + n]), 0xababababu);
      probe_f32_to_bf16_array(outh + off, in + off, n);
      for (size_t i = 0; i < n; i++)
        EXPECT_EQ(outh[off + i], probe_f32_to_bf16(in[off + i]));
      probe_bf16_to_f32_array(outf + off, h + off, n);
      for (size_t i = 0; i < n; i++)
        EXPECT_EQ(probe_f32_bits(outf[off + i]), (uint32_t)h[off + i] << 16);
    }
  }
  /* A long array through the vector path, all 65,536 binary16 values. */
  static uint16_t all[65536], back[65536];
  static float wide[65536];
  for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
  probe_f16_to_f32_array(wide, all, 65536);
  probe_f32_to_f16_array(back, wide, 65536);
  for (uint32_t i = 0; i < 65536; i++) {
    EXPECT_EQ(probe_f32_bits(wide[i]), probe_f32_bits(probe_f16_to_f32(all[i])));
    EXPECT_EQ(back[i], probe_f32_to_f16(wide[i]));
  }
}
END_TEST

START_TEST(test_dtype_helpers) {
  ck_assert_str_eq(probe_dtype_name(PROBE_DTYPE_F32), "fp32");
  ck_assert_str_eq(probe_dtype_name(PROBE_DTYPE_F16), "fp16");
  ck_assert_str_eq(probe_dtype_name(PROBE_DTYPE_BF16), "bf16");
  ck_assert_ptr_null(probe_dtype_name((probe_dtype)7));
  ck_assert_uint_eq(probe_dtype_size(PROBE_DTYPE_F32), 4);
  ck_assert_uint_eq(probe_dtype_size(PROBE_DTYPE_F16), 2);
  ck_assert_uint_eq(probe_dtype_size(PROBE_DTYPE_BF16), 2);
  ck_assert_uint_eq(probe_dtype_size((probe_dtype)7), 0);
}
END_TEST

static Suite *make_half_suite(void) {
  Suite *s = suite_create("half");
  TCase *tc = tcase_create("conversions");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_f16_roundtrip_all);
  tcase_add_test(tc, test_f16_to_f32_values);
  tcase_add_test(tc, test_f16_to_f32_vs_f16c);
  tcase_add_test(tc, test_f32_to_f16_stratified);
  tcase_add_test(tc, test_f32_to_f16_known);
  tcase_add_test(tc, test_bf16_vs_reference);
  tcase_add_test(tc, test_bf16_known);
  tcase_add_test(tc, test_arrays_match_scalar);
  tcase_add_test(tc, test_dtype_helpers);
  suite_add_tcase(s, tc);
  TCase *ext = tcase_create("extended");
  tcase_set_tags(ext, "extended"); /* CK_EXCLUDE_TAGS, tests/kernels/CMakeLists.txt */
  tcase_set_timeout(ext, 1200);
  tcase_add_test(ext, test_f32_to_f16_exhaustive);
  suite_add_tcase(s, ext);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_half_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
