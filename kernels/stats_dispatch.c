/*
 * stats_dispatch.c - which CPU statistics path runs: chosen once per process
 * from what the CPU has (or from AMPPROBE_STATS_PATH), as a table of paths,
 * each a function that adds a whole tensor into an accumulator.
 *
 * Paths (stats_impl.h, PROBE__PATH_*):
 *   portable  stats.c         any CPU
 *   avx2      stats_block.c   block driver + stats_avx2.c (AVX2, F16C, FMA)
 *   avx512    stats_block.c   block driver + stats_avx512.c (F/BW/VL/DQ/VBMI2/VNNI)
 *   small2    stats_small2.c  short tensors, AVX2
 *   small512  stats_small.c   short tensors, AVX-512
 * A family is what probe_stats_compute uses: the portable path alone, or a
 * short-tensor path and a length per dtype, and the block path past it.
 * The family is the widest the CPU has, or the one AMPPROBE_STATS_PATH names
 * (read once, at the first call: "avx512", "avx2" or "portable"; a family the
 * CPU lacks gives the widest it has below it; "auto", empty or unknown: the
 * widest). Nothing here is per call but one table lookup and a compare.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stats_impl.h"

/* Compiled without -mavx2, so that this test itself runs on any x86-64. */
int probe__cpu_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
         __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

int probe__cpu_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return probe__cpu_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi2") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return 0;
#endif
}

static int cpu_any(void) { return 1; }

/* One path: whether this CPU runs it, the longest tensor it takes, and the
 * function. */
typedef struct stats_path {
  const char *name;
  int (*available)(void);
  size_t max_n;
  void (*acc)(probe__acc *a, probe_dtype dt, const void *data, size_t n);
} stats_path;

static const stats_path paths[PROBE__PATH_COUNT] = {
    [PROBE__PATH_PORTABLE] = {"portable", cpu_any, SIZE_MAX, probe__acc_portable},
    [PROBE__PATH_AVX2] = {"avx2", probe__cpu_avx2, SIZE_MAX, probe__acc_avx2},
    [PROBE__PATH_AVX512] = {"avx512", probe__cpu_avx512, SIZE_MAX, probe__acc_avx512},
    [PROBE__PATH_SMALL512] = {"small512", probe__cpu_avx512, PROBE__SMALL_MAX_N,
                              probe__acc_small_avx512},
    [PROBE__PATH_SMALL2] = {"small2", probe__cpu_avx2, PROBE__SMALL_MAX_N, probe__acc_small_avx2},
};

/* A family: a short-tensor path per dtype up to small_max[dtype] elements,
 * the block path past that. The lengths are the measured crossovers
 * (bench_stats --short; bench/results/stats.md).
 * - AVX2, on an AVX2-only AMD EPYC (Zen 3; 2026-12-02, quiet machine, CPU
 *   time, best of short batches spread over the run): the short path is
 *   faster at every length it takes, 1.35-2x at 2048 and 4096 elements of
 *   each dtype, so it takes all it can (PROBE__SMALL_MAX_N).
 * - AVX-512, on a Zen 5 (2026-12-02, same method): the AVX2 short path
 *   (16-bit lanes for fp16/bf16) beats the AVX-512 one at every length from
 *   128 elements (1024 fp16: 276 against 390 ns; fp32 332 against 354) and
 *   the AVX-512 block path up to 3584 elements (4096 for bf16); small512
 *   keeps fp32 up to 3072, where it was as fast or faster on the
 *   trainer's tensors.
 * - AVX-512 on a Zen 4, which splits each 512-bit operation in two
 *   (2026-12-02): bench_stats --short has small2 faster than small512 for
 *   fp32 too (1024 N(0,1) elements: 381 against 577 ns), but in the
 *   trainer the two took the same share of the run (perf: 1.85% of samples
 *   on small512, 1.83-1.95% on small2 with its bin counting; thread CPU
 *   overhead +6.8..+8.4% against +8.8..+10.7%), so one table serves both. */
typedef struct stats_family {
  const char *name;
  int small_path[3]; /* by dtype: fp32, fp16, bf16 */
  int block_path;
  size_t small_max[3];
} stats_family;

#define SMALL3(p) {(p), (p), (p)}
static const stats_family families[3] = {
    {"portable", SMALL3(PROBE__PATH_PORTABLE), PROBE__PATH_PORTABLE, {0, 0, 0}},
    {"avx2", SMALL3(PROBE__PATH_SMALL2), PROBE__PATH_AVX2, {PROBE__SMALL_MAX_N, PROBE__SMALL_MAX_N, PROBE__SMALL_MAX_N}},
    {"avx512", {PROBE__PATH_SMALL512, PROBE__PATH_SMALL2, PROBE__PATH_SMALL2}, PROBE__PATH_AVX512, {3072, 3584, PROBE__SMALL_MAX_N}},
};
#undef SMALL3
enum { FAM_PORTABLE, FAM_AVX2, FAM_AVX512 };

static int widest_family(int at_most) {
  if (at_most >= FAM_AVX512 && probe__cpu_avx512()) return FAM_AVX512;
  if (at_most >= FAM_AVX2 && probe__cpu_avx2()) return FAM_AVX2;
  return FAM_PORTABLE;
}

/* The family of this process: -1 until the first call. Threads racing to set
 * it all compute and store the same value. */
static atomic_int the_family = -1;

int probe__stats_family_from_env(const char *v) {
  int at_most = FAM_AVX512;
  if (v && !strcmp(v, "portable"))
    at_most = FAM_PORTABLE;
  else if (v && !strcmp(v, "avx2"))
    at_most = FAM_AVX2;
  return widest_family(at_most);
}

static const stats_family *family(void) {
  int f = atomic_load_explicit(&the_family, memory_order_relaxed);
  if (f < 0) {
    f = probe__stats_family_from_env(getenv("AMPPROBE_STATS_PATH"));
    atomic_store_explicit(&the_family, f, memory_order_relaxed);
  }
  return &families[f];
}

int probe__stats_short_path(probe_dtype dt, size_t *max_n) {
  const stats_family *f = family();
  size_t dti = (size_t)dt < 3 ? (size_t)dt : 0;
  *max_n = f->small_max[dti];
  return f->small_path[dti];
}

const char *probe_stats_path(void) { return family()->name; }

int probe_stats_have_simd(void) { return family()->block_path != PROBE__PATH_PORTABLE; }

const char *probe__stats_path_name(int path) {
  return path >= 0 && path < PROBE__PATH_COUNT ? paths[path].name : NULL;
}

probe_status probe__stats_compute_path(probe_stats *out, probe_dtype dt,
                                       const void *data, size_t n, int path) {
  if (!out || probe_dtype_size(dt) == 0 || (n && !data))
    return PROBE_ERR_INVALID_ARG;
  if (path < 0 || path >= PROBE__PATH_COUNT) return PROBE_ERR_INVALID_ARG;
  const stats_path *p = &paths[path];
  if (!p->available() || n > p->max_n) return PROBE_ERR_UNSUPPORTED;
  /* fp16 values widen to normal binary32 (their subnormals are >= 2^-24):
   * no flush mode touches them, so their short calls skip the MXCSR read */
  unsigned fp = dt == PROBE_DTYPE_F16 ? 0 : probe__fp_exact_enter();
  probe__acc a;
  probe__acc_init(&a);
  p->acc(&a, dt, data, n);
  probe__acc_finish(&a, out);
  probe__fp_exact_leave(fp);
  return PROBE_OK;
}

probe_status probe_stats_compute(probe_stats *out, probe_dtype dt,
                                 const void *data, size_t n) {
  const stats_family *f = family();
  size_t dti = (size_t)dt < 3 ? (size_t)dt : 0; /* (a bad dtype fails below) */
  int path = n <= f->small_max[dti] ? f->small_path[dti] : f->block_path;
  return probe__stats_compute_path(out, dt, data, n, path);
}
