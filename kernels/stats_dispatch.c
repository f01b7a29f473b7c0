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

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

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

/* Whether a CPU of this vendor (the 12 bytes of CPUID leaf 0) and family
 * (base + extended, leaf 1) with AVX-512 runs each 512-bit operation as two
 * 256-bit halves: AMD family 19h (Zen 4; its AVX-512-less members, Zen 3,
 * never ask). Zen 5 (family 1Ah) and Intel's AVX-512 cores have full-width
 * units; a CPU not known here counts as full width. */
int probe__cpu_splits_512(const char vendor[12], unsigned family) {
  return !memcmp(vendor, "AuthenticAMD", 12) && family == 0x19;
}

static int cpu_avx512_split(void) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
  char vendor[12];
  memcpy(vendor, &b, 4);
  memcpy(vendor + 4, &d, 4);
  memcpy(vendor + 8, &c, 4);
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  unsigned family = (a >> 8) & 0xfu;
  if (family == 0xfu) family += (a >> 20) & 0xffu;
  return probe__cpu_splits_512(vendor, family);
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
 * - AVX-512 on a CPU that splits 512-bit operations in two (a Zen 4;
 *   2026-12-02, bench_stats --short, every --dist): small2 is faster than
 *   small512 for every dtype from 64-128 elements (1024 fp32: 381 against
 *   577 ns on N(0,1), 382-692 against 542-783 on the other data) and than
 *   the AVX-512 block path up to 4096 (fp32 1317 against 1713 ns), so it
 *   takes all three dtypes as far as it can. */
typedef struct stats_family {
  const char *name;
  int small_path[3]; /* by dtype: fp32, fp16, bf16 */
  int block_path;
  size_t small_max[3];
} stats_family;

#define SMALL3(p) {(p), (p), (p)}
static const stats_family families[4] = {
    {"portable", SMALL3(PROBE__PATH_PORTABLE), PROBE__PATH_PORTABLE, {0, 0, 0}},
    {"avx2", SMALL3(PROBE__PATH_SMALL2), PROBE__PATH_AVX2, {PROBE__SMALL_MAX_N, PROBE__SMALL_MAX_N, PROBE__SMALL_MAX_N}},
    {"avx512", {PROBE__PATH_SMALL512, PROBE__PATH_SMALL2, PROBE__PATH_SMALL2}, PROBE__PATH_AVX512, {3072, 3584, PROBE__SMALL_MAX_N}},
    /* the same family where 512-bit operations are split (a row of its own,
     * the same name: AMPPROBE_STATS_PATH and probe_stats_path know three) */
    {"avx512", SMALL3(PROBE__PATH_SMALL2), PROBE__PATH_AVX512, {PROBE__SMALL_MAX_N, PROBE__SMALL_MAX_N, PROBE__SMALL_MAX_N}},
};
#undef SMALL3
enum { FAM_PORTABLE, FAM_AVX2, FAM_AVX512, ROW_AVX512_SPLIT };

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

/* The row of families[] a family runs on this CPU. */
static int family_row(int fam) {
  return fam == FAM_AVX512 && cpu_avx512_split() ? ROW_AVX512_SPLIT : fam;
}

static const stats_family *family(void) {
  int f = atomic_load_explicit(&the_family, memory_order_relaxed);
  if (f < 0) {
    f = family_row(probe__stats_family_from_env(getenv("AMPPROBE_STATS_PATH")));
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
  probe__acc a;
  probe__acc_init(&a);
  p->acc(&a, dt, data, n);
  probe__acc_finish(&a, out);
  return PROBE_OK;
}

probe_status probe_stats_compute(probe_stats *out, probe_dtype dt,
                                 const void *data, size_t n) {
  const stats_family *f = family();
  size_t dti = (size_t)dt < 3 ? (size_t)dt : 0; /* (a bad dtype fails below) */
  int path = n <= f->small_max[dti] ? f->small_path[dti] : f->block_path;
  return probe__stats_compute_path(out, dt, data, n, path);
}
