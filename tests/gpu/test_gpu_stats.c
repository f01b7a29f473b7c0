/*
 * test_gpu_stats.c - the CUDA statistics path (kernels/stats_cuda.cu)
 * against the CPU reference probe_stats_compute_portable, and the inline
 * conversions of ampprobe/numerics.h run on the device against the host.
 *
 * Every record field is compared: counts, extremes (as bits: -0 and +0
 * differ) and the histogram exactly; sum and sumsq within 1e-9 of sum|x|
 * (see sum_tolerance). Data: several random distributions and edge cases,
 * for fp32/fp16/bf16, sizes from 0 to 2^22, aligned and misaligned starts,
 * single and multi-tensor launches.
 *
 * Runs without fork (CUDA does not survive fork). Without a usable device
 * it prints "SKIP: <reason>" and exits 77, which CTest reports as skipped.
 * The same source also builds against the CPU emulation in emu/ (test
 * gpu_stats_emu), where it runs everywhere; see docs/cuda.md.
 */
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/numerics.h"
#include "gpu_convert.h"

#define CK_CUDA(call)                                                          \
  do {                                                                         \
    cudaError_t ck_e_ = (call);                                                \
    ck_assert_msg(ck_e_ == cudaSuccess, "%s: %s", #call,                       \
                  cudaGetErrorString(ck_e_));                                  \
  } while (0)

#define CK_PROBE(call)                                                         \
  do {                                                                         \
    probe_status ck_s_ = (call);                                               \
    ck_assert_msg(ck_s_ == PROBE_OK, "%s: %s [%s]", #call,                     \
                  probe_status_str(ck_s_), probe_cuda_last_error());           \
  } while (0)

/* ---- data ------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { /* [0, 1) */
  return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal(uint64_t *s) {
  double u = rng_unit(s), v = rng_unit(s);
  return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

enum {
  D_NORMAL,     /* N(0, 1) */
  D_WIDE,       /* N(0, 1) * 3e4: crosses 65504/65520 now and then */
  D_UNIFORM,    /* U(-1, 1) */
  D_LOGUNIFORM, /* random sign, exponent uniform over [-150, 130]: subnormal
                   binary32, huge, every histogram bin, a few inf */
  D_RAWBITS,    /* uniformly random bit patterns (NaN payloads, infs) */
  D_ALLNAN,     /* NaN of random payload and sign */
  D_ALLPOSINF,  /* +inf */
  D_INFMIX,     /* +-inf, NaN and ordinary values */
  D_ZEROS,      /* +0 and -0 with a few values */
  D_NEGZERO,    /* -0 only */
  D_SUBNORMAL,  /* binary32 and binary16 subnormal magnitudes */
  D_STRADDLE,   /* values at and next to 65504, 65520, 2^-14, 2^-24, 2^-25 */
  D_CONSTANT,   /* 1.5 everywhere: one histogram bin */
  D_COUNT
};

static const char *dist_name[D_COUNT] = {
    "normal",   "wide",      "uniform",  "loguniform", "rawbits",
    "allnan",   "allposinf", "infmix",   "zeros",      "negzero",
    "subnormal", "straddle", "constant"};

static float next_up(float x) {
  return nextafterf(x, INFINITY);
}
static float next_down(float x) {
  return nextafterf(x, -INFINITY);
}

/* One element's bits, in dtype dt, drawn from distribution dist. */
static uint32_t gen_elem(probe_dtype dt, int dist, uint64_t *s) {
  uint64_t r = rng_next(s);
  uint32_t sign32 = (uint32_t)(r >> 63) << 31;
  float f = 0.0f;
  switch (dist) {
  case D_NORMAL:
    f = (float)rng_normal(s);
    break;
  case D_WIDE:
    f = (float)(rng_normal(s) * 3e4);
    break;
  case D_UNIFORM:
    f = (float)(2.0 * rng_unit(s) - 1.0);
    break;
  case D_LOGUNIFORM: {
    int e = (int)(rng_next(s) % 281) - 150;
    f = ldexpf(1.0f + (float)rng_unit(s), e); /* may be inf for e >= 128 */
    f = sign32 ? -f : f;
    break;
  }
  case D_RAWBITS:
    return dt == PROBE_DTYPE_F32 ? (uint32_t)r : (uint32_t)(r & 0xffffu);
  case D_ALLNAN:
    switch (dt) {
    case PROBE_DTYPE_F32:
      return sign32 | 0x7f800000u | (1u + (uint32_t)(r % 0x7fffffu));
    case PROBE_DTYPE_F16:
      return (sign32 >> 16) | 0x7c00u | (1u + (uint32_t)(r % 0x3ffu));
    default:
      return (sign32 >> 16) | 0x7f80u | (1u + (uint32_t)(r % 0x7fu));
    }
  case D_ALLPOSINF:
    f = INFINITY;
    break;
  case D_INFMIX:
    switch (r % 4) {
    case 0: f = INFINITY; break;
    case 1: f = -INFINITY; break;
    case 2: f = NAN; break;
    default: f = (float)rng_normal(s); break;
    }
    break;
  case D_ZEROS:
    f = (r % 8 == 0) ? (float)rng_normal(s) : 0.0f;
    f = sign32 ? -f : f;
    break;
  case D_NEGZERO:
    f = -0.0f;
    break;
  case D_SUBNORMAL:
    if (r % 2) /* binary32 subnormal */
      f = ldexpf((float)rng_unit(s), -126);
    else /* binary16 subnormal range [2^-25, 2^-14) */
      f = ldexpf(1.0f + (float)rng_unit(s), -25 + (int)(rng_next(s) % 11));
    f = sign32 ? -f : f;
    break;
  case D_STRADDLE: {
    static const float base[] = {65504.0f, 65520.0f, 65536.0f,
                                 PROBE_F16_MIN_NORMAL,
                                 PROBE_F16_MIN_SUBNORMAL, PROBE_F16_FLUSH,
                                 1.5f * PROBE_F16_FLUSH, 0x1p-26f};
    f = base[(r >> 8) % (sizeof base / sizeof base[0])];
    if (r % 3 == 1) f = next_up(f);
    if (r % 3 == 2) f = next_down(f);
    f = sign32 ? -f : f;
    break;
  }
  case D_CONSTANT:
    f = 1.5f;
    break;
  }
  switch (dt) {
  case PROBE_DTYPE_F32:
    return probe_f32_bits(f);
  case PROBE_DTYPE_F16:
    return probe_f32_to_f16(f);
  default:
    return probe_f32_to_bf16(f);
  }
}

/* Host buffer of off + n elements; elements [off, off+n) are drawn. */
static void *gen_data(probe_dtype dt, int dist, size_t off, size_t n,
                      uint64_t seed) {
  size_t esz = probe_dtype_size(dt);
  unsigned char *p = malloc((off + n) * esz + 1);
  ck_assert_ptr_nonnull(p);
  memset(p, 0xff, off * esz); /* NaN in front: must not be read */
  uint64_t s = seed;
  for (size_t i = 0; i < n; i++) {
    uint32_t v = gen_elem(dt, dist, &s);
    if (esz == 4) {
      memcpy(p + (off + i) * 4, &v, 4);
    } else {
      uint16_t h = (uint16_t)v;
      memcpy(p + (off + i) * 2, &h, 2);
    }
  }
  return p;
}

static float elem_value(probe_dtype dt, const void *data, size_t i) {
  if (dt == PROBE_DTYPE_F32) {
    float f;
    memcpy(&f, (const char *)data + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, (const char *)data + 2 * i, 2);
  return dt == PROBE_DTYPE_F16 ? probe_f16_to_f32(h) : probe_bf16_to_f32(h);
}

/* Sum of |x| over finite x, the scale the sum tolerance is relative to. */
static double abs_sum(probe_dtype dt, const void *data, size_t n) {
  double a = 0.0;
  for (size_t i = 0; i < n; i++) {
    float f = elem_value(dt, data, i);
    if (isfinite(f)) a += fabs((double)f);
  }
  return a;
}

/* ---- comparison ------------------------------------------------------------- */

/* Sum and sumsq add binary32 values (and their exact squares) in double; the
 * GPU and CPU only add them in different orders. Each order's error is at
 * most (n-1) * 2^-53 * sum|x| (recursive summation bound, u = 2^-53), so the
 * two differ by at most 2 (n-1) 2^-53 sum|x| < 1e-9 sum|x| for n <= 2^22,
 * the largest size tested. For sumsq, sum|x^2| is sumsq itself. */
static double sum_tolerance(double scale) {
  return 1e-9 * scale;
}

static int same_bits(float a, float b) {
  if (isnan(a) && isnan(b)) return 1;
  return probe_f32_bits(a) == probe_f32_bits(b);
}

static void check_record(const probe_stats *g, const probe_stats *c,
                         double asum, const char *what) {
#define CK_U64(field)                                                          \
  ck_assert_msg(g->field == c->field, "%s: " #field " gpu %llu cpu %llu",      \
                what, (unsigned long long)g->field,                            \
                (unsigned long long)c->field)
#define CK_F32(field)                                                          \
  ck_assert_msg(same_bits(g->field, c->field),                                 \
                "%s: " #field " gpu %a (0x%08x) cpu %a (0x%08x)", what,        \
                (double)g->field, probe_f32_bits(g->field), (double)c->field,  \
                probe_f32_bits(c->field))
  CK_U64(count);
  CK_U64(nan_count);
  CK_U64(posinf_count);
  CK_U64(neginf_count);
  CK_U64(zero_count);
  CK_U64(f16_subnormal);
  CK_U64(f16_flush);
  CK_U64(f16_overflow);
  CK_F32(min);
  CK_F32(max);
  CK_F32(absmax);
  CK_F32(absmin_nonzero);
  for (int b = 0; b < PROBE_HIST_BINS; b++)
    ck_assert_msg(g->hist[b] == c->hist[b], "%s: hist[%d] gpu %llu cpu %llu",
                  what, b, (unsigned long long)g->hist[b],
                  (unsigned long long)c->hist[b]);
  ck_assert_msg(fabs(g->sum - c->sum) <= sum_tolerance(asum),
                "%s: sum gpu %.17g cpu %.17g (sum|x| %.17g)", what, g->sum,
                c->sum, asum);
  ck_assert_msg(fabs(g->sumsq - c->sumsq) <= sum_tolerance(c->sumsq),
                "%s: sumsq gpu %.17g cpu %.17g", what, g->sumsq, c->sumsq);
#undef CK_U64
#undef CK_F32
}

/* ---- one-tensor launches ---------------------------------------------------- */

static const probe_dtype dtypes[3] = {PROBE_DTYPE_F32, PROBE_DTYPE_F16,
                                      PROBE_DTYPE_BF16};

/* 8192 elements is one chunk (block) of stats_cuda.cu; 2^20 + 13 is many
 * blocks. 2^22 (the largest the sum tolerance is argued for) only for a few
 * distributions, to keep the test fast. Every build runs every size, the
 * sanitized one too (make test-asan: the whole test 63 s of CPU there on a
 * Zen 1 since the emulator switches coroutines without swapcontext,
 * emu/cuda_emu.cpp; 488 s with swapcontext and smaller sizes). */
static const size_t sizes[] = {0,    1,     2,      7,       33,       255,
                               256,  4097,  8192,   8199,    100003,
                               (1u << 20) + 13};
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define BIG_SIZE ((size_t)1 << 22)

static probe_cuda_stats *ctx_global;

/* Upload data, one enqueue, wait, compare with the portable CPU record. */
static void run_single(probe_dtype dt, int dist, size_t n, size_t off,
                       uint64_t seed) {
  char what[128];
  snprintf(what, sizeof what, "%s/%s n=%zu off=%zu", probe_dtype_name(dt),
           dist_name[dist], n, off);
  size_t esz = probe_dtype_size(dt);
  void *h = gen_data(dt, dist, off, n, seed);
  const void *elems = (const char *)h + off * esz;
  void *d = NULL;
  CK_CUDA(cudaMalloc(&d, (off + n) * esz + 1));
  CK_CUDA(cudaMemcpy(d, h, (off + n) * esz, cudaMemcpyHostToDevice));

  probe_stats cpu, gpu;
  memset(&gpu, 0xab, sizeof gpu); /* garbage: every field must be written */
  CK_PROBE(probe_stats_compute_portable(&cpu, dt, elems, n));
  probe_cuda_tensor t = {(const char *)d + off * esz, n, dt};
  CK_PROBE(probe_cuda_stats_enqueue(ctx_global, &t, 1, &gpu));
  CK_PROBE(probe_cuda_stats_wait(ctx_global));
  check_record(&gpu, &cpu, abs_sum(dt, elems, n), what);
  CK_CUDA(cudaFree(d));
  free(h);
}

static void setup_ctx(void) {
  ck_assert_int_eq(probe_cuda_stats_create(&ctx_global, NULL, 64), PROBE_OK);
}

static void teardown_ctx(void) {
  probe_cuda_stats_destroy(ctx_global);
  ctx_global = NULL;
}

/* _i enumerates (dtype, distribution); every size, aligned start. */
START_TEST(test_single_aligned) {
  probe_dtype dt = dtypes[_i % 3];
  int dist = _i / 3;
  const int varied = dist == D_NORMAL || dist == D_LOGUNIFORM || dist == D_RAWBITS;
  for (size_t k = 0; k < NSIZES; k++) {
    run_single(dt, dist, sizes[k], 0, 1000u * (uint64_t)_i + k);
  }
  if (varied) run_single(dt, dist, BIG_SIZE, 0, 1000u * (uint64_t)_i + 999u);
}
END_TEST

/* Starts 1..7 elements past a 16-byte boundary: scalar head, vector body,
 * scalar tail all in use. */
START_TEST(test_single_misaligned) {
  probe_dtype dt = dtypes[_i % 3];
  static const int dists[] = {D_NORMAL, D_RAWBITS, D_STRADDLE, D_INFMIX};
  int dist = dists[_i / 3];
  static const size_t ns[] = {1, 3, 9, 8199, 100003};
  for (size_t off = 1; off < 8; off += 2)
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
      run_single(dt, dist, ns[k], off, 7000u + 100u * (uint64_t)_i + k + off);
}
END_TEST

/* ---- multi-tensor launches --------------------------------------------------- */

#define MT_COUNT 64

typedef struct mt_batch {
  probe_cuda_tensor t[MT_COUNT];
  void *host[MT_COUNT];   /* element data on the host */
  void *dev[MT_COUNT];    /* allocations on the device */
  probe_stats gpu[MT_COUNT];
} mt_batch;

/* 64 tensors of mixed dtypes, distributions, sizes (0, 1, odd, one block,
 * many blocks) and start offsets. */
static void mt_make(mt_batch *b, uint64_t seed) {
  static const size_t ns[] = {0, 1, 5, 31, 256, 1000, 8192, 8193, 65537,
                              300007};
  uint64_t s = seed;
  for (int i = 0; i < MT_COUNT; i++) {
    probe_dtype dt = dtypes[rng_next(&s) % 3];
    int dist = (int)(rng_next(&s) % D_COUNT);
    size_t n = ns[rng_next(&s) % (sizeof ns / sizeof ns[0])];
    size_t off = rng_next(&s) % 4;
    size_t esz = probe_dtype_size(dt);
    void *h = gen_data(dt, dist, off, n, seed * 131u + (uint64_t)i);
    CK_CUDA(cudaMalloc(&b->dev[i], (off + n) * esz + 1));
    CK_CUDA(cudaMemcpy(b->dev[i], h, (off + n) * esz, cudaMemcpyHostToDevice));
    b->host[i] = h;
    b->t[i].data = (const char *)b->dev[i] + off * esz;
    b->t[i].n = n;
    b->t[i].dtype = dt;
    memmove(h, (char *)h + off * esz, n * esz); /* host copy: elements only */
    memset(&b->gpu[i], 0xab, sizeof b->gpu[i]);
  }
}

static void mt_check(const mt_batch *b, const char *label) {
  for (int i = 0; i < MT_COUNT; i++) {
    char what[128];
    probe_stats cpu;
    snprintf(what, sizeof what, "%s tensor %d (%s n=%zu)", label, i,
             probe_dtype_name(b->t[i].dtype), b->t[i].n);
    CK_PROBE(probe_stats_compute_portable(&cpu, b->t[i].dtype, b->host[i],
                                          b->t[i].n));
    check_record(&b->gpu[i], &cpu,
                 abs_sum(b->t[i].dtype, b->host[i], b->t[i].n), what);
  }
}

static void mt_free(mt_batch *b) {
  for (int i = 0; i < MT_COUNT; i++) {
    CK_CUDA(cudaFree(b->dev[i]));
    free(b->host[i]);
  }
}

/* All 64 in one enqueue and one launch (max_tensors 64). */
START_TEST(test_multi_one_launch) {
  static mt_batch b;
  mt_make(&b, 11);
  CK_PROBE(probe_cuda_stats_enqueue(ctx_global, b.t, MT_COUNT, b.gpu));
  CK_PROBE(probe_cuda_stats_wait(ctx_global));
  mt_check(&b, "one launch");
  mt_free(&b);
}
END_TEST

/* A context of max_tensors 16 splits each enqueue into 4 launches; 6 batches
 * before one wait overflow its arena (4 * 16 records) and force internal
 * drains. Each batch must still land in its own array. */
START_TEST(test_multi_many_batches) {
  enum { NB = 6 };
  static mt_batch b[NB];
  probe_cuda_stats *ctx = NULL;
  CK_PROBE(probe_cuda_stats_create(&ctx, NULL, 16));
  for (int k = 0; k < NB; k++) mt_make(&b[k], 100u + (uint64_t)k);
  for (int k = 0; k < NB; k++)
    CK_PROBE(probe_cuda_stats_enqueue(ctx, b[k].t, MT_COUNT, b[k].gpu));
  CK_PROBE(probe_cuda_stats_wait(ctx));
  for (int k = 0; k < NB; k++) {
    char label[32];
    snprintf(label, sizeof label, "batch %d", k);
    mt_check(&b[k], label);
    mt_free(&b[k]);
  }
  probe_cuda_stats_destroy(ctx);
}
END_TEST

/* A caller's stream: results follow work the caller queued before. */
START_TEST(test_user_stream) {
  cudaStream_t st;
  CK_CUDA(cudaStreamCreate(&st));
  probe_cuda_stats *ctx = NULL;
  CK_PROBE(probe_cuda_stats_create(&ctx, (void *)st, 4));
  size_t n = 50001;
  void *h = gen_data(PROBE_DTYPE_F32, D_NORMAL, 0, n, 5);
  void *d = NULL;
  CK_CUDA(cudaMalloc(&d, n * 4));
  CK_CUDA(cudaMemsetAsync(d, 0, n * 4, st));
  CK_CUDA(cudaMemcpyAsync(d, h, n * 4, cudaMemcpyHostToDevice, st));
  probe_cuda_tensor t = {d, n, PROBE_DTYPE_F32};
  probe_stats gpu, cpu;
  CK_PROBE(probe_cuda_stats_enqueue(ctx, &t, 1, &gpu));
  CK_PROBE(probe_cuda_stats_wait(ctx));
  CK_PROBE(probe_stats_compute_portable(&cpu, PROBE_DTYPE_F32, h, n));
  check_record(&gpu, &cpu, abs_sum(PROBE_DTYPE_F32, h, n), "user stream");
  probe_cuda_stats_destroy(ctx);
  CK_CUDA(cudaFree(d));
  CK_CUDA(cudaStreamDestroy(st));
  free(h);
}
END_TEST

/* 2^26 fp16 elements, nearly all in one histogram bin (the most any 16-bit
 * per-thread counter of the kernel can be asked to hold), in a context of
 * max_tensors 1. Under the emulation the device reports 1 SM, so the launch
 * aims at 2 blocks: the 2^23-elements-per-chunk floor must split the tensor
 * into 8 chunks instead (else counters wrap) and the partial scratch must be
 * regrown. Sums are exact here (halves far below 2^53) on either side. */
START_TEST(test_huge_one_bin) {
#ifdef AMPPROBE_CUDA_EMU
  emu_set_sm_count(1);
#endif
  probe_cuda_stats *ctx = NULL;
  CK_PROBE(probe_cuda_stats_create(&ctx, NULL, 1));
  size_t n = (size_t)1 << 26;
  uint16_t *h = gen_data(PROBE_DTYPE_F16, D_CONSTANT, 0, n, 3);
  h[12345] = 0x7e00;        /* NaN */
  h[n - 1] = 0x8000;        /* -0 */
  h[n / 2] = 0x7bff;        /* 65504 */
  h[n / 3] = 0x0001;        /* 2^-24 */
  void *d = NULL;
  CK_CUDA(cudaMalloc(&d, n * 2));
  CK_CUDA(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  probe_cuda_tensor t = {d, n, PROBE_DTYPE_F16};
  probe_stats gpu, cpu;
  CK_PROBE(probe_cuda_stats_enqueue(ctx, &t, 1, &gpu));
  CK_PROBE(probe_cuda_stats_wait(ctx));
  CK_PROBE(probe_stats_compute_portable(&cpu, PROBE_DTYPE_F16, h, n));
  ck_assert_uint_eq(cpu.hist[1 - PROBE_HIST_MIN_EXP], n - 4); /* 1.5: 2^0 */
  check_record(&gpu, &cpu, 0.0, "huge one-bin fp16");
  ck_assert(gpu.sum == cpu.sum); /* exact */
  probe_cuda_stats_destroy(ctx);
  CK_CUDA(cudaFree(d));
  free(h);
#ifdef AMPPROBE_CUDA_EMU
  emu_set_sm_count(64);
#endif
}
END_TEST

/* ---- API edges --------------------------------------------------------------- */

START_TEST(test_api_errors) {
  probe_cuda_stats *ctx = NULL;
  probe_stats out;
  ck_assert_int_eq(probe_cuda_stats_create(NULL, NULL, 4), PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_cuda_stats_create(&ctx, NULL, 0), PROBE_ERR_INVALID_ARG);
  ck_assert_ptr_null(ctx);
  CK_PROBE(probe_cuda_stats_create(&ctx, NULL, 4));
  void *d = NULL;
  CK_CUDA(cudaMalloc(&d, 64));
  probe_cuda_tensor bad_dtype = {d, 4, (probe_dtype)7};
  probe_cuda_tensor odd_ptr = {(const char *)d + 1, 4, PROBE_DTYPE_F16};
  probe_cuda_tensor null_ptr = {NULL, 4, PROBE_DTYPE_F32};
  probe_cuda_tensor empty = {NULL, 0, PROBE_DTYPE_F32};
  ck_assert_int_eq(probe_cuda_stats_enqueue(ctx, &bad_dtype, 1, &out),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_cuda_stats_enqueue(ctx, &odd_ptr, 1, &out),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_cuda_stats_enqueue(ctx, &null_ptr, 1, &out),
                   PROBE_ERR_INVALID_ARG);
  ck_assert_int_eq(probe_cuda_stats_enqueue(ctx, &empty, 1, NULL),
                   PROBE_ERR_INVALID_ARG);
  CK_PROBE(probe_cuda_stats_enqueue(ctx, NULL, 0, NULL)); /* nothing to do */
  CK_PROBE(probe_cuda_stats_wait(ctx));                  /* nothing pending */
  /* An empty tensor (NULL data) gives the identity record with count 0. */
  memset(&out, 0xab, sizeof out);
  CK_PROBE(probe_cuda_stats_enqueue(ctx, &empty, 1, &out));
  CK_PROBE(probe_cuda_stats_wait(ctx));
  probe_stats id;
  probe_stats_init(&id);
  check_record(&out, &id, 0.0, "empty");
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  probe_cuda_stats_destroy(ctx);
  probe_cuda_stats_destroy(NULL);
  CK_CUDA(cudaFree(d));
}
END_TEST

START_TEST(test_is_device_ptr) {
  void *d = NULL, *m = NULL, *pinned = NULL;
  int local = 0;
  void *h = malloc(64);
  CK_CUDA(cudaMalloc(&d, 64));
  CK_CUDA(cudaMallocManaged(&m, 64, cudaMemAttachGlobal));
  CK_CUDA(cudaMallocHost(&pinned, 64));
  ck_assert_int_eq(probe_cuda_available(), 1);
  ck_assert_int_eq(probe_cuda_is_device_ptr(d), 1);
  ck_assert_int_eq(probe_cuda_is_device_ptr((char *)d + 8), 1);
  ck_assert_int_eq(probe_cuda_is_device_ptr(m), 1);
  ck_assert_int_eq(probe_cuda_is_device_ptr(pinned), 0);
  ck_assert_int_eq(probe_cuda_is_device_ptr(h), 0);
  ck_assert_int_eq(probe_cuda_is_device_ptr(&local), 0);
  ck_assert_int_eq(probe_cuda_is_device_ptr(NULL), 0);
  /* no sticky or pending error left behind */
  ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
  CK_CUDA(cudaFree(d));
  CK_CUDA(cudaFree(m));
  CK_CUDA(cudaFreeHost(pinned));
  free(h);
}
END_TEST

/* ---- conversions on the device ------------------------------------------------ */

START_TEST(test_device_f16_to_f32_all) {
  enum { N = 65536 };
  uint16_t *hin = malloc(N * sizeof *hin);
  uint32_t *hout = malloc(N * sizeof *hout);
  for (uint32_t i = 0; i < N; i++) hin[i] = (uint16_t)i;
  uint16_t *din;
  uint32_t *dout;
  CK_CUDA(cudaMalloc((void **)&din, N * sizeof *din));
  CK_CUDA(cudaMalloc((void **)&dout, N * sizeof *dout));
  CK_CUDA(cudaMemcpy(din, hin, N * sizeof *din, cudaMemcpyHostToDevice));
  CK_CUDA((cudaError_t)gpu_f16_to_f32(dout, din, N));
  CK_CUDA(cudaMemcpy(hout, dout, N * sizeof *hout, cudaMemcpyDeviceToHost));
  for (uint32_t i = 0; i < N; i++)
    ck_assert_msg(hout[i] == probe_f32_bits(probe_f16_to_f32((uint16_t)i)),
                  "fp16 0x%04x: device 0x%08x host 0x%08x", i, hout[i],
                  probe_f32_bits(probe_f16_to_f32((uint16_t)i)));
  /* and bf16 -> f32, also all 65,536 */
  CK_CUDA((cudaError_t)gpu_bf16_to_f32(dout, din, N));
  CK_CUDA(cudaMemcpy(hout, dout, N * sizeof *hout, cudaMemcpyDeviceToHost));
  for (uint32_t i = 0; i < N; i++)
    ck_assert_msg(hout[i] == probe_f32_bits(probe_bf16_to_f32((uint16_t)i)),
                  "bf16 0x%04x: device 0x%08x host 0x%08x", i, hout[i],
                  probe_f32_bits(probe_bf16_to_f32((uint16_t)i)));
  CK_CUDA(cudaFree(din));
  CK_CUDA(cudaFree(dout));
  free(hin);
  free(hout);
}
END_TEST

/* Stratified binary32 sample: every sign and exponent, with mantissas at and
 * next to the binary16 (13 dropped bits) and bfloat16 (16 dropped bits)
 * rounding ties, the extremes, and random ones. */
static size_t stratified_f32(uint32_t *out, size_t cap) {
  static const uint32_t fixed[] = {
      0x000000u, 0x000001u, 0x000002u, 0x7fffffu, 0x7ffffeu, 0x400000u,
      0x000fffu, 0x001000u, 0x001001u, 0x002fffu, 0x003000u, 0x003001u,
      0x7fefffu, 0x7ff000u, 0x7ff001u, 0x007fffu, 0x008000u, 0x008001u,
      0x017fffu, 0x018000u, 0x018001u, 0x7f7fffu, 0x7f8000u, 0x7f8001u};
  size_t n = 0;
  uint64_t s = 42;
  for (uint32_t sign = 0; sign < 2; sign++)
    for (uint32_t e = 0; e < 256; e++) {
      for (size_t k = 0; k < sizeof fixed / sizeof fixed[0] && n < cap; k++)
        out[n++] = (sign << 31) | (e << 23) | fixed[k];
      for (int k = 0; k < 64 && n < cap; k++)
        out[n++] = (sign << 31) | (e << 23) | ((uint32_t)rng_next(&s) & 0x7fffffu);
      for (int k = 0; k < 16 && n < cap; k++) { /* random tie +- 1 */
        uint32_t m = (uint32_t)rng_next(&s) & 0x7fe000u;
        out[n++] = (sign << 31) | (e << 23) | ((m | 0x1000u) + (uint32_t)(k % 3) - 1u);
      }
    }
  return n;
}

START_TEST(test_device_f32_to_half_sample) {
  enum { CAP = 2 * 256 * (24 + 64 + 16) };
  uint32_t *hin = malloc(CAP * sizeof *hin);
  uint16_t *hout = malloc(CAP * sizeof *hout);
  size_t n = stratified_f32(hin, CAP);
  ck_assert_uint_eq(n, CAP);
  uint32_t *din;
  uint16_t *dout;
  CK_CUDA(cudaMalloc((void **)&din, n * sizeof *din));
  CK_CUDA(cudaMalloc((void **)&dout, n * sizeof *dout));
  CK_CUDA(cudaMemcpy(din, hin, n * sizeof *din, cudaMemcpyHostToDevice));

  CK_CUDA((cudaError_t)gpu_f32_to_f16(dout, din, n));
  CK_CUDA(cudaMemcpy(hout, dout, n * sizeof *hout, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    uint16_t want = probe_f32_to_f16(probe_f32_from_bits(hin[i]));
    ck_assert_msg(hout[i] == want, "f32 0x%08x -> fp16: device 0x%04x host 0x%04x",
                  hin[i], hout[i], want);
  }
  CK_CUDA((cudaError_t)gpu_f32_to_bf16(dout, din, n));
  CK_CUDA(cudaMemcpy(hout, dout, n * sizeof *hout, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    uint16_t want = probe_f32_to_bf16(probe_f32_from_bits(hin[i]));
    ck_assert_msg(hout[i] == want, "f32 0x%08x -> bf16: device 0x%04x host 0x%04x",
                  hin[i], hout[i], want);
  }
  CK_CUDA(cudaFree(din));
  CK_CUDA(cudaFree(dout));
  free(hin);
  free(hout);
}
END_TEST

/* ---- runner ------------------------------------------------------------------- */

static Suite *make_gpu_stats_suite(void) {
  Suite *s = suite_create("gpu_stats");
  TCase *tc = tcase_create("single");
  tcase_add_checked_fixture(tc, setup_ctx, teardown_ctx);
  tcase_add_loop_test(tc, test_single_aligned, 0, 3 * D_COUNT);
  tcase_add_loop_test(tc, test_single_misaligned, 0, 3 * 4);
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);

  tc = tcase_create("multi");
  tcase_add_checked_fixture(tc, setup_ctx, teardown_ctx);
  tcase_add_test(tc, test_multi_one_launch);
  tcase_add_test(tc, test_multi_many_batches);
  tcase_add_test(tc, test_user_stream);
  tcase_add_test(tc, test_huge_one_bin);
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);

  tc = tcase_create("api");
  tcase_add_test(tc, test_api_errors);
  tcase_add_test(tc, test_is_device_ptr);
  suite_add_tcase(s, tc);

  tc = tcase_create("convert");
  tcase_add_test(tc, test_device_f16_to_f32_all);
  tcase_add_test(tc, test_device_f32_to_half_sample);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  int ndev = 0;
  cudaError_t err = cudaGetDeviceCount(&ndev);
  if (err != cudaSuccess || ndev == 0) {
    printf("SKIP: no usable CUDA device: %s\n",
           err != cudaSuccess ? cudaGetErrorString(err)
                              : "cudaGetDeviceCount found 0 devices");
    return 77;
  }
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    printf("device 0: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount);
  SRunner *sr = srunner_create(make_gpu_stats_suite());
  srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
