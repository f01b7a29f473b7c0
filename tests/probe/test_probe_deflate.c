/*
 * test_probe_deflate.c - Check suite "deflate": the writer's own chunk
 * encoder (libprobe/deflate.c). Every stream it makes must inflate with
 * zlib to the input bytes, whatever the input: runs of every length around
 * the 3..258 match limits, all byte values, random data (stored-block
 * fallback, several blocks), empty input; and its shuffle must be HDF5's.
 * The HDF5 side (chunks written with H5Dwrite_chunk read back through the
 * filters) is covered by test_probe's round trips and the h5py test.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "deflate.h"

/* Encodes src and inflates the result; checks the bytes and returns the
 * encoded size. */
static size_t roundtrip(const uint8_t *src, size_t n) {
  size_t cap = probe__deflate_bound(n);
  uint8_t *z = malloc(cap), *back = malloc(n + 16);
  ck_assert_ptr_nonnull(z);
  ck_assert_ptr_nonnull(back);
  size_t m = probe__deflate(src, n, z);
  ck_assert_uint_le(m, cap);
  uLongf got = (uLongf)n + 16;
  int rc = uncompress(back, &got, z, (uLong)m);
  ck_assert_msg(rc == Z_OK, "inflate of %zu bytes: zlib error %d", n, rc);
  ck_assert_uint_eq(got, n);
  ck_assert_msg(n == 0 || memcmp(back, src, n) == 0, "bytes differ (n=%zu)",
                n);
  free(z);
  free(back);
  return m;
}

START_TEST(test_deflate_small) {
  uint8_t b[600] = {0};
  roundtrip(b, 0);
  for (unsigned v = 0; v < 256; v++) {
    b[0] = (uint8_t)v;
    roundtrip(b, 1);
  }
  /* one run of every length 1..600 of 0 and of 0xff, then a literal */
  for (size_t r = 1; r < sizeof b; r++) {
    for (int v = 0; v < 2; v++) {
      memset(b, v ? 0xff : 0, r);
      roundtrip(b, r);
      if (r + 1 < sizeof b) {
        b[r] = 7;
        roundtrip(b, r + 1);
      }
    }
  }
}
END_TEST

START_TEST(test_deflate_runs_and_literals) {
  uint32_t h = 12345;
  for (int t = 0; t < 400; t++) {
    size_t n = (size_t)(t % 40 == 0 ? 200000 : 1 + t * 37 % 5000);
    uint8_t *b = malloc(n);
    size_t i = 0;
    while (i < n) {
      h = h * 1664525u + 1013904223u;
      size_t r = 1 + (h >> 8) % (t % 3 == 0 ? 4 : t % 3 == 1 ? 300 : 70000);
      uint8_t v = (h >> 24) % 3 ? 0 : (uint8_t)(h >> 16);
      for (size_t k = 0; k < r && i < n; k++) b[i++] = v;
    }
    roundtrip(b, n);
    free(b);
  }
}
END_TEST

START_TEST(test_deflate_random_is_stored) {
  /* random bytes do not shrink: stored blocks (65535 bytes each), barely
   * larger than the input */
  size_t n = 200000;
  uint8_t *b = malloc(n);
  uint32_t h = 99;
  for (size_t i = 0; i < n; i++) {
    h = h * 1664525u + 1013904223u;
    b[i] = (uint8_t)(h >> 24);
  }
  size_t m = roundtrip(b, n);
  ck_assert_uint_le(m, n + 5 * 4 + 6);
  free(b);
}
END_TEST

START_TEST(test_deflate_compresses_zero_planes) {
  /* a trace-like chunk: 128 rows of 648 bytes, a few non-zero bytes per
   * row; shuffled it is mostly zero runs and must shrink a lot */
  enum { ROWS = 128, ELEM = 648 };
  static uint8_t rows[ROWS * ELEM], sh[ROWS * ELEM];
  memset(rows, 0, sizeof rows);
  for (int i = 0; i < ROWS; i++) {
    rows[i * ELEM + 0] = (uint8_t)(i / 50); /* step */
    rows[i * ELEM + 8] = (uint8_t)(i % 50); /* seq */
    for (int k = 0; k < 24; k++) rows[i * ELEM + 120 + 8 * (k + 20)] = (uint8_t)(i * k);
  }
  probe__shuffle(sh, rows, ROWS, ELEM);
  size_t m = roundtrip(sh, sizeof sh);
  ck_assert_uint_lt(m, sizeof sh / 10);
}
END_TEST

START_TEST(test_shuffle_is_hdf5s) {
  /* dst[j * n + i] = src[i * elem + j], for element sizes with and
   * without whole 8-byte words and for rows with zero planes */
  size_t elems[] = {1, 3, 4, 8, 13, 104, 648, 2000};
  for (size_t e = 0; e < sizeof elems / sizeof *elems; e++) {
    size_t elem = elems[e], n = 37;
    uint8_t *src = calloc(n * elem, 1), *dst = malloc(n * elem);
    for (size_t i = 0; i < n * elem; i++)
      if ((i * 7) % 5 == 0) src[i] = (uint8_t)(i * 31 + 1);
    probe__shuffle(dst, src, n, elem);
    for (size_t i = 0; i < n; i++)
      for (size_t j = 0; j < elem; j++)
        ck_assert_uint_eq(dst[j * n + i], src[i * elem + j]);
    free(src);
    free(dst);
  }
}
END_TEST

static Suite *make_deflate_suite(void) {
  Suite *s = suite_create("deflate");
  TCase *tc = tcase_create("deflate");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_deflate_small);
  tcase_add_test(tc, test_deflate_runs_and_literals);
  tcase_add_test(tc, test_deflate_random_is_stored);
  tcase_add_test(tc, test_deflate_compresses_zero_planes);
  tcase_add_test(tc, test_shuffle_is_hdf5s);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_deflate_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
