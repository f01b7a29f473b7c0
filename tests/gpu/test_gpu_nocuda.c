/*
 * test_gpu_nocuda.c - builds without CUDA (kernels/stats_nocuda.c): the CUDA
 * statistics API must answer "no device" / PROBE_ERR_UNSUPPORTED and never
 * touch its arguments' targets.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/numerics.h"

START_TEST(test_stubs) {
  float x = 1.0f;
  probe_cuda_stats *ctx = (probe_cuda_stats *)&x;
  probe_stats out;
  probe_cuda_tensor t = {&x, 1, PROBE_DTYPE_F32};
  ck_assert_int_eq(probe_cuda_available(), 0);
  ck_assert_int_eq(probe_cuda_is_device_ptr(&x), 0);
  ck_assert_int_eq(probe_cuda_is_device_ptr(NULL), 0);
  ck_assert_int_eq(probe_cuda_stats_create(&ctx, NULL, 8), PROBE_ERR_UNSUPPORTED);
  ck_assert_ptr_null(ctx);
  ck_assert_int_eq(probe_cuda_stats_enqueue(NULL, &t, 1, &out),
                   PROBE_ERR_UNSUPPORTED);
  ck_assert_int_eq(probe_cuda_stats_wait(NULL), PROBE_ERR_UNSUPPORTED);
  probe_cuda_stats_destroy(NULL);
  ck_assert_ptr_nonnull(probe_cuda_last_error());
  ck_assert_int_gt((int)strlen(probe_cuda_last_error()), 0);
}
END_TEST

static Suite *make_gpu_nocuda_suite(void) {
  Suite *s = suite_create("gpu_nocuda");
  TCase *tc = tcase_create("stubs");
  tcase_add_test(tc, test_stubs);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_gpu_nocuda_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
