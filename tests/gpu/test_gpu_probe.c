/*
 * test_gpu_probe.c - libprobe with CUDA device tensors: records computed on
 * the device equal the host kernel's on the same values (counts, extremes
 * and histogram exactly; sum and sumsq within 1e-9 relative of sum|x|),
 * snapshots copy device tensors, and CUPTI attributes the statistics
 * kernels to the NVTX/probe range that was open when they were launched.
 *
 * Registered from tests/probe/CMakeLists.txt (label gpu). Runs without fork
 * (CK_FORK=no: CUDA does not survive fork). Without a usable device it
 * prints "SKIP: <reason>" and exits 77, which CTest reports as skipped.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/probe.h"

#define CK_CUDA(call)                                                          \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

#define CK_PROBE(call)                                                         \
  do {                                                                         \
    probe_status s_ = (call);                                                  \
    ck_assert_msg(s_ == PROBE_OK, "%s: %s", #call, probe_status_name(s_));     \
  } while (0)

enum { NT = 3 };
static const size_t sizes[NT] = {10000, 4097, 333};
static const probe_dtype dtypes[NT] = {PROBE_DTYPE_F32, PROBE_DTYPE_F16,
                                       PROBE_DTYPE_BF16};

/* Host tensor i of step `step` with a NaN and an inf when bad. */
static void *host_tensor(int i, int step, int bad) {
  size_t n = sizes[i], esz = probe_dtype_size(dtypes[i]);
  unsigned char *p = malloc(n * esz);
  uint32_t h = 2463534242u + (uint32_t)(step * 7919 + i);
  for (size_t k = 0; k < n; k++) {
    h ^= h << 13;
    h ^= h >> 17;
    h ^= h << 5;
    float v = ldexpf(1.0f + (float)(h & 0xfff) / 4096.0f, (int)(h >> 20) % 30 - 15);
    if (h & 0x80000000u) v = -v;
    if (bad && k == 7) v = NAN;
    if (bad && k == 11) v = INFINITY;
    if (dtypes[i] == PROBE_DTYPE_F32) memcpy(p + k * 4, &v, 4);
    else {
      uint16_t b = dtypes[i] == PROBE_DTYPE_F16 ? probe_f32_to_f16(v)
                                                : probe_f32_to_bf16(v);
      memcpy(p + k * 2, &b, 2);
    }
  }
  return p;
}

static void *to_device(const void *h, size_t bytes) {
  void *d = NULL;
  CK_CUDA(cudaMalloc(&d, bytes));
  CK_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

static void expect_same(const probe_stats *a, const probe_stats *b) {
  ck_assert_uint_eq(a->count, b->count);
  ck_assert_uint_eq(a->nan_count, b->nan_count);
  ck_assert_uint_eq(a->posinf_count, b->posinf_count);
  ck_assert_uint_eq(a->neginf_count, b->neginf_count);
  ck_assert_uint_eq(a->zero_count, b->zero_count);
  ck_assert_uint_eq(a->f16_subnormal, b->f16_subnormal);
  ck_assert_uint_eq(a->f16_flush, b->f16_flush);
  ck_assert_uint_eq(a->f16_overflow, b->f16_overflow);
  ck_assert_int_eq(memcmp(&a->min, &b->min, 4), 0);
  ck_assert_int_eq(memcmp(&a->max, &b->max, 4), 0);
  ck_assert_int_eq(memcmp(&a->absmax, &b->absmax, 4), 0);
  ck_assert_int_eq(memcmp(&a->absmin_nonzero, &b->absmin_nonzero, 4), 0);
  ck_assert_int_eq(memcmp(a->hist, b->hist, sizeof a->hist), 0);
  double tol = 1e-9 * (fabs(a->sum) + a->sumsq + 1.0);
  ck_assert_double_eq_tol(a->sum, b->sum, tol);
  ck_assert_double_eq_tol(a->sumsq, b->sumsq, 1e-9 * a->sumsq + 1e-30);
}

static void tmp_path(char *buf, size_t len, const char *tag) {
  snprintf(buf, len, "/tmp/ampprobe-gpu-%d-%s.h5", (int)getpid(), tag);
}

/* Full mode: device records equal host records; step 2 holds NaN/inf in
 * tensor 1 and gets a snapshot copied from the device. */
START_TEST(test_gpu_records_and_snapshot) {
  char path[256];
  tmp_path(path, sizeof path, "rec");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  probe_session *s;
  CK_PROBE(probe_session_open(&s, path, &o));
  int32_t layer;
  CK_PROBE(probe_layer_register(s, "dev.layer", PROBE_KIND_LINEAR,
                                PROBE_DTYPE_F16, &layer));
  void *host[4][NT], *dev[4][NT];
  for (int step = 0; step < 4; step++) {
    CK_PROBE(probe_step_begin(s, step));
    for (int i = 0; i < NT; i++) {
      host[step][i] = host_tensor(i, step, step == 2 && i == 1);
      dev[step][i] =
          to_device(host[step][i], sizes[i] * probe_dtype_size(dtypes[i]));
      probe_range_push(s, layer, PROBE_SITE_FWD_OUT);
      CK_PROBE(probe_tensor_record(s, layer, PROBE_SITE_FWD_OUT, dtypes[i],
                                   dev[step][i], sizes[i]));
      probe_range_pop(s);
    }
    CK_PROBE(probe_step_end(s));
    /* the step's first non-finite record, from the device statistics */
    int64_t nf_step;
    probe_nonfinite_record any, fwd;
    int measured;
    CK_PROBE(probe_session_step_nonfinite(s, &nf_step, &any, &fwd, &measured));
    ck_assert_int_eq(nf_step, step);
    ck_assert_int_eq(measured, 1);
    ck_assert_int_eq(any.layer, step == 2 ? layer : -1);
    if (step == 2) {
      probe_stats want;
      CK_PROBE(probe_stats_compute(&want, dtypes[1], host[2][1], sizes[1]));
      ck_assert_int_eq(any.site, PROBE_SITE_FWD_OUT);
      ck_assert_uint_eq(any.count, want.count);
      ck_assert_uint_eq(any.nan_count, want.nan_count);
      ck_assert_uint_eq(any.posinf_count, want.posinf_count);
      ck_assert_uint_eq(any.neginf_count, want.neginf_count);
      ck_assert_int_eq(fwd.layer, layer);
    }
  }
  CK_PROBE(probe_session_close(s));

  probe_trace *t;
  CK_PROBE(probe_trace_open(&t, path));
  probe_record r[4 * NT];
  size_t got;
  CK_PROBE(probe_trace_read_records(t, 0, 4 * NT, r, &got));
  ck_assert_uint_eq(got, 4 * NT);
  for (int k = 0; k < 4 * NT; k++) {
    probe_stats want;
    CK_PROBE(probe_stats_compute(&want, dtypes[k % NT], host[k / NT][k % NT],
                                 sizes[k % NT]));
    expect_same(&want, &r[k].stats);
  }
  ck_assert_int_eq(probe_trace_get_info(t)->first_nonfinite_step, 2);
  probe_snapshot_info sn[NT];
  CK_PROBE(probe_trace_read_snapshots(t, 0, NT, sn, &got));
  ck_assert_uint_eq(got, NT); /* the layer's three tensors of step 2 */
  for (int i = 0; i < NT; i++) {
    ck_assert_int_eq(sn[i].step, 2);
    ck_assert_int_eq(sn[i].n, (int64_t)sizes[i]);
    float *v = malloc(sizes[i] * sizeof *v);
    CK_PROBE(probe_trace_read_snapshot_data(t, &sn[i], v));
    for (size_t k = 0; k < sizes[i]; k++) {
      float w;
      const unsigned char *h = host[2][i];
      if (dtypes[i] == PROBE_DTYPE_F32) memcpy(&w, h + 4 * k, 4);
      else {
        uint16_t b;
        memcpy(&b, h + 2 * k, 2);
        w = dtypes[i] == PROBE_DTYPE_F16 ? probe_f16_to_f32(b)
                                         : probe_bf16_to_f32(b);
      }
      ck_assert(memcmp(&w, &v[k], 4) == 0 || (isnan(w) && isnan(v[k])));
    }
    free(v);
  }
  probe_trace_close(t);
  for (int step = 0; step < 4; step++)
    for (int i = 0; i < NT; i++) {
      free(host[step][i]);
      cudaFree(dev[step][i]);
    }
  unlink(path);
}
END_TEST

/* CUPTI: the statistics kernels run inside a probe range are in the
 * kernels table with that range's step, layer and site. */
START_TEST(test_gpu_cupti_kernels) {
  char path[256];
  tmp_path(path, sizeof path, "cupti");
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.cupti = 1;
  probe_session *s;
  CK_PROBE(probe_session_open(&s, path, &o));
  int32_t a, b;
  CK_PROBE(probe_layer_register(s, "a", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &a));
  CK_PROBE(probe_layer_register(s, "b", PROBE_KIND_BN, PROBE_DTYPE_F16, &b));
  void *h = host_tensor(0, 0, 0);
  void *d = to_device(h, sizes[0] * 4);
  for (int step = 0; step < 3; step++) {
    CK_PROBE(probe_step_begin(s, step));
    probe_range_push(s, a, PROBE_SITE_FWD_OUT);
    CK_PROBE(probe_tensor_record(s, a, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, d,
                                 sizes[0]));
    probe_range_pop(s);
    probe_range_push(s, b, PROBE_SITE_GRAD_IN);
    CK_PROBE(probe_tensor_record(s, b, PROBE_SITE_GRAD_IN, PROBE_DTYPE_F32, d,
                                 sizes[0]));
    probe_range_pop(s);
    CK_PROBE(probe_step_end(s));
  }
  CK_PROBE(probe_session_close(s));
  probe_trace *t;
  CK_PROBE(probe_trace_open(&t, path));
  int64_t nk = probe_trace_get_info(t)->n_kernels;
  ck_assert_int_gt(nk, 0);
  probe_kernel_record *k = malloc((size_t)nk * sizeof *k);
  size_t got;
  CK_PROBE(probe_trace_read_kernels(t, 0, (size_t)nk, k, &got));
  int in_a = 0, in_b = 0;
  for (size_t i = 0; i < got; i++) {
    ck_assert_uint_ge(k[i].end_ns, k[i].start_ns);
    ck_assert(k[i].name[0] != '\0');
    if (k[i].layer == a && k[i].site == PROBE_SITE_FWD_OUT) in_a++;
    if (k[i].layer == b && k[i].site == PROBE_SITE_GRAD_IN) in_b++;
    if (k[i].layer >= 0) ck_assert(k[i].step >= 0 && k[i].step < 3);
  }
  ck_assert_int_ge(in_a, 3);
  ck_assert_int_ge(in_b, 3);
  free(k);
  probe_trace_close(t);
  free(h);
  cudaFree(d);
  unlink(path);
}
END_TEST

int main(void) {
  if (!probe_cuda_available()) {
    printf("SKIP: no usable CUDA device\n");
    return 77;
  }
  Suite *su = suite_create("gpu_probe");
  TCase *tc = tcase_create("gpu_probe");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_gpu_records_and_snapshot);
  tcase_add_test(tc, test_gpu_cupti_kernels);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
