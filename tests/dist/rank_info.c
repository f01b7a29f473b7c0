/* tests/dist/rank_info.c - reads rank traces through the library's own
 * reader and prints what the multi-rank tests check, as one JSON array on
 * stdout (one object per file, in argument order):
 *
 *   {"path", "ok", "error"?, "rank", "world_size", "run_id",
 *    "config" (the stored config, a JSON string), "complete",
 *    "aborted" (the abort mark's reason, "" none), "aborted_step",
 *    "n_steps", "last_step", "n_records",
 *    "steps": [{"step", "loss", "skipped", "found_inf", "loss_scale",
 *               "digest" (hex string, or null when not measured)}],
 *    "sites": {"<site name>": {"records", "first_nonfinite_step",
 *                              "nonfinite_layers_at_first"}}}
 *
 * Every row of the steps and records tables is read, so "ok": true also
 * says the whole file reads back (a killed writer's file up to its last
 * flush). The file is opened with probe_trace_open_isolated, so a damaged
 * one is an error object, never a crash of this program.
 *
 * usage: rank_info TRACE...   exit 0 (even when a file is unreadable: the
 * caller decides), 2 on usage errors. A test aid, not installed. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/probe.h"

#define CHUNK 4096

/* JSON string with the escapes the paths and run ids of the tests need. */
static void put_str(const char *s) {
  putchar('"');
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      printf("\\%c", c);
    else if (c < 0x20)
      printf("\\u%04x", c);
    else
      putchar(c);
  }
  putchar('"');
}

static void put_num(double v) {
  if (isnan(v))
    fputs("\"nan\"", stdout);
  else if (isinf(v))
    fputs(v > 0 ? "\"inf\"" : "\"-inf\"", stdout);
  else
    printf("%.17g", v);
}

static int put_steps(probe_trace *t) {
  static probe_step_scalars buf[CHUNK];
  size_t got = 0;
  int first = 1;
  fputs("\"steps\": [", stdout);
  for (int64_t at = 0;; at += (int64_t)got) {
    if (probe_trace_read_steps(t, at, CHUNK, buf, &got) != PROBE_OK) {
      fputs("]", stdout);
      return -1;
    }
    if (got == 0)
      break;
    for (size_t i = 0; i < got; i++) {
      const probe_step_scalars *s = &buf[i];
      printf("%s{\"step\": %" PRId64 ", \"loss\": ", first ? "" : ", ",
             s->step);
      put_num(s->loss);
      printf(", \"skipped\": %d, \"found_inf\": %d, \"loss_scale\": ",
             (int)s->skipped, (int)s->found_inf);
      put_num(s->loss_scale);
      if (s->unmeasured & PROBE_SCALAR_WEIGHT_DIGEST)
        fputs(", \"digest\": null}", stdout);
      else
        printf(", \"digest\": \"%016" PRIx64 "\"}", s->weight_digest);
      first = 0;
    }
  }
  fputs("]", stdout);
  return 0;
}

typedef struct site_sum {
  int64_t records;
  int64_t first_bad; /* -1: none */
  uint8_t *bad_layers; /* n_layers flags at first_bad */
} site_sum;

static int scan_records(probe_trace *t, site_sum *sum, size_t n_layers) {
  static probe_record buf[CHUNK / 4];
  size_t got = 0;
  for (int64_t at = 0;; at += (int64_t)got) {
    if (probe_trace_read_records(t, at, CHUNK / 4, buf, &got) != PROBE_OK)
      return -1;
    if (got == 0)
      return 0;
    for (size_t i = 0; i < got; i++) {
      const probe_record *r = &buf[i];
      site_sum *s = &sum[r->site];
      uint64_t bad = r->stats.nan_count + r->stats.posinf_count +
                     r->stats.neginf_count;
      s->records++;
      if (!bad)
        continue;
      if (s->first_bad < 0 || r->step < s->first_bad) {
        s->first_bad = r->step;
        memset(s->bad_layers, 0, n_layers);
      }
      if (r->step == s->first_bad && (size_t)r->layer < n_layers)
        s->bad_layers[r->layer] = 1;
    }
  }
}

static int put_sites(probe_trace *t) {
  size_t n_layers = 0;
  const probe_layer_info *layers = probe_trace_layers(t, &n_layers);
  site_sum sum[PROBE_SITE_COUNT];
  int rc = 0;
  for (int s = 0; s < PROBE_SITE_COUNT; s++) {
    sum[s].records = 0;
    sum[s].first_bad = -1;
    sum[s].bad_layers = calloc(n_layers ? n_layers : 1, 1);
    if (!sum[s].bad_layers)
      rc = -1;
  }
  if (rc == 0)
    rc = scan_records(t, sum, n_layers);
  if (rc == 0) {
    fputs("\"sites\": {", stdout);
    int first = 1;
    for (int s = 0; s < PROBE_SITE_COUNT; s++) {
      if (!sum[s].records)
        continue;
      printf("%s", first ? "" : ", ");
      put_str(probe_site_name((probe_site)s));
      printf(": {\"records\": %" PRId64 ", \"first_nonfinite_step\": %" PRId64
             ", \"nonfinite_layers_at_first\": [",
             sum[s].records, sum[s].first_bad);
      int f2 = 1;
      for (size_t l = 0; l < n_layers; l++)
        if (sum[s].bad_layers[l]) {
          fputs(f2 ? "" : ", ", stdout);
          put_str(layers[l].name);
          f2 = 0;
        }
      fputs("]}", stdout);
      first = 0;
    }
    fputs("}", stdout);
  }
  for (int s = 0; s < PROBE_SITE_COUNT; s++)
    free(sum[s].bad_layers);
  return rc;
}

static void put_file(const char *path) {
  probe_trace *t = NULL;
  char err[512] = "";
  fputs("{\"path\": ", stdout);
  put_str(path);
  if (probe_trace_open_isolated(&t, path, err, sizeof err) != PROBE_OK) {
    fputs(", \"ok\": false, \"error\": ", stdout);
    put_str(err);
    fputs("}", stdout);
    return;
  }
  const probe_trace_info *in = probe_trace_get_info(t);
  printf(", \"rank\": %d, \"world_size\": %d, \"run_id\": ", (int)in->rank,
         (int)in->world_size);
  put_str(in->run_id);
  fputs(", \"config\": ", stdout);
  put_str(in->config_json);
  fputs(", \"aborted\": ", stdout);
  put_str(in->aborted);
  printf(", \"aborted_step\": %" PRId64, in->aborted_step);
  printf(", \"complete\": %d, \"n_steps\": %" PRId64 ", \"last_step\": %" PRId64
         ", \"n_records\": %" PRId64 ", ",
         in->complete, in->n_steps, in->last_step, in->n_records);
  int rc = put_steps(t);
  if (rc == 0) {
    fputs(", ", stdout);
    rc = put_sites(t);
  }
  if (rc != 0) {
    fputs(", \"ok\": false, \"error\": ", stdout);
    put_str(probe_trace_last_error(t));
  } else {
    fputs(", \"ok\": true", stdout);
  }
  fputs("}", stdout);
  probe_trace_close(t);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs("usage: rank_info TRACE...\n", stderr);
    return 2;
  }
  fputs("[", stdout);
  for (int i = 1; i < argc; i++) {
    if (i > 1)
      fputs(",\n", stdout);
    put_file(argv[i]);
  }
  fputs("]\n", stdout);
  return 0;
}
