/*
 * test_layers_cublas_load.c - the CUDA layer backend opens cuBLAS on first
 * use (kernels/layers/layers_cuda.cu), not at program start (CUDA builds;
 * no device needed):
 *  - before the first load no libcublas is mapped into the process: the
 *    program, like the ampprobe CLI, does not pay for it;
 *  - the load resolves every function the backend calls (the library is
 *    installed wherever a CUDA build links), maps libcublas, leaves no
 *    error text, and a second call answers the same.
 * A device run of the backend (tests/gpu/test_gpu_layers.c) calls them.
 */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "layers-backend.h"

/* 1 when a file named libcublas.so* is mapped into this process. */
static int cublas_mapped(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  ck_assert_ptr_nonnull(f);
  char line[4096];
  int found = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "/libcublas.so")) found = 1;
  fclose(f);
  return found;
}

START_TEST(cublas_opened_on_first_use_only) {
  ck_assert_msg(!cublas_mapped(), "libcublas is mapped before the backend asked for it");
  ck_assert_ptr_null(probe__cuda_layers_error());
  int ok = probe__cuda_blas_loadable();
  const char *why = probe__cuda_layers_error();
  ck_assert_msg(ok == 1, "cuBLAS did not load: %s", why ? why : "(no text)");
  ck_assert_ptr_null(why);
  ck_assert_msg(cublas_mapped(), "the load left no libcublas mapped");
  ck_assert_int_eq(probe__cuda_blas_loadable(), 1); /* once, then the same */
}
END_TEST

int main(void) {
  Suite *s = suite_create("layers_cublas_load");
  TCase *tc = tcase_create("load");
  tcase_add_test(tc, cublas_opened_on_first_use_only);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
