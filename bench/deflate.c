/*
 * bench/deflate.c - the writer's chunk encoder (libprobe/deflate.c)
 * against zlib and libdeflate, on the same chunks.
 *
 * Usage: bench_deflate TRACE.h5 [--reps N]
 *
 * The chunks are those the writer encodes: the /records (128 rows of 648
 * bytes) and /steps (256 rows of 80 bytes) rows of a real trace, cut into
 * chunk-sized pieces and shuffled as HDF5's shuffle filter does
 * (probe__shuffle). Each encoder compresses every shuffled chunk into a
 * zlib stream (what the deflate filter stores); every stream is inflated
 * with zlib and compared with its input before anything is timed. Times
 * are CPU time of this thread, the best of --reps passes over all chunks;
 * sizes are the stream bytes per row. "time x size" is ns/row x bytes/row,
 * lower is better: the writer pays the time on its thread, the file pays
 * the size. The CPU name is printed with the results.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zlib.h>
#ifdef AMPPROBE_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

#include "ampprobe/probe.h"
#include "deflate.h"

typedef struct chunkset {
  const char *name;
  size_t elem, rows, n; /* bytes per row, rows per chunk, chunks */
  uint8_t *shuffled;    /* n chunks of rows * elem bytes */
} chunkset;

typedef size_t (*encode_fn)(void *ctx, const uint8_t *src, size_t n,
                            uint8_t *dst, size_t cap);

static size_t enc_ours(void *ctx, const uint8_t *src, size_t n, uint8_t *dst,
                       size_t cap) {
  (void)ctx;
  (void)cap;
  return probe__deflate(src, n, dst);
}

static size_t enc_zlib(void *ctx, const uint8_t *src, size_t n, uint8_t *dst,
                       size_t cap) {
  uLongf len = (uLongf)cap;
  int level = *(int *)ctx;
  return compress2(dst, &len, src, (uLong)n, level) == Z_OK ? (size_t)len : 0;
}

#ifdef AMPPROBE_HAVE_LIBDEFLATE
static size_t enc_libdeflate(void *ctx, const uint8_t *src, size_t n,
                             uint8_t *dst, size_t cap) {
  return libdeflate_zlib_compress((struct libdeflate_compressor *)ctx, src, n,
                                  dst, cap);
}
#endif

static double cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

static void cpu_name(char *buf, size_t len) {
  snprintf(buf, len, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "model name", 10) == 0) {
      char *p = strchr(line, ':');
      if (p) {
        p += 2;
        p[strcspn(p, "\n")] = '\0';
        snprintf(buf, len, "%s", p);
      }
      break;
    }
  fclose(f);
}

/* Cuts rows (n_rows of elem bytes) into full chunks of `rows` rows, each
 * shuffled. */
static void chunks_make(chunkset *c, const uint8_t *data, size_t n_rows) {
  c->n = n_rows / c->rows;
  size_t bytes = c->rows * c->elem;
  c->shuffled = malloc(c->n * bytes + 1);
  for (size_t k = 0; k < c->n; k++)
    probe__shuffle(c->shuffled + k * bytes, data + k * bytes, c->rows,
                   c->elem);
}

typedef struct result {
  double ns_row, bytes_row;
} result;

static int run_one(const chunkset *c, encode_fn fn, void *ctx, int reps,
                   result *r) {
  size_t bytes = c->rows * c->elem;
  size_t cap = compressBound((uLong)bytes) + probe__deflate_bound(bytes);
  uint8_t *dst = malloc(cap), *back = malloc(bytes);
  size_t total = 0;
  /* correctness first: every stream inflates to its chunk */
  for (size_t k = 0; k < c->n; k++) {
    const uint8_t *src = c->shuffled + k * bytes;
    size_t len = fn(ctx, src, bytes, dst, cap);
    uLongf blen = (uLongf)bytes;
    if (len == 0 || uncompress(back, &blen, dst, (uLong)len) != Z_OK ||
        blen != bytes || memcmp(back, src, bytes) != 0) {
      free(dst);
      free(back);
      return -1;
    }
    total += len;
  }
  double best = 1e300;
  for (int rep = 0; rep < reps; rep++) {
    double t0 = cpu_ns();
    size_t sink = 0;
    for (size_t k = 0; k < c->n; k++)
      sink += fn(ctx, c->shuffled + k * bytes, bytes, dst, cap);
    double t = cpu_ns() - t0;
    if (sink != total) {
      free(dst);
      free(back);
      return -1;
    }
    if (t < best) best = t;
  }
  r->ns_row = best / (double)(c->n * c->rows);
  r->bytes_row = (double)total / (double)(c->n * c->rows);
  free(dst);
  free(back);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_deflate TRACE.h5 [--reps N]\n");
    return 2;
  }
  int reps = 7;
  if (argc >= 4 && strcmp(argv[2], "--reps") == 0) reps = atoi(argv[3]);
  probe_trace *t;
  if (probe_trace_open(&t, argv[1]) != PROBE_OK) {
    fprintf(stderr, "bench_deflate: %s\n", probe_trace_last_error(NULL));
    return 1;
  }
  const probe_trace_info *in = probe_trace_get_info(t);
  size_t nr = (size_t)in->n_records, ns = (size_t)in->n_steps;
  probe_record *rec = malloc(nr * sizeof *rec + 1);
  probe_step_scalars *stp = malloc(ns * sizeof *stp + 1);
  size_t got = 0, at = 0;
  while (at < nr && probe_trace_read_records(t, (int64_t)at, nr - at,
                                             rec + at, &got) == PROBE_OK &&
         got)
    at += got;
  nr = at;
  at = 0;
  while (at < ns && probe_trace_read_steps(t, (int64_t)at, ns - at, stp + at,
                                           &got) == PROBE_OK &&
         got)
    at += got;
  ns = at;
  probe_trace_close(t);

  chunkset sets[2] = {{"records", sizeof(probe_record), 128, 0, NULL},
                      {"steps", sizeof(probe_step_scalars), 256, 0, NULL}};
  chunks_make(&sets[0], (const uint8_t *)rec, nr);
  chunks_make(&sets[1], (const uint8_t *)stp, ns);

  char cpu[256];
  cpu_name(cpu, sizeof cpu);
  time_t now = time(NULL);
  char date[32];
  strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
  printf("bench_deflate: %s, %s, trace %s, best of %d, CPU time of one "
         "thread\n",
         date, cpu, argv[1], reps);
  printf("zlib %s", zlibVersion());
#ifdef AMPPROBE_HAVE_LIBDEFLATE
  printf(", libdeflate %s\n", LIBDEFLATE_VERSION_STRING);
#else
  printf(", libdeflate not built in\n");
#endif

  typedef struct enc {
    const char *name;
    encode_fn fn;
    void *ctx;
  } enc;
  enc encs[8];
  int ne = 0;
  static int z1 = 1, z6 = 6;
  encs[ne++] = (enc){"ours (libprobe/deflate.c)", enc_ours, NULL};
  encs[ne++] = (enc){"zlib level 1", enc_zlib, &z1};
  encs[ne++] = (enc){"zlib level 6", enc_zlib, &z6};
#ifdef AMPPROBE_HAVE_LIBDEFLATE
  static const int lv[] = {1, 2, 4, 6};
  static char names[4][32];
  for (int i = 0; i < 4; i++) {
    snprintf(names[i], sizeof names[i], "libdeflate level %d", lv[i]);
    encs[ne++] = (enc){names[i], enc_libdeflate,
                       libdeflate_alloc_compressor(lv[i])};
  }
#endif
  int rc = 0;
  for (int s = 0; s < 2; s++) {
    const chunkset *c = &sets[s];
    printf("\n/%s: %zu chunks of %zu rows x %zu bytes (%zu rows)\n", c->name,
           c->n, c->rows, c->elem, c->n * c->rows);
    printf("| encoder | ns/row | bytes/row | time x size | vs ours |\n");
    printf("| --- | ---: | ---: | ---: | ---: |\n");
    double base = 0;
    for (int e = 0; e < ne; e++) {
      result r;
      if (c->n == 0) break;
      if (run_one(c, encs[e].fn, encs[e].ctx, reps, &r) != 0) {
        printf("| %s | FAILED (stream does not inflate to its chunk) |\n",
               encs[e].name);
        rc = 1;
        continue;
      }
      double prod = r.ns_row * r.bytes_row;
      if (e == 0) base = prod;
      printf("| %s | %.1f | %.2f | %.0f | %.2fx |\n", encs[e].name, r.ns_row,
             r.bytes_row, prod, prod / base);
    }
  }
#ifdef AMPPROBE_HAVE_LIBDEFLATE
  for (int e = 3; e < ne; e++) libdeflate_free_compressor(encs[e].ctx);
#endif
  free(rec);
  free(stp);
  free(sets[0].shuffled);
  free(sets[1].shuffled);
  return rc;
}
