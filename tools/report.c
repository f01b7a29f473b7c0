/*
 * tools/report.c - `ampprobe report TRACE [--baseline FP32_TRACE]
 * [--bisect RESULT.json] -o report.html`: one self-contained HTML page with
 * the post-mortem diagnosis, the training curves, the per-layer heatmaps,
 * and, when given, the comparison with the baseline and the bisect trials.
 *
 * Reuses the engines of the other subcommands: the diagnosis is
 * probe_diag_run + probe_diag_print_text (tools/diagnose.h), the baseline
 * comparison probe_diff_run (tools/diffcore.h), the bisect part is the JSON
 * that `ampprobe bisect --json` / `-o` writes. This file only reads the
 * traces in chunks and feeds the report builder (reports/, report.h), so its
 * memory is bounded by the plot sizes and the layer count.
 *
 * Exit: 0 report written and the run healthy, 1 written and a problem
 * diagnosed, 2 usage, 3 unreadable or corrupt input, 4 cannot write.
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "ampprobe/report.h"
#include "cli.h"
#include "diagnose.h"
#include "diffcore.h"

static const char *SUB = "report";

#define CHUNK 4096
#define DIFF_TABLE_ROWS 40 /* rows of the diff table, earliest first */

static void usage(FILE *f) {
  fprintf(f,
          "usage: ampprobe report TRACE [--baseline FP32_TRACE] "
          "[--bisect RESULT.json]\n"
          "                       -o report.html [--width PX] "
          "[--heat-cols N] [--title TEXT] [-q]\n"
          "       ampprobe report DIR | 'GLOB' | TRACE... [--rank R] "
          "-o report.html [...]\n"
          "\n"
          "Writes one self-contained HTML file (inline SVG and CSS, nothing "
          "loaded from\nelsewhere) that shows, top to bottom: the post-mortem "
          "diagnosis; the loss\nagainst step (the baseline overlaid); the "
          "loss scale on a log axis with\nskipped steps and backoffs; the "
          "gradient norm with the clip threshold and\nthe clip coefficient; "
          "layers x steps heatmaps of FP16 headroom\nlog2(65504/absmax) and "
          "of the fraction of gradient values subnormal or\nflushed to zero "
          "in FP16; with --baseline the diff table and the step where\nthe "
          "loss curves part; with --bisect the trials and the minimal set.\n"
          "Over a trace set (the rank files of one job: a directory, a glob "
          "or several\nfiles) the page starts with a ranks x steps view "
          "(healthy, skipped, inf/NaN;\nthe first inf/NaN ringed, the rank "
          "that stopped first and missing ranks\nmarked) and a ranks table; "
          "the panels below are those of one rank.\n"
          "See docs/report.md for how to read each plot.\n"
          "\n"
          "options:\n"
          "  -o, --output FILE     the HTML file to write (required)\n"
          "  --baseline TRACE      FP32 baseline of the same config and seed\n"
          "  --bisect FILE         result JSON of 'ampprobe bisect --json'\n"
          "  --rank R              a set: the rank whose panels are drawn "
          "(default: the\n"
          "                        rank of the first inf/NaN, else the one "
          "that stopped\n"
          "                        first, else the first readable)\n"
          "  --width PX            plot width in pixels (600..4000, default "
          "1200)\n"
          "  --heat-cols N         step columns of the heatmaps (10..2000, "
          "default 400)\n"
          "  --title TEXT          page title (default: 'ampprobe report: "
          "TRACE')\n"
          "  -q, --quiet           no summary line on stderr\n"
          "  -h, --help            this help\n"
          "\n"
          "exit: 0 written, run healthy; 1 written, problem diagnosed (over "
          "a set also:\n      a rank missing, unreadable or stopped first); 2 "
          "usage (also: a set\n      mixing two jobs' run ids); 3 unreadable "
          "or corrupt input; 4 cannot\n      write the output\n"
          "\n"
          "example:\n"
          "  ampprobe run --scenario revin-overflow --trace -o fp16.h5\n"
          "  ampprobe run --scenario revin-overflow --precision fp32 --trace "
          "-o fp32.h5\n"
          "  ampprobe report fp16.h5 --baseline fp32.h5 -o report.html\n"
          "  mpirun -np 4 ampprobe run --scenario rank-bad-input --trace -o "
          "out/t.h5\n"
          "  ampprobe report out/ -o ranks.html\n");
}

/* First step of the steps table, or -1 when it is empty. */
static probe_status first_step(probe_trace *t, int64_t *out) {
  probe_step_scalars s;
  size_t got = 0;
  *out = -1;
  probe_status st = probe_trace_read_steps(t, 0, 1, &s, &got);
  if (st == PROBE_OK && got == 1) *out = s.step;
  return st;
}

/* Step range of a trace's steps table (and of its records when the steps
 * table is empty: flight-recorder traces always have steps). */
static probe_status trace_range(probe_trace *t, int64_t *lo, int64_t *hi) {
  const probe_trace_info *in = probe_trace_get_info(t);
  probe_status st = first_step(t, lo);
  *hi = in->last_step;
  if (st == PROBE_OK && *lo < 0 && in->n_records > 0) {
    probe_record r;
    size_t got = 0;
    st = probe_trace_read_records(t, 0, 1, &r, &got);
    if (st == PROBE_OK && got) *lo = r.step;
  }
  return st;
}

static probe_status feed_trace(probe_report *rep, probe_trace *t,
                               int baseline) {
  probe_status st = PROBE_OK;
  size_t got;
  probe_step_scalars *steps = malloc(CHUNK * sizeof *steps);
  probe_record *recs = malloc(CHUNK * sizeof *recs);
  probe_scaler_event *evs = malloc(CHUNK * sizeof *evs);
  if (!steps || !recs || !evs) st = PROBE_ERR_NOMEM;
  for (int64_t at = 0; st == PROBE_OK; at += (int64_t)got) {
    st = probe_trace_read_steps(t, at, CHUNK, steps, &got);
    if (st != PROBE_OK || got == 0) break;
    st = baseline ? probe_report_add_baseline_steps(rep, steps, got)
                  : probe_report_add_steps(rep, steps, got);
  }
  if (!baseline) {
    for (int64_t at = 0; st == PROBE_OK; at += (int64_t)got) {
      st = probe_trace_read_scaler_events(t, at, CHUNK, evs, &got);
      if (st != PROBE_OK || got == 0) break;
      st = probe_report_add_scaler_events(rep, evs, got);
    }
    for (int64_t at = 0; st == PROBE_OK; at += (int64_t)got) {
      st = probe_trace_read_records(t, at, CHUNK, recs, &got);
      if (st != PROBE_OK || got == 0) break;
      st = probe_report_add_records(rep, recs, got);
    }
  }
  free(steps);
  free(recs);
  free(evs);
  return st;
}

/* A one-line text of the analysis engines, which quote names from the trace
 * already escaped (probe_text_escape). A guard for the page: any control
 * byte left is written as \xHH; printable text, backslashes included, is
 * untouched, so escaped text is never escaped twice. */
#define ESC_MAX (PROBE_DIAG_TEXT_MAX * 8 + 16)
static const char *esc(char *buf, const char *s) {
  size_t k = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (k + 5 >= ESC_MAX) break;
    if (*p < 0x20 || *p == 0x7f)
      k += (size_t)snprintf(buf + k, ESC_MAX - k, "\\x%02x", *p);
    else
      buf[k++] = (char)*p;
  }
  buf[k] = '\0';
  return buf;
}

/* The diagnosis engine's findings, ranked, shown first; its whole text
 * (what `ampprobe postmortem` prints) folded under them. */
/* set_head/set_body: a trace set's headline and summary (NULL for one
 * trace); the diagnosis is then that of the rank whose panels follow. */
static probe_status add_diagnosis(probe_report *rep, const probe_diag *d,
                                  const char *set_head, const char *set_body,
                                  int set_problem, const char *rank_label) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return PROBE_ERR_NOMEM;
  probe_diag_print_text(d, f);
  fclose(f);
  int problem = probe_diag_problem(d) || set_problem;
  char head[ESC_MAX + 32], e1[ESC_MAX];
  if (set_head)
    snprintf(head, sizeof head, "%s: %s", problem ? "PROBLEM" : "HEALTHY",
             esc(e1, set_head));
  else if (d->n_findings > 0)
    snprintf(head, sizeof head, "%s: %s", problem ? "PROBLEM" : "HEALTHY",
             esc(e1, d->findings[0].title));
  else
    snprintf(head, sizeof head, "%s", problem ? "PROBLEM" : "HEALTHY");

  probe_buf b;
  probe_buf_init(&b);
  if (set_body) {
    probe_buf_puts(&b, set_body);
    probe_buf_printf(&b, "\n%s, whose panels follow:\n", rank_label);
  }
  if (d->event != DIAG_EVENT_NONE) {
    probe_buf_printf(&b, "first non-finite event: step %lld, %s, %s",
                     (long long)d->event_step,
                     probe_phase_name(d->event_phase),
                     diag_event_name(d->event));
    if (d->origin_layer >= 0)
      probe_buf_printf(&b, ", origin %s (%s)",
                       esc(e1, diag_layer_name(d, d->origin_layer)),
                       probe_site_name(d->origin_site));
    probe_buf_puts(&b, "\n\n");
  }
  for (int i = 0; i < d->n_findings; i++) {
    const diag_finding *g = &d->findings[i];
    probe_buf_printf(&b, "%d. [%s] %s\n", i + 1, diag_finding_name(g->id),
                     esc(e1, g->title));
    for (int k = 0; k < g->n_evidence; k++)
      probe_buf_printf(&b, "   - %s\n", esc(e1, g->evidence[k]));
    if (g->next_step[0])
      probe_buf_printf(&b, "   next: %s\n", esc(e1, g->next_step));
  }
  probe_status st =
      b.oom ? PROBE_ERR_NOMEM
            : probe_report_set_diagnosis(
                  rep, problem ? PROBE_REPORT_PROBLEM : PROBE_REPORT_HEALTHY,
                  head, b.len ? b.data : text);
  if (st == PROBE_OK && b.len)
    st = probe_report_add_folded_text(
        rep, PROBE_REPORT_TOP,
        "Full post-mortem (what 'ampprobe postmortem' prints)", text);
  probe_buf_free(&b);
  free(text);
  return st;
}

static void fmt_num(char *b, size_t n, double x) { probe_num_format(b, n, x, 4); }

static void fmt_step(char *b, size_t n, int64_t s) {
  if (s < 0) snprintf(b, n, "-");
  else snprintf(b, n, "%lld", (long long)s);
}

/* The diff engine's verdict, loss comparison and its table. */
static probe_status add_diff(probe_report *rep, const probe_diff *d) {
  char text[8192];
  char a[32], b[32], e1[ESC_MAX];
  int n = snprintf(text, sizeof text, "%s\n", esc(e1, d->verdict_text));
  if (d->loss_part_step >= 0) {
    fmt_num(a, sizeof a, d->loss_a_at_part);
    fmt_num(b, sizeof b, d->loss_b_at_part);
    n += snprintf(text + n, sizeof text - (size_t)n,
                  "loss curves part at step %lld (run %s, baseline %s)\n",
                  (long long)d->loss_part_step, a, b);
  } else {
    n += snprintf(text + n, sizeof text - (size_t)n,
                  "loss curves agree within %.3g over %lld common steps\n",
                  d->opt.threshold, (long long)d->loss_steps);
  }
  if (d->intro.found && n < (int)sizeof text)
    n += snprintf(text + n, sizeof text - (size_t)n,
                  "error introduced at step %lld in %s (%s)%s\n",
                  (long long)d->intro.step, esc(e1, d->intro.layer),
                  probe_site_name((probe_site)d->intro.site),
                  d->intro.local ? ", inputs in agreement" : "");
  for (int i = 0; i < d->n_notes && n < (int)sizeof text; i++)
    n += snprintf(text + n, sizeof text - (size_t)n, "note: %s\n",
                  esc(e1, d->notes[i]));
  probe_status st = probe_report_add_text(rep, PROBE_REPORT_DIFF,
                                          "Verdict", text);
  if (st != PROBE_OK) return st;
  if (d->loss_part_step >= 0) probe_report_set_part_step(rep, d->loss_part_step);

  const char *hdr[9] = {"layer",         "site",
                        "first diverging step", "max rel absmax",
                        "max rel RMS",   "max rel L2",
                        "local / carried steps", "first non-finite (run / baseline)",
                        "flushes to zero"};
  int tid;
  char title[96];
  snprintf(title, sizeof title,
           "Per layer and site, sorted by where divergence begins "
           "(threshold %.3g)", d->opt.threshold);
  st = probe_report_add_table(rep, PROBE_REPORT_DIFF, title, 9, hdr, &tid);
  for (size_t i = 0; st == PROBE_OK && i < d->n_entries && i < DIFF_TABLE_ROWS;
       i++) {
    const probe_diff_entry *e = &d->entries[i];
    char c2[24], c3[24], c4[24], c5[24], c6[48], c7[64], na[24], nb[24];
    fmt_step(c2, sizeof c2, e->first_div_step);
    fmt_num(c3, sizeof c3, e->max_rel_absmax);
    fmt_num(c4, sizeof c4, e->max_rel_rms);
    fmt_num(c5, sizeof c5, e->max_rel_l2);
    snprintf(c6, sizeof c6, "%lld / %lld", (long long)e->local_steps,
             (long long)e->carried_steps);
    fmt_step(na, sizeof na, e->first_nonfinite_a);
    fmt_step(nb, sizeof nb, e->first_nonfinite_b);
    snprintf(c7, sizeof c7, "%s / %s", na, nb);
    const char *row[9] = {esc(e1, e->layer),
                          probe_site_name((probe_site)e->site),
                          c2, c3, c4, c5, c6, c7,
                          e->flushes_to_zero ? "yes" : ""};
    st = probe_report_table_row(rep, tid, row);
  }
  if (st == PROBE_OK && d->n_entries > DIFF_TABLE_ROWS) {
    char more[96];
    snprintf(more, sizeof more,
             "%zu more (layer, site) pairs not shown; 'ampprobe diff' lists "
             "them all.", d->n_entries - DIFF_TABLE_ROWS);
    st = probe_report_add_text(rep, PROBE_REPORT_DIFF, "", more);
  }
  return st;
}

/* A JSON value as table cell text: strings as they are, arrays joined with
 * ",", numbers and booleans printed, objects compact. */
static char *json_cell(json_t *v) {
  if (json_is_string(v)) return strdup(json_string_value(v));
  if (json_is_array(v)) {
    size_t cap = 256, len = 0, i;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = '\0';
    json_t *x;
    json_array_foreach(v, i, x) {
      char *c = json_cell(x);
      if (!c) continue;
      size_t need = len + strlen(c) + 2;
      if (need > cap) {
        while (cap < need) cap *= 2;
        char *p = realloc(s, cap);
        if (!p) { free(c); break; }
        s = p;
      }
      len += (size_t)sprintf(s + len, "%s%s", i ? "," : "", c);
      free(c);
    }
    if (len == 0) {
      free(s);
      return strdup("(none)");
    }
    return s;
  }
  if (json_is_null(v)) return strdup("");
  if (json_is_real(v)) { /* 4 significant digits read better in a table */
    char b[32];
    snprintf(b, sizeof b, "%.4g", json_real_value(v));
    return strdup(b);
  }
  return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

/* Checks that a JSON document is what `ampprobe bisect --json` / `-o`
 * writes: an object with "outcome" and a "trials" array of objects, each
 * with a "role" and a "verdict". Returns NULL or what is wrong. */
static const char *bisect_shape_error(json_t *root) {
  if (!json_is_object(root)) return "top level is not an object";
  json_t *cmd = json_object_get(root, "command");
  if (cmd && !(json_is_string(cmd) && !strcmp(json_string_value(cmd), "bisect")))
    return "its \"command\" is not \"bisect\"";
  if (!json_is_string(json_object_get(root, "outcome")))
    return "no \"outcome\" string";
  json_t *trials = json_object_get(root, "trials");
  if (!json_is_array(trials)) return "no \"trials\" array";
  size_t i;
  json_t *t;
  json_array_foreach(trials, i, t) {
    if (!json_is_object(t) || !json_is_string(json_object_get(t, "role")) ||
        !json_is_string(json_object_get(t, "verdict")))
      return "a trial without \"role\" and \"verdict\"";
  }
  return NULL;
}

static const char *jstr(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A list member (array of strings, or a string) as "a,b,c"; "" when absent
 * or empty. Caller frees. */
static char *jlist(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return strdup("");
  return json_cell(v);
}

/* The bisect result drawn the way `ampprobe bisect` prints it: the header
 * with the failure criteria, the trial table (#, trial, forced to FP32,
 * verdict, steps, time, why) and the result lines. Members it does not know
 * are kept in the folded raw JSON under it. */
static probe_status add_bisect(probe_report *rep, json_t *root) {
  probe_buf t;
  probe_buf_init(&t);
  const char *name = jstr(root, "scenario");
  char *cand = jlist(root, "candidates");
  const char *gran = jstr(root, "granularity");
  probe_buf_printf(&t, "ampprobe bisect: %s, candidates %s (granularity %s)\n",
                   name ? name : "?", cand && *cand ? cand : "?",
                   gran ? gran : "?");
  free(cand);
  json_t *cr = json_object_get(root, "criteria");
  const char *ctext = json_is_object(cr) ? jstr(cr, "text") : NULL;
  if (ctext) { /* the command's own wording, as it prints it */
    probe_buf_printf(&t, "  a trial fails on: %s\n", ctext);
  } else if (json_is_object(cr)) {
    int any = 0;
    probe_buf_puts(&t, "  a trial fails on:");
    json_t *v;
    if (json_is_true(json_object_get(cr, "fail_nonfinite")))
      probe_buf_printf(&t, "%s non-finite loss", any++ ? ";" : "");
    if (json_is_integer(v = json_object_get(cr, "max_consecutive_skips")))
      probe_buf_printf(&t, "%s > %lld consecutive skipped steps",
                       any++ ? ";" : "", (long long)json_integer_value(v));
    if (json_is_number(v = json_object_get(cr, "min_scale")))
      probe_buf_printf(&t, "%s loss scale < %g", any++ ? ";" : "",
                       json_number_value(v));
    if (json_is_number(v = json_object_get(cr, "max_loss_regress_pct")))
      probe_buf_printf(&t, "%s final loss > %g%% above the FP32 baseline",
                       any++ ? ";" : "", json_number_value(v));
    const char *key;
    json_object_foreach(cr, key, v) { /* criteria added later, as given */
      if (!strcmp(key, "fail_nonfinite") ||
          !strcmp(key, "max_consecutive_skips") || !strcmp(key, "min_scale") ||
          !strcmp(key, "max_loss_regress_pct") || json_is_null(v) ||
          json_is_false(v))
        continue;
      char *c = json_cell(v);
      probe_buf_printf(&t, "%s %s %s", any++ ? ";" : "", key, c ? c : "");
      free(c);
    }
    if (!any) probe_buf_puts(&t, " nothing (every criterion is off)");
    probe_buf_puts(&t, "\n");
  }
  char *unmatched = jlist(root, "unmatched_candidates");
  if (unmatched && *unmatched)
    probe_buf_printf(&t, "  warning: %s matched no layer\n", unmatched);
  free(unmatched);
  probe_status st = t.oom ? PROBE_ERR_NOMEM
                          : probe_report_add_text(rep, PROBE_REPORT_BISECT, "",
                                                  t.data);
  probe_buf_free(&t);

  static const char *hdr[7] = {"#",       "trial", "forced to FP32", "verdict",
                               "steps",   "time",  "why"};
  int tid = -1;
  if (st == PROBE_OK)
    st = probe_report_add_table(rep, PROBE_REPORT_BISECT, "Trials", 7, hdr,
                                &tid);
  json_t *trials = json_object_get(root, "trials");
  size_t i;
  json_t *x;
  json_array_foreach(trials, i, x) {
    if (st != PROBE_OK) break;
    char id[24], verdict[16], steps[48] = "-", tm[32] = "-";
    json_t *v = json_object_get(x, "id");
    snprintf(id, sizeof id, "%02lld",
             json_is_integer(v) ? (long long)json_integer_value(v)
                                : (long long)i);
    const char *role = jstr(x, "role");
    snprintf(verdict, sizeof verdict, "%s", jstr(x, "verdict"));
    if (!strcmp(verdict, "cancelled")) snprintf(verdict, sizeof verdict, "-");
    for (char *p = verdict; *p; p++)
      if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
    json_t *sr = json_object_get(x, "steps_run");
    json_t *sp = json_object_get(x, "steps_planned");
    if (json_is_integer(sr) && json_is_integer(sp))
      snprintf(steps, sizeof steps, "%lld/%lld",
               (long long)json_integer_value(sr),
               (long long)json_integer_value(sp));
    if (json_is_number(v = json_object_get(x, "seconds")))
      snprintf(tm, sizeof tm, "%.2fs", json_number_value(v));
    char *set = NULL;
    if (!strcmp(role, "fp32-baseline") ||
        json_is_null(json_object_get(x, "fp32")))
      set = strdup("(all: --precision fp32)");
    else {
      set = jlist(x, "fp32");
      if (set && (!*set || !strcmp(set, "(none)"))) {
        free(set);
        set = strdup("(nothing)");
      }
    }
    const char *why = jstr(x, "why");
    const char *row[7] = {id, role, set ? set : "", verdict, steps, tm,
                          why ? why : ""};
    st = probe_report_table_row(rep, tid, row);
    free(set);
  }

  probe_buf r;
  probe_buf_init(&r);
  const char *summary = jstr(root, "summary");
  probe_buf_printf(&r, "result: %s\n", summary ? summary : jstr(root, "outcome"));
  static const char *const lines[][2] = {
      {"minimal_set", "minimal set"},
      {"minimal_layers", "minimal layers"},
      {"implicated_layers", "implicated"},
      {"suggested_candidates", "suggested"},
      {"postmortem_finding", "post-mortem"},
      {"hint", "hint"},
      {"reproduce", "reproduce"},
  };
  for (size_t k = 0; k < sizeof lines / sizeof lines[0]; k++) {
    char *c = jlist(root, lines[k][0]);
    if (c && *c)
      probe_buf_printf(&r, "  %-15s %s%s\n", lines[k][1], c,
                       k == 0 && strchr(c, ',')
                           ? "  (1-minimal: dropping any one of them fails)"
                           : "");
    free(c);
  }
  json_t *ran = json_object_get(root, "trials_run");
  if (json_is_integer(ran)) {
    json_t *dd = json_object_get(root, "ddmin_trials");
    json_t *ca = json_object_get(root, "trials_cancelled");
    json_t *wall = json_object_get(root, "wall_seconds");
    json_t *jobs = json_object_get(root, "jobs");
    probe_buf_printf(&r, "  %-15s %lld run (%lld in ddmin), %lld cancelled, "
                         "%.2f s wall with -j %lld\n",
                     "trials", (long long)json_integer_value(ran),
                     (long long)json_integer_value(dd),
                     (long long)json_integer_value(ca),
                     json_is_number(wall) ? json_number_value(wall) : 0.0,
                     (long long)json_integer_value(jobs));
  }
  const char *wd = jstr(root, "workdir");
  if (wd)
    probe_buf_printf(&r, "  %-15s %s (trace, summary and log of every trial)\n",
                     "workdir", wd);
  if (st == PROBE_OK)
    st = r.oom ? PROBE_ERR_NOMEM
               : probe_report_add_text(rep, PROBE_REPORT_BISECT, "Result",
                                       r.data);
  probe_buf_free(&r);

  char *raw = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  if (st == PROBE_OK && raw)
    st = probe_report_add_folded_text(rep, PROBE_REPORT_BISECT,
                                      "The whole bisect result (JSON)", raw);
  free(raw);
  return st;
}

/* ---- do the inputs belong together? ---------------------------------------- */

/* The config stored in a trace, parsed; NULL when there is none. */
static json_t *trace_config(probe_trace *t) {
  const probe_trace_info *in = probe_trace_get_info(t);
  if (!in->config_json || !in->config_json[0]) return NULL;
  json_t *c = json_loads(in->config_json, 0, NULL);
  if (c && !json_is_object(c)) {
    json_decref(c);
    c = NULL;
  }
  return c;
}

/* Keys of the config a precision baseline may change. */
static int precision_key(const char *k) {
  return !strcmp(k, "precision") || !strcmp(k, "fp32") ||
         !strcmp(k, "loss_fp32");
}

/* Compares the trace's config with the baseline's and the bisect result's
 * scenario: a baseline of another model, data or seed, or a bisect of
 * another config, makes the page compare things that do not belong
 * together. Each mismatch is a warning on stderr and on the page. */
static probe_status check_configs(probe_report *rep, probe_trace *t,
                                  const char *path, probe_trace *tb,
                                  const char *base_path, json_t *bisect,
                                  const char *bisect_path) {
  json_t *ca = trace_config(t);
  const char *name = ca ? jstr(ca, "name") : NULL;
  probe_buf w;
  probe_buf_init(&w);
  char qn[200], qo[200];
  cli_escape_name(qn, sizeof qn, name ? name : "");
  if (tb && ca) {
    json_t *cb = trace_config(tb);
    const char *bname = cb ? jstr(cb, "name") : NULL;
    if (cb && name && bname && strcmp(name, bname) != 0) {
      cli_escape_name(qo, sizeof qo, bname);
      probe_buf_printf(&w, "the baseline %s is a run of config '%s', the "
                           "trace %s of '%s': the comparison is not a "
                           "precision baseline\n",
                       base_path, qo, path, qn);
    } else if (cb) {
      probe_buf diffk;
      probe_buf_init(&diffk);
      const char *k;
      json_t *va;
      json_object_foreach(ca, k, va) {
        if (precision_key(k) || !strcmp(k, "description")) continue;
        json_t *vb = json_object_get(cb, k);
        if (!vb || !json_equal(va, vb))
          probe_buf_printf(&diffk, "%s%s", diffk.len ? ", " : "", k);
      }
      json_object_foreach(cb, k, va)
        if (!precision_key(k) && strcmp(k, "description") &&
            !json_object_get(ca, k))
          probe_buf_printf(&diffk, "%s%s", diffk.len ? ", " : "", k);
      if (diffk.len)
        probe_buf_printf(&w, "the baseline %s and the trace %s are of config "
                             "'%s' but differ in more than precision (%s)\n",
                         base_path, path, qn, diffk.data);
      probe_buf_free(&diffk);
    }
    json_decref(cb);
  }
  const char *bname = bisect ? jstr(bisect, "scenario") : NULL;
  if (bname && name && strcmp(bname, name) != 0) {
    cli_escape_name(qo, sizeof qo, bname);
    probe_buf_printf(&w, "the bisect result %s is of config '%s', the trace "
                         "%s of '%s'\n",
                     bisect_path, qo, path, qn);
  }
  json_decref(ca);
  probe_status st = PROBE_OK;
  if (w.len) {
    char *line = w.data, *nl;
    while ((nl = strchr(line, '\n'))) { /* one stderr line per warning */
      *nl = '\0';
      cli_error(SUB, "warning: %s", line);
      *nl = '\n';
      line = nl + 1;
    }
    st = probe_report_add_text(rep, PROBE_REPORT_TOP,
                               "Warning: these inputs do not belong together",
                               w.data);
  }
  if (w.oom) st = PROBE_ERR_NOMEM;
  probe_buf_free(&w);
  return st;
}

static void add_trace_meta(probe_report *rep, const char *label,
                           const char *path, probe_trace *t) {
  const probe_trace_info *in = probe_trace_get_info(t);
  char v[512];
  snprintf(v, sizeof v, "%s (%s, %s; %lld steps, %lld layers, %lld layer "
                        "records)",
           path, in->complete ? "complete" : "incomplete: writer did not close it",
           in->record_mode == PROBE_MODE_FULL ? "full trace" : "flight recorder",
           (long long)in->n_steps, (long long)in->n_layers,
           (long long)in->n_records);
  probe_report_add_meta(rep, label, v);
  if (in->precision_policy && in->precision_policy[0]) {
    snprintf(v, sizeof v, "%s precision", label);
    probe_report_add_meta(rep, v, in->precision_policy);
  }
  if (in->created && in->created[0]) {
    snprintf(v, sizeof v, "%s created", label);
    probe_report_add_meta(rep, v, in->created);
  }
  if (in->command_line && in->command_line[0]) {
    snprintf(v, sizeof v, "%s command", label);
    probe_report_add_meta(rep, v, in->command_line);
  }
}

static int open_trace(const char *path, probe_trace **t) {
  char err[512] = "";
  probe_status st = probe_trace_open_isolated(t, path, err, sizeof err);
  if (st < 0) {
    size_t n = strlen(path);
    if (err[0] && strncmp(err, path, n) == 0 && err[n] == ':')
      cli_error(SUB, "%s", err); /* the message already names the file */
    else
      cli_error(SUB, "%s: %s", path, err[0] ? err : probe_status_str(st));
    return cli_exit_for_status(st);
  }
  return CLI_EXIT_OK;
}

/* ---- a trace set: the ranks of one job --------------------------------------- */

#define SET_MAP_COLS 500    /* step columns of the ranks x steps view */
#define SET_TABLE_ROWS 64   /* rows of the ranks table at most */
#define SET_NOTE_MAX 200
#define NF_BITS_MAX (INT64_C(1) << 30) /* steps counted exactly, at most */

typedef struct set_file {
  const char *path;
  int ok;              /* validated by the isolated reader */
  char err[300];
  int32_t rank, world; /* -1, 0: a trace without rank attributes */
  int rank_from_name;  /* rank read from the file name (unreadable file) */
  char run_id[80];
  int complete;
  int64_t first, last, n_steps;
  int64_t writer_nf;   /* the writer's first non-finite step, -1 none */
  int row;
  /* from the scan */
  int64_t nf_step, nf_steps, skipped;
  int nf_phase;
  uint32_t nf_seq;
  int32_t nf_layer, nf_site; /* -1: the loss or gradient norm */
  char nf_layer_name[PROBE_NAME_MAX];
  char note[SET_NOTE_MAX];
} set_file;

typedef struct trace_set {
  set_file *f;
  size_t n;
  int world;           /* rows 0..world-1 are ranks */
  int rows;
  int first;           /* file of the job's first inf/NaN, -1 none */
  int64_t min_last, max_last; /* over readable files */
  int n_missing, n_unreadable, n_nonfinite, n_stopped, n_dup;
  int64_t x0, x1;
} trace_set;

static void info_ranks(const probe_trace_info *in, set_file *f) {
  f->rank = in->rank;
  f->world = in->world_size;
  snprintf(f->run_id, sizeof f->run_id, "%s", in->run_id ? in->run_id : "");
}

/* The rank a file name says, by the naming rule's default form
 * "NAME.rankR.h5" (for a file that cannot be read); -1 when none. */
static int32_t rank_from_name(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  const char *p = NULL;
  for (const char *q = strstr(base, ".rank"); q; q = strstr(q + 1, ".rank"))
    p = q;
  if (!p || !isdigit((unsigned char)p[5])) return -1;
  char *end;
  long r = strtol(p + 5, &end, 10);
  if (r < 0 || r >= PROBE_RANKMAP_MAX_ROWS || (*end && strcmp(end, ".h5")))
    return -1;
  return (int32_t)r;
}

/* First pass over one file: validated by the isolated reader (a crash or
 * hang inside HDF5 becomes "corrupt"), its attributes and step range. */
static void set_probe_file(set_file *f) {
  probe_trace *t = NULL;
  f->rank = -1;
  f->first = f->last = f->writer_nf = f->nf_step = -1;
  f->nf_layer = f->nf_site = -1;
  f->row = -1;
  probe_status st = probe_trace_open_isolated(&t, f->path, f->err,
                                              sizeof f->err);
  if (st < 0) {
    if (!f->err[0]) snprintf(f->err, sizeof f->err, "%s", probe_status_str(st));
    f->rank = rank_from_name(f->path);
    f->rank_from_name = f->rank >= 0;
    return;
  }
  const probe_trace_info *in = probe_trace_get_info(t);
  info_ranks(in, f);
  f->complete = in->complete;
  f->n_steps = in->n_steps;
  f->writer_nf = in->first_nonfinite_step;
  if (trace_range(t, &f->first, &f->last) != PROBE_OK) {
    snprintf(f->err, sizeof f->err, "%s", probe_trace_last_error(t));
  } else {
    f->ok = 1;
  }
  probe_trace_close(t);
}

/* Run ids must agree: traces of two jobs are not one set. */
static int set_check_run_ids(const trace_set *s) {
  const set_file *a = NULL;
  for (size_t i = 0; i < s->n; i++) {
    const set_file *f = &s->f[i];
    if (!f->ok || !f->run_id[0]) continue;
    if (!a) {
      a = f;
    } else if (strcmp(a->run_id, f->run_id) != 0) {
      char ea[200], eb[200];
      cli_escape_name(ea, sizeof ea, a->run_id);
      cli_escape_name(eb, sizeof eb, f->run_id);
      cli_error(SUB, "the set mixes the traces of two jobs: %s has run id "
                     "'%s', %s '%s'; give the traces of one job",
                a->path, ea, f->path, eb);
      return CLI_EXIT_USAGE;
    }
  }
  return CLI_EXIT_OK;
}

static void add_note(set_file *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void add_note(set_file *f, const char *fmt, ...) {
  size_t o = strlen(f->note);
  if (o && o + 2 < sizeof f->note) {
    memcpy(f->note + o, "; ", 3);
    o += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->note + o, sizeof f->note - o, fmt, ap);
  va_end(ap);
}

/* Rows: rank r on row r for r < world (the largest world size or rank + 1
 * seen); files without a rank (or a second file of a rank) after them. */
static int set_assign_rows(trace_set *s) {
  int world = 0;
  for (size_t i = 0; i < s->n; i++) {
    const set_file *f = &s->f[i];
    if (f->ok && f->world > world && f->world <= PROBE_RANKMAP_MAX_ROWS)
      world = f->world;
    if (f->rank >= 0 && f->rank + 1 > world) world = f->rank + 1;
  }
  if (world > PROBE_RANKMAP_MAX_ROWS) world = PROBE_RANKMAP_MAX_ROWS;
  s->world = world;
  int extra = world;
  for (size_t i = 0; i < s->n; i++) { /* readable files take their rank first */
    set_file *f = &s->f[i];
    if (!f->ok || f->rank < 0 || f->rank >= world) continue;
    int taken = 0;
    for (size_t j = 0; j < i; j++)
      if (s->f[j].ok && s->f[j].row == f->rank) taken = 1;
    if (taken) {
      add_note(f, "a second trace of rank %d", (int)f->rank);
      s->n_dup++;
    } else {
      f->row = f->rank;
    }
  }
  for (size_t i = 0; i < s->n; i++) { /* then unreadable ones named by rank */
    set_file *f = &s->f[i];
    if (f->ok || f->rank < 0 || f->rank >= world) continue;
    int taken = 0;
    for (size_t j = 0; j < s->n; j++)
      if (j != i && s->f[j].row == f->rank) taken = 1;
    if (!taken) f->row = f->rank;
  }
  for (size_t i = 0; i < s->n; i++)
    if (s->f[i].row < 0) s->f[i].row = extra++;
  if (extra > PROBE_RANKMAP_MAX_ROWS) {
    cli_error(SUB, "the set has %d ranks and files; at most %d are shown",
              extra, PROBE_RANKMAP_MAX_ROWS);
    return CLI_EXIT_USAGE;
  }
  s->rows = extra > 0 ? extra : 1;
  return CLI_EXIT_OK;
}

/* Whether (step, phase, seq) a comes before b. */
static int nf_before(int64_t sa, int pa, uint32_t qa, const set_file *b) {
  if (b->nf_step < 0) return 1;
  if (sa != b->nf_step) return sa < b->nf_step;
  if (pa != b->nf_phase) return pa < b->nf_phase;
  return qa < b->nf_seq;
}

/* Row index where the records of `step` begin (records are in step order):
 * a binary search over single-row reads. */
static probe_status records_from(probe_trace *t, int64_t step, int64_t *row) {
  int64_t lo = 0, hi = probe_trace_get_info(t)->n_records;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    probe_record r;
    size_t got = 0;
    probe_status st = probe_trace_read_records(t, mid, 1, &r, &got);
    if (st != PROBE_OK) return st;
    if (got == 0 || r.step >= step) hi = mid;
    else lo = mid + 1;
  }
  *row = lo;
  return PROBE_OK;
}

/* One bit per step of a file (over its step range). */
typedef struct step_bits {
  unsigned char *bit;
  int64_t first, n;
} step_bits;

static void bits_init(step_bits *b, const set_file *f) {
  b->bit = NULL;
  b->first = f->first;
  b->n = f->last - f->first + 1;
  if (f->first >= 0 && b->n > 0 && b->n <= NF_BITS_MAX)
    b->bit = calloc((size_t)(b->n + 7) / 8, 1);
}

/* Sets the bit of step; returns 1 when it was clear. */
static int bits_set(step_bits *b, int64_t step) {
  int64_t k = step - b->first;
  if (!b->bit || k < 0 || k >= b->n) return 0;
  unsigned char m = (unsigned char)(1u << (k & 7));
  if (b->bit[k >> 3] & m) return 0;
  b->bit[k >> 3] |= m;
  return 1;
}

static int bits_get(const step_bits *b, int64_t step) {
  int64_t k = step - b->first;
  return b->bit && k >= 0 && k < b->n && (b->bit[k >> 3] >> (k & 7)) & 1;
}

/* A non-finite value of the file at (step, phase, seq): a candidate for
 * the first one of the job. */
static void nf_seen(set_file *f, int64_t step, int phase, uint32_t seq,
                    int32_t layer, int32_t site, const char *layer_name) {
  if (!nf_before(step, phase, seq, f)) return;
  f->nf_step = step;
  f->nf_phase = phase;
  f->nf_seq = seq;
  f->nf_layer = layer;
  f->nf_site = site;
  snprintf(f->nf_layer_name, sizeof f->nf_layer_name, "%s",
           layer_name ? layer_name : "");
}

/* A step's cell from its scalars. Gradients that overflowed in a step the
 * loss scaler skipped are dynamic loss scaling at work: such a step is
 * "skipped", not "inf/NaN" (a non-finite loss always is). */
static void scan_steps_chunk(set_file *f, probe_rankmap *m, step_bits *nf,
                             step_bits *skip, step_bits *seen,
                             const probe_step_scalars *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const probe_step_scalars *p = &s[i];
    bits_set(seen, p->step);
    int loss_bad = !(p->unmeasured & PROBE_SCALAR_LOSS) && !isfinite(p->loss);
    int norm_bad = !(p->unmeasured & PROBE_SCALAR_GRAD_NORM) &&
                   !isfinite(p->grad_norm) && !p->skipped;
    probe_rank_cell c = loss_bad || norm_bad ? PROBE_RANK_CELL_NONFINITE
                        : p->skipped         ? PROBE_RANK_CELL_SKIPPED
                                             : PROBE_RANK_CELL_HEALTHY;
    probe_rankmap_add(m, f->row, p->step, c);
    if (p->skipped) {
      f->skipped++;
      bits_set(skip, p->step);
    }
    if (c != PROBE_RANK_CELL_NONFINITE) continue;
    f->nf_steps += bits_set(nf, p->step);
    nf_seen(f, p->step, loss_bad ? PROBE_PHASE_FORWARD : PROBE_PHASE_BACKWARD,
            UINT32_MAX, -1, -1, NULL);
  }
}

/* The legend's (rank, step) counts: each step once, in its final state. */
static void count_states(probe_rankmap *m, const step_bits *nf,
                         const step_bits *skip, const step_bits *seen) {
  int64_t n[4] = {0, 0, 0, 0};
  for (int64_t k = 0; seen->bit && k < seen->n; k++) {
    int64_t step = seen->first + k;
    if (bits_get(nf, step)) n[PROBE_RANK_CELL_NONFINITE]++;
    else if (bits_get(seen, step))
      n[bits_get(skip, step) ? PROBE_RANK_CELL_SKIPPED
                             : PROBE_RANK_CELL_HEALTHY]++;
  }
  for (int c = 1; c < 4; c++) probe_rankmap_count_add(m, (probe_rank_cell)c, n[c]);
}

/* Second pass over a readable file: its steps (every row) and its records
 * from the writer's first non-finite step on (before it every record was
 * finite, docs/trace-format.md), into the map. */
static probe_status set_scan_file(set_file *f, probe_rankmap *m) {
  probe_trace *t = NULL;
  probe_status st = probe_trace_open(&t, f->path);
  if (st < 0) return st;
  probe_step_scalars *steps = malloc(CHUNK * sizeof *steps);
  probe_record *recs = malloc(CHUNK * sizeof *recs);
  if (!steps || !recs) st = PROBE_ERR_NOMEM;
  step_bits nf, skip, seen;
  bits_init(&nf, f);
  bits_init(&skip, f);
  bits_init(&seen, f);
  size_t got = 0;
  for (int64_t at = 0; st == PROBE_OK; at += (int64_t)got) {
    st = probe_trace_read_steps(t, at, CHUNK, steps, &got);
    if (st != PROBE_OK || got == 0) break;
    scan_steps_chunk(f, m, &nf, &skip, &seen, steps, got);
  }
  int64_t from = 0;
  size_t n_layers = 0;
  const probe_layer_info *layers = probe_trace_layers(t, &n_layers);
  if (st == PROBE_OK && f->writer_nf >= 0) st = records_from(t, f->writer_nf, &from);
  for (int64_t at = from; st == PROBE_OK && f->writer_nf >= 0; at += (int64_t)got) {
    st = probe_trace_read_records(t, at, CHUNK, recs, &got);
    if (st != PROBE_OK || got == 0) break;
    for (size_t i = 0; i < got; i++) {
      const probe_record *r = &recs[i];
      if (probe_stats_nonfinite(&r->stats) == 0) continue;
      int ph = (int)probe_site_phase((probe_site)r->site);
      if (ph == PROBE_PHASE_BACKWARD && bits_get(&skip, r->step)) {
        probe_rankmap_add(m, f->row, r->step, PROBE_RANK_CELL_SKIPPED);
        continue; /* caught by the loss scaler */
      }
      probe_rankmap_add(m, f->row, r->step, PROBE_RANK_CELL_NONFINITE);
      f->nf_steps += bits_set(&nf, r->step);
      nf_seen(f, r->step, ph, r->seq, r->layer, r->site,
              r->layer >= 0 && (size_t)r->layer < n_layers
                  ? layers[r->layer].name
                  : "?");
    }
  }
  if (st < 0)
    snprintf(f->err, sizeof f->err, "%s", probe_trace_last_error(t));
  else
    count_states(m, &nf, &skip, &seen);
  free(seen.bit);
  free(nf.bit);
  free(skip.bit);
  free(steps);
  free(recs);
  probe_trace_close(t);
  return st;
}

/* Where a file's first inf/NaN is, as one line. */
static void nf_where(const set_file *f, char *buf, size_t n) {
  char ln[PROBE_NAME_MAX * 4];
  if (f->nf_site >= 0) {
    cli_escape_name(ln, sizeof ln, f->nf_layer_name);
    snprintf(buf, n, "step %lld, %s of %s", (long long)f->nf_step,
             probe_site_name((probe_site)f->nf_site), ln);
  } else {
    snprintf(buf, n, "step %lld, %s", (long long)f->nf_step,
             f->nf_phase == PROBE_PHASE_FORWARD ? "the loss"
                                                : "the gradient norm");
  }
}

static const char *row_label(const set_file *f, char *buf, size_t n) {
  if (f->rank >= 0 && f->row == f->rank)
    snprintf(buf, n, "rank %d", (int)f->rank);
  else if (f->rank >= 0)
    snprintf(buf, n, "rank %d (2nd)", (int)f->rank);
  else
    snprintf(buf, n, "file %d", f->row);
  return buf;
}

/* The rows of the map and their notes: missing ranks, unreadable files,
 * incomplete traces, the rank(s) that stopped first, the first inf/NaN. */
static probe_status set_fill_rows(trace_set *s, probe_rankmap *m) {
  probe_status st = PROBE_OK;
  char lab[64];
  for (int r = 0; r < s->world && st == PROBE_OK; r++) {
    int has = 0;
    for (size_t i = 0; i < s->n; i++) has |= s->f[i].row == r;
    if (has) continue;
    snprintf(lab, sizeof lab, "rank %d", r);
    st = probe_rankmap_set_row(m, r, lab, PROBE_RANK_ROW_MISSING, NULL);
    if (st == PROBE_OK) st = probe_rankmap_note(m, r, "missing: no trace file");
    s->n_missing++;
  }
  for (size_t i = 0; i < s->n && st == PROBE_OK; i++) {
    set_file *f = &s->f[i];
    row_label(f, lab, sizeof lab);
    st = probe_rankmap_set_row(m, f->row, lab,
                               f->ok ? PROBE_RANK_ROW_TRACE
                                     : PROBE_RANK_ROW_UNREADABLE,
                               f->path);
    if (!f->ok) {
      add_note(f, "unreadable: %.150s", f->err);
      s->n_unreadable++;
    } else {
      if (!f->complete) add_note(f, "incomplete (writer did not close it)");
      if (f->n_steps > 0 && f->last < s->max_last && f->last == s->min_last) {
        add_note(f, "stopped first: last step %lld of %lld",
                 (long long)f->last, (long long)s->max_last);
        probe_rankmap_mark_stop(m, f->row);
        s->n_stopped++;
      }
      if (f->nf_step >= 0) s->n_nonfinite++;
    }
    if (s->first == (int)i) {
      char w[PROBE_NAME_MAX * 4 + 64];
      nf_where(f, w, sizeof w);
      add_note(f, "first inf/NaN: %s", w);
      probe_rankmap_mark_first(m, f->row, f->nf_step);
    }
    if (st == PROBE_OK && f->note[0]) st = probe_rankmap_note(m, f->row, f->note);
  }
  return st;
}

/* Opens, checks and scans every file of the set, fills the map. */
static int set_build(trace_set *s, int heat_cols, probe_rankmap **map) {
  *map = NULL;
  int any = 0;
  for (size_t i = 0; i < s->n; i++) {
    set_probe_file(&s->f[i]);
    any |= s->f[i].ok;
  }
  if (!any) {
    cli_error(SUB, "no readable trace in the set: %s: %s", s->f[0].path,
              s->f[0].err);
    return CLI_EXIT_INPUT;
  }
  int rc = set_check_run_ids(s);
  if (rc == CLI_EXIT_OK) rc = set_assign_rows(s);
  if (rc != CLI_EXIT_OK) return rc;
  s->x0 = INT64_MAX;
  s->x1 = -1;
  s->min_last = INT64_MAX;
  s->max_last = -1;
  for (size_t i = 0; i < s->n; i++) {
    const set_file *f = &s->f[i];
    if (!f->ok) continue;
    if (f->first >= 0 && f->first < s->x0) s->x0 = f->first;
    if (f->last > s->x1) s->x1 = f->last;
    if (f->last < s->min_last) s->min_last = f->last;
    if (f->last > s->max_last) s->max_last = f->last;
  }
  if (s->x1 < 0 || s->x0 > s->x1) s->x0 = s->x1 = 0;
  int cols = heat_cols > SET_MAP_COLS ? heat_cols : SET_MAP_COLS;
  probe_status st = probe_rankmap_new(map, s->rows, cols, s->x0, s->x1);
  s->first = -1;
  for (size_t i = 0; i < s->n && st == PROBE_OK; i++) {
    set_file *f = &s->f[i];
    if (!f->ok) continue;
    if (set_scan_file(f, *map) < 0) {
      f->ok = 0; /* changed or broke since the first pass */
      continue;
    }
    if (f->nf_step >= 0 &&
        (s->first < 0 ||
         nf_before(f->nf_step, f->nf_phase, f->nf_seq, &s->f[s->first])))
      s->first = (int)i;
  }
  if (st == PROBE_OK) st = set_fill_rows(s, *map);
  if (st != PROBE_OK) {
    cli_error(SUB, "%s", probe_status_str(st));
    return CLI_EXIT_INTERNAL;
  }
  return CLI_EXIT_OK;
}

/* The file whose panels are drawn: --rank R, else the first inf/NaN's
 * rank, else one that stopped first, else the first readable one. */
static int set_choose(const trace_set *s, int64_t want, const char **why) {
  if (want >= 0) {
    for (size_t i = 0; i < s->n; i++)
      if (s->f[i].ok && s->f[i].rank == want && s->f[i].row == want) {
        *why = "chosen with --rank";
        return (int)i;
      }
    return -1;
  }
  if (s->first >= 0) {
    *why = "the rank of the job's first inf/NaN";
    return s->first;
  }
  for (size_t i = 0; i < s->n; i++)
    if (s->f[i].ok && s->f[i].note[0] && strstr(s->f[i].note, "stopped first")) {
      *why = "the rank that stopped first";
      return (int)i;
    }
  for (size_t i = 0; i < s->n; i++)
    if (s->f[i].ok) {
      *why = "no rank stands out: the first readable trace";
      return (int)i;
    }
  return -1;
}

/* The set's headline and summary lines, and whether it shows a problem. */
static int set_summary(const trace_set *s, char *head, size_t hn,
                       probe_buf *b) {
  int readable = 0;
  for (size_t i = 0; i < s->n; i++) readable += s->f[i].ok;
  probe_buf_printf(b, "trace set: %zu file%s, %d readable; %d rank%s%s; "
                      "steps %lld-%lld\n",
                   s->n, s->n == 1 ? "" : "s", readable, s->world,
                   s->world == 1 ? "" : "s",
                   s->world ? "" : " (the traces carry no rank)",
                   (long long)s->x0, (long long)s->x1);
  char w[PROBE_NAME_MAX * 4 + 64], lab[64];
  int problem = 0;
  head[0] = '\0';
  if (s->first >= 0) {
    const set_file *f = &s->f[s->first];
    nf_where(f, w, sizeof w);
    probe_buf_printf(b, "first inf/NaN of the job: %s, %s\n",
                     row_label(f, lab, sizeof lab), w);
    probe_buf_printf(b, "ranks that held inf/NaN at some step: %d of %zu "
                        "readable\n",
                     s->n_nonfinite, (size_t)readable);
    snprintf(head, hn, "first inf/NaN on %s at %s (%d rank%s held inf/NaN)",
             lab, w, s->n_nonfinite, s->n_nonfinite == 1 ? "" : "s");
    problem = 1;
  }
  for (size_t i = 0; i < s->n; i++) {
    const set_file *f = &s->f[i];
    if (f->ok && strstr(f->note, "stopped first")) {
      probe_buf_printf(b, "%s stopped first: last step %lld, the others "
                          "went on to %lld%s\n",
                       row_label(f, lab, sizeof lab), (long long)f->last,
                       (long long)s->max_last,
                       f->complete ? "" : " (its trace is incomplete)");
      if (!head[0])
        snprintf(head, hn, "%s stopped first, after step %lld", lab,
                 (long long)f->last);
      problem = 1;
    }
  }
  if (s->n_missing) {
    probe_buf_printf(b, "missing: %d rank%s of %d without a trace file\n",
                     s->n_missing, s->n_missing == 1 ? "" : "s", s->world);
    if (!head[0])
      snprintf(head, hn, "%d of %d ranks missing", s->n_missing, s->world);
    problem = 1;
  }
  if (s->n_unreadable) {
    probe_buf_printf(b, "unreadable: %d file%s (the others diagnosed)\n",
                     s->n_unreadable, s->n_unreadable == 1 ? "" : "s");
    if (!head[0])
      snprintf(head, hn, "%d unreadable trace file%s", s->n_unreadable,
               s->n_unreadable == 1 ? "" : "s");
    problem = 1;
  }
  if (s->n_dup) {
    probe_buf_printf(b, "%d rank%s with a second trace file (shown as extra "
                        "rows)\n",
                     s->n_dup, s->n_dup == 1 ? "" : "s");
    problem = 1;
  }
  if (!head[0])
    snprintf(head, hn, "%d rank%s, no inf/NaN, none stopped early",
             readable, readable == 1 ? "" : "s");
  return problem;
}

/* The ranks table: every rank up to SET_TABLE_ROWS, else only the ranks
 * with a note (the rest counted). */
static probe_status set_table(probe_report *rep, const trace_set *s,
                              int chosen) {
  static const char *hdr[8] = {"rank", "file", "steps", "complete",
                               "first inf/NaN", "steps with inf/NaN",
                               "skipped steps", "note"};
  int tid;
  probe_status st = probe_report_add_table(rep, PROBE_REPORT_RANKS,
                                           "Ranks", 8, hdr, &tid);
  int all = s->n <= SET_TABLE_ROWS, shown = 0, hidden = 0;
  for (int row = 0; row < s->rows && st == PROBE_OK; row++) {
    const set_file *f = NULL;
    for (size_t i = 0; i < s->n; i++)
      if (s->f[i].row == row) f = &s->f[i];
    int notable = !f || f->note[0] || f->nf_step >= 0 || f == &s->f[chosen];
    if ((!all && !notable) || shown >= SET_TABLE_ROWS) {
      hidden++;
      continue;
    }
    shown++;
    char lab[64], steps[64], nf[PROBE_NAME_MAX * 4 + 64], a[24], b[24];
    char fname[1200], note[SET_NOTE_MAX + 64];
    if (!f) {
      snprintf(lab, sizeof lab, "%d", row);
      const char *row_cells[8] = {lab, "(none)", "", "", "", "", "",
                                  "missing: no trace file"};
      st = probe_report_table_row(rep, tid, row_cells);
      continue;
    }
    row_label(f, lab, sizeof lab);
    cli_escape_name(fname, sizeof fname, f->path);
    if (f->ok) {
      snprintf(steps, sizeof steps, "%lld-%lld (%lld)", (long long)f->first,
               (long long)f->last, (long long)f->n_steps);
      if (f->nf_step >= 0) nf_where(f, nf, sizeof nf);
      else snprintf(nf, sizeof nf, "none");
      snprintf(a, sizeof a, "%lld", (long long)f->nf_steps);
      snprintf(b, sizeof b, "%lld", (long long)f->skipped);
    } else {
      steps[0] = nf[0] = a[0] = b[0] = '\0';
    }
    snprintf(note, sizeof note, "%s%s", f == &s->f[chosen] ? "(panels "
             "below) " : "", f->note);
    const char *cells[8] = {lab, fname, steps,
                            f->ok ? (f->complete ? "yes" : "no") : "",
                            nf, a, b, note};
    st = probe_report_table_row(rep, tid, cells);
  }
  if (st == PROBE_OK && hidden) {
    char more[128];
    snprintf(more, sizeof more, "%d more ranks: complete, no inf/NaN, "
             "nothing to note (not listed).", hidden);
    st = probe_report_add_text(rep, PROBE_REPORT_RANKS, "", more);
  }
  return st;
}

typedef struct report_args {
  const char *out, *base_path, *bisect_path, *title;
  int quiet;
  int64_t rank; /* --rank, -1 when not given */
  probe_report_options ro;
} report_args;

/* The bisect JSON, checked: a bad file is an input error found before any
 * trace is read. */
static int load_bisect(const char *bisect_path, json_t **out) {
  *out = NULL;
  if (!bisect_path) return CLI_EXIT_OK;
  json_error_t je;
  json_t *bisect = json_load_file(bisect_path, 0, &je);
  if (!bisect) {
    cli_error(SUB, "%s: not a bisect result (line %d: %s)", bisect_path,
              je.line, je.text);
    return CLI_EXIT_INPUT;
  }
  const char *why = bisect_shape_error(bisect);
  if (why) {
    cli_error(SUB, "%s: not a bisect result (%s)", bisect_path, why);
    json_decref(bisect);
    return CLI_EXIT_INPUT;
  }
  *out = bisect;
  return CLI_EXIT_OK;
}

/* A trace set's part of the page: the ranks x steps view, the ranks table,
 * the headline and summary. */
typedef struct set_view {
  trace_set *set;
  probe_rankmap *map; /* handed to the report */
  int chosen;
  const char *why;
  char head[PROBE_NAME_MAX * 4 + 256];
  probe_buf body;
  int problem;
} set_view;

static probe_status add_set_view(probe_report *rep, set_view *v) {
  static const char help[] =
      "One row per rank, one column per range of steps; a cell shows the "
      "worst of the rank's steps in it: black, a record, the loss or the "
      "gradient norm of this rank held inf/NaN; orange, the optimizer step "
      "was skipped (the loss scaler found inf/NaN, on this rank or, through "
      "the all-reduce, on another); green, healthy; white, no step recorded "
      "(the rank had stopped, or had not started). The red ring is the "
      "job's first inf/NaN by (step, phase, order); a red bar follows the "
      "last step of the rank that stopped first; grey rows are ranks "
      "without a trace file, purple rows files that cannot be read. The "
      "panels under the table are those of one rank.";
  char title[160];
  snprintf(title, sizeof title, "Ranks x steps: %d rank%s",
           v->set->world ? v->set->world : v->set->rows,
           (v->set->world ? v->set->world : v->set->rows) == 1 ? "" : "s");
  probe_status st = probe_report_set_rankmap(rep, v->map, title, help);
  if (st != PROBE_OK) return st;
  v->map = NULL; /* the report's now */
  return set_table(rep, v->set, v->chosen);
}

/* The page for one trace (path), or for the chosen rank of a set (v). */
static int report_write(const report_args *a, const char *path,
                        set_view *v, json_t *bisect, double t0) {
  probe_trace *t = NULL, *tb = NULL;
  probe_report *rep = NULL;
  probe_diag diag;
  probe_diff diff;
  int have_diag = 0, have_diff = 0;
  int rc = open_trace(path, &t);
  if (rc == CLI_EXIT_OK && a->base_path) rc = open_trace(a->base_path, &tb);
  if (rc != CLI_EXIT_OK) goto done;

  char deftitle[600], rank_label[96] = "";
  if (v) {
    const set_file *f = &v->set->f[v->chosen];
    char lab[64];
    snprintf(rank_label, sizeof rank_label, "%s (%s)",
             row_label(f, lab, sizeof lab), v->why);
    snprintf(deftitle, sizeof deftitle, "ampprobe report: %zu traces (%.500s%s)",
             v->set->n, v->set->f[0].path, v->set->n > 1 ? ", ..." : "");
  } else {
    snprintf(deftitle, sizeof deftitle, "ampprobe report: %s", path);
  }
  probe_report_options ro = a->ro;
  ro.title = a->title ? a->title : deftitle;
  probe_status st = probe_report_new(&rep, &ro);
  if (st != PROBE_OK) {
    cli_error(SUB, "%s", probe_status_str(st));
    rc = CLI_EXIT_INTERNAL;
    goto done;
  }
  if (v) st = add_set_view(rep, v);

  /* the diagnosis, from the post-mortem engine */
  diag_options dopt;
  diag_options_init(&dopt);
  if (st == PROBE_OK) st = probe_diag_run(&diag, t, path, &dopt);
  have_diag = 1;
  if (st == PROBE_OK)
    st = add_diagnosis(rep, &diag, v ? v->head : NULL,
                       v && v->body.len ? v->body.data : NULL,
                       v ? v->problem : 0, rank_label);
  /* the loss-scale plot's "scaling off" note: the post-mortem's answer */
  if (st == PROBE_OK) st = probe_report_set_scaling(rep, diag.scaling_on);

  /* layers and the step range (the union with the baseline's) */
  size_t n_layers = 0;
  const probe_layer_info *layers = probe_trace_layers(t, &n_layers);
  int64_t lo = -1, hi = -1, blo = -1, bhi = -1;
  if (st == PROBE_OK) st = probe_report_set_layers(rep, layers, n_layers);
  if (st == PROBE_OK) st = trace_range(t, &lo, &hi);
  if (st == PROBE_OK && tb) st = trace_range(tb, &blo, &bhi);
  if (st == PROBE_OK) {
    if (lo < 0 || (blo >= 0 && blo < lo)) lo = blo;
    if (bhi > hi) hi = bhi;
    if (lo < 0 || hi < lo) lo = hi = 0; /* empty trace: empty plots */
    st = probe_report_set_range(rep, lo, hi);
  }
  if (st == PROBE_OK)
    st = check_configs(rep, t, path, tb, a->base_path, bisect, a->bisect_path);
  char tlabel[128];
  snprintf(tlabel, sizeof tlabel, "%s%s", v ? "trace of " : "trace",
           v ? rank_label : "");
  add_trace_meta(rep, tlabel, path, t);
  if (tb) add_trace_meta(rep, "baseline", a->base_path, tb);

  if (st == PROBE_OK) st = feed_trace(rep, t, 0);
  if (st == PROBE_OK && tb) {
    const probe_trace_info *bi = probe_trace_get_info(tb);
    char label[160];
    if (bi->precision_policy && bi->precision_policy[0])
      snprintf(label, sizeof label, "baseline (%.120s)", bi->precision_policy);
    else
      snprintf(label, sizeof label, "baseline");
    probe_report_set_baseline_label(rep, label);
    st = feed_trace(rep, tb, 1);
    if (st == PROBE_OK) {
      probe_diff_options fo;
      probe_diff_options_init(&fo);
      st = probe_diff_run(&diff, t, tb, &fo);
      have_diff = 1;
      if (st == PROBE_OK) st = add_diff(rep, &diff);
    }
  }
  if (st < 0) {
    const char *e = probe_trace_last_error(t);
    const char *eb = tb ? probe_trace_last_error(tb) : NULL;
    if ((!e || !*e) && eb) e = eb;
    cli_error(SUB, "%s: %s%s%s", path, probe_status_str(st),
              e && *e ? ": " : "", e ? e : "");
    rc = st == PROBE_ERR_NOMEM ? CLI_EXIT_INTERNAL : CLI_EXIT_INPUT;
    goto done;
  }
  if (bisect && (st = add_bisect(rep, bisect)) != PROBE_OK) {
    cli_error(SUB, "%s: %s", a->bisect_path, probe_status_str(st));
    rc = CLI_EXIT_INTERNAL;
    goto done;
  }

  /* written to a temporary file renamed over `out` once complete */
  cli_out o;
  rc = cli_out_open(SUB, &o, a->out);
  if (rc != CLI_EXIT_OK) goto done;
  st = probe_report_write(rep, o.f);
  if (st != PROBE_OK) {
    if (st == PROBE_ERR_NOMEM) {
      cli_out_abort(&o);
      cli_error(SUB, "cannot write %s: %s", a->out, probe_status_str(st));
      rc = CLI_EXIT_INTERNAL;
    } else {
      rc = cli_out_fail(SUB, &o, EIO);
    }
    goto done;
  }
  rc = cli_out_commit(SUB, &o);
  if (rc != CLI_EXIT_OK) goto done;
  struct stat ost;
  double size = stat(a->out, &ost) == 0 ? (double)ost.st_size : 0;
  rc = probe_diag_problem(&diag) || (v && v->problem) ? CLI_EXIT_PROBLEM
                                                       : CLI_EXIT_OK;
  if (!a->quiet)
    fprintf(stderr, "ampprobe: report: wrote %s (%.1f KiB) in %.2f s\n",
            a->out, size / 1024.0, cli_now() - t0);

done:
  if (have_diff) probe_diff_free(&diff);
  if (have_diag) probe_diag_free(&diag);
  probe_report_free(rep);
  if (tb) probe_trace_close(tb);
  if (t) probe_trace_close(t);
  return rc;
}

/* One TRACE argument that names a file (or nothing): today's single-trace
 * report. A directory, a glob or several arguments: a trace set. */
static int is_single(char **args, int n) {
  if (n != 1) return 0;
  struct stat sb;
  if (stat(args[0], &sb) == 0) return !S_ISDIR(sb.st_mode);
  return !strpbrk(args[0], "*?[");
}

static int report_single(const report_args *a, const char *path, double t0) {
  /* the file rules (tools/cli.h): inputs are regular files, the output is
   * none of them, whatever the flags */
  const char *inputs[3] = {path, a->base_path, a->bisect_path};
  for (int i = 0; i < 3; i++) {
    int r = inputs[i] ? cli_check_input(SUB, inputs[i]) : 0;
    if (r) return r;
  }
  int rc = cli_check_output(SUB, a->out, inputs, 3);
  if (rc) return rc;
  if (a->rank >= 0) {
    cli_error(SUB, "--rank chooses among the ranks of a trace set (a "
                   "directory, a glob or several files), not one trace");
    return CLI_EXIT_USAGE;
  }
  json_t *bisect = NULL;
  rc = load_bisect(a->bisect_path, &bisect);
  if (rc == CLI_EXIT_OK) rc = report_write(a, path, NULL, bisect, t0);
  json_decref(bisect);
  return rc;
}

static int report_set(const report_args *a, char **args, int n_args,
                      double t0) {
  char **paths = NULL;
  size_t n = 0;
  probe_status st = probe_trace_set_expand((const char *const *)args,
                                           (size_t)n_args, &paths, &n);
  if (st != PROBE_OK) {
    const char *e = probe_trace_last_error(NULL);
    cli_error(SUB, "%s", e && *e ? e : probe_status_str(st));
    return cli_exit_for_status(st);
  }
  if (n == 0) {
    cli_error(SUB, "%s: no trace (*.h5) in the set", args[0]);
    probe_trace_set_free(paths, n);
    return CLI_EXIT_INPUT;
  }
  const char **inputs = calloc(n + 2, sizeof *inputs);
  trace_set set;
  memset(&set, 0, sizeof set);
  set.f = calloc(n, sizeof *set.f);
  set_view v;
  memset(&v, 0, sizeof v);
  probe_buf_init(&v.body);
  json_t *bisect = NULL;
  int rc = inputs && set.f ? CLI_EXIT_OK : CLI_EXIT_INTERNAL;
  for (size_t i = 0; rc == CLI_EXIT_OK && i < n; i++) {
    inputs[i] = paths[i];
    set.f[i].path = paths[i];
    rc = cli_check_input(SUB, paths[i]);
  }
  set.n = n;
  if (rc == CLI_EXIT_OK) {
    inputs[n] = a->base_path;
    inputs[n + 1] = a->bisect_path;
    for (size_t i = n; rc == CLI_EXIT_OK && i < n + 2; i++)
      rc = inputs[i] ? cli_check_input(SUB, inputs[i]) : 0;
  }
  if (rc == CLI_EXIT_OK) rc = cli_check_output(SUB, a->out, inputs, n + 2);
  if (rc == CLI_EXIT_OK) rc = load_bisect(a->bisect_path, &bisect);
  if (rc == CLI_EXIT_OK) rc = set_build(&set, a->ro.heat_cols, &v.map);
  if (rc == CLI_EXIT_OK) {
    v.set = &set;
    v.chosen = set_choose(&set, a->rank, &v.why);
    if (v.chosen < 0) {
      cli_error(SUB, "--rank %lld: no readable trace of that rank in the set",
                (long long)a->rank);
      rc = CLI_EXIT_USAGE;
    }
  }
  if (rc == CLI_EXIT_OK) {
    v.problem = set_summary(&set, v.head, sizeof v.head, &v.body);
    rc = report_write(a, set.f[v.chosen].path, &v, bisect, t0);
  }
  probe_rankmap_free(v.map);
  probe_buf_free(&v.body);
  json_decref(bisect);
  free(set.f);
  free(inputs);
  probe_trace_set_free(paths, n);
  return rc;
}

int cmd_report(int argc, char **argv) {
  static const struct option longs[] = {
      {"output", required_argument, NULL, 'o'},
      {"baseline", required_argument, NULL, 'b'},
      {"bisect", required_argument, NULL, 'B'},
      {"width", required_argument, NULL, 'w'},
      {"heat-cols", required_argument, NULL, 'c'},
      {"title", required_argument, NULL, 't'},
      {"rank", required_argument, NULL, 'r'},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  report_args a;
  memset(&a, 0, sizeof a);
  a.rank = -1;
  probe_report_options_init(&a.ro);
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":o:qh", longs, NULL)) != -1) {
    int64_t v;
    switch (c) {
    case 'o': a.out = optarg; break;
    case 'b': a.base_path = optarg; break;
    case 'B': a.bisect_path = optarg; break;
    case 't': a.title = optarg; break;
    case 'q': a.quiet = 1; break;
    case 'w':
      if (cli_parse_i64(SUB, "--width", optarg, 600, 4000, &v))
        return CLI_EXIT_USAGE;
      a.ro.width = (int)v;
      break;
    case 'c':
      if (cli_parse_i64(SUB, "--heat-cols", optarg, 10, 2000, &v))
        return CLI_EXIT_USAGE;
      a.ro.heat_cols = (int)v;
      break;
    case 'r':
      if (cli_parse_i64(SUB, "--rank", optarg, 0, PROBE_RANKMAP_MAX_ROWS - 1,
                        &v))
        return CLI_EXIT_USAGE;
      a.rank = v;
      break;
    case 'h': usage(stdout); return CLI_EXIT_OK;
    default: return cli_getopt_error(SUB, argv, c);
    }
  }
  if (optind >= argc) {
    cli_error(SUB, "missing TRACE argument (see 'ampprobe report --help')");
    return CLI_EXIT_USAGE;
  }
  if (!a.out) {
    cli_error(SUB, "missing -o report.html (see 'ampprobe report --help')");
    return CLI_EXIT_USAGE;
  }
  double t0 = cli_now();
  if (is_single(argv + optind, argc - optind))
    return report_single(&a, argv[optind], t0);
  return report_set(&a, argv + optind, argc - optind, t0);
}
