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
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
          "See docs/report.md for how to read each plot.\n"
          "\n"
          "options:\n"
          "  -o, --output FILE     the HTML file to write (required)\n"
          "  --baseline TRACE      FP32 baseline of the same config and seed\n"
          "  --bisect FILE         result JSON of 'ampprobe bisect --json'\n"
          "  --width PX            plot width in pixels (600..4000, default "
          "1200)\n"
          "  --heat-cols N         step columns of the heatmaps (10..2000, "
          "default 400)\n"
          "  --title TEXT          page title (default: 'ampprobe report: "
          "TRACE')\n"
          "  -q, --quiet           no summary line on stderr\n"
          "  -h, --help            this help\n"
          "\n"
          "exit: 0 written, run healthy; 1 written, problem diagnosed; 2 "
          "usage;\n      3 unreadable or corrupt input; 4 cannot write the "
          "output\n"
          "\n"
          "example:\n"
          "  ampprobe run --scenario revin-overflow --trace -o fp16.h5\n"
          "  ampprobe run --scenario revin-overflow --precision fp32 --trace "
          "-o fp32.h5\n"
          "  ampprobe report fp16.h5 --baseline fp32.h5 -o report.html\n");
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
static probe_status add_diagnosis(probe_report *rep, const probe_diag *d) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return PROBE_ERR_NOMEM;
  probe_diag_print_text(d, f);
  fclose(f);
  int problem = probe_diag_problem(d);
  char head[ESC_MAX + 32], e1[ESC_MAX];
  if (d->n_findings > 0)
    snprintf(head, sizeof head, "%s: %s", problem ? "PROBLEM" : "HEALTHY",
             esc(e1, d->findings[0].title));
  else
    snprintf(head, sizeof head, "%s", problem ? "PROBLEM" : "HEALTHY");

  probe_buf b;
  probe_buf_init(&b);
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

int cmd_report(int argc, char **argv) {
  static const struct option longs[] = {
      {"output", required_argument, NULL, 'o'},
      {"baseline", required_argument, NULL, 'b'},
      {"bisect", required_argument, NULL, 'B'},
      {"width", required_argument, NULL, 'w'},
      {"heat-cols", required_argument, NULL, 'c'},
      {"title", required_argument, NULL, 't'},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char *out = NULL, *base_path = NULL, *bisect_path = NULL;
  const char *title = NULL;
  int quiet = 0;
  probe_report_options ro;
  probe_report_options_init(&ro);
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":o:qh", longs, NULL)) != -1) {
    int64_t v;
    switch (c) {
    case 'o': out = optarg; break;
    case 'b': base_path = optarg; break;
    case 'B': bisect_path = optarg; break;
    case 't': title = optarg; break;
    case 'q': quiet = 1; break;
    case 'w':
      if (cli_parse_i64(SUB, "--width", optarg, 600, 4000, &v))
        return CLI_EXIT_USAGE;
      ro.width = (int)v;
      break;
    case 'c':
      if (cli_parse_i64(SUB, "--heat-cols", optarg, 10, 2000, &v))
        return CLI_EXIT_USAGE;
      ro.heat_cols = (int)v;
      break;
    case 'h': usage(stdout); return CLI_EXIT_OK;
    default: return cli_getopt_error(SUB, argv, c);
    }
  }
  if (optind >= argc) {
    cli_error(SUB, "missing TRACE argument (see 'ampprobe report --help')");
    return CLI_EXIT_USAGE;
  }
  if (argc - optind > 1) {
    cli_error(SUB, "unexpected argument '%s' (one TRACE only)",
              argv[optind + 1]);
    return CLI_EXIT_USAGE;
  }
  if (!out) {
    cli_error(SUB, "missing -o report.html (see 'ampprobe report --help')");
    return CLI_EXIT_USAGE;
  }
  const char *path = argv[optind];
  double t0 = cli_now();

  /* the file rules (tools/cli.h): inputs are regular files, the output is
   * none of them, whatever the flags */
  const char *inputs[3] = {path, base_path, bisect_path};
  for (int i = 0; i < 3; i++) {
    int r = inputs[i] ? cli_check_input(SUB, inputs[i]) : 0;
    if (r) return r;
  }
  int orc = cli_check_output(SUB, out, inputs, 3);
  if (orc) return orc;

  /* the bisect JSON first: a bad file is a usage-level input error, found
   * before the traces are read */
  json_t *bisect = NULL;
  if (bisect_path) {
    json_error_t je;
    bisect = json_load_file(bisect_path, 0, &je);
    const char *why = bisect ? bisect_shape_error(bisect) : NULL;
    if (!bisect) {
      cli_error(SUB, "%s: not a bisect result (line %d: %s)", bisect_path,
                je.line, je.text);
      return CLI_EXIT_INPUT;
    }
    if (why) {
      cli_error(SUB, "%s: not a bisect result (%s)", bisect_path, why);
      json_decref(bisect);
      return CLI_EXIT_INPUT;
    }
  }

  probe_trace *t = NULL, *tb = NULL;
  probe_report *rep = NULL;
  probe_diag diag;
  probe_diff diff;
  int have_diag = 0, have_diff = 0;
  int rc = open_trace(path, &t);
  if (rc == CLI_EXIT_OK && base_path) rc = open_trace(base_path, &tb);
  if (rc != CLI_EXIT_OK) goto done;

  char deftitle[600];
  snprintf(deftitle, sizeof deftitle, "ampprobe report: %s", path);
  ro.title = title ? title : deftitle;
  probe_status st = probe_report_new(&rep, &ro);
  if (st != PROBE_OK) {
    cli_error(SUB, "%s", probe_status_str(st));
    rc = CLI_EXIT_INTERNAL;
    goto done;
  }

  /* the diagnosis, from the post-mortem engine */
  diag_options dopt;
  diag_options_init(&dopt);
  st = probe_diag_run(&diag, t, path, &dopt);
  have_diag = 1;
  if (st == PROBE_OK) st = add_diagnosis(rep, &diag);
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
    st = check_configs(rep, t, path, tb, base_path, bisect, bisect_path);
  add_trace_meta(rep, "trace", path, t);
  if (tb) add_trace_meta(rep, "baseline", base_path, tb);

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
    cli_error(SUB, "%s: %s", bisect_path, probe_status_str(st));
    rc = CLI_EXIT_INTERNAL;
    goto done;
  }

  /* written to a temporary file renamed over `out` once complete */
  cli_out o;
  rc = cli_out_open(SUB, &o, out);
  if (rc != CLI_EXIT_OK) goto done;
  st = probe_report_write(rep, o.f);
  if (st != PROBE_OK) {
    if (st == PROBE_ERR_NOMEM) {
      cli_out_abort(&o);
      cli_error(SUB, "cannot write %s: %s", out, probe_status_str(st));
      rc = CLI_EXIT_INTERNAL;
    } else {
      rc = cli_out_fail(SUB, &o, EIO);
    }
    goto done;
  }
  rc = cli_out_commit(SUB, &o);
  if (rc != CLI_EXIT_OK) goto done;
  struct stat ost;
  double size = stat(out, &ost) == 0 ? (double)ost.st_size : 0;
  rc = probe_diag_problem(&diag) ? CLI_EXIT_PROBLEM : CLI_EXIT_OK;
  if (!quiet)
    fprintf(stderr, "ampprobe: report: wrote %s (%.1f KiB) in %.2f s\n", out,
            size / 1024.0, cli_now() - t0);

done:
  if (have_diff) probe_diff_free(&diff);
  if (have_diag) probe_diag_free(&diag);
  probe_report_free(rep);
  if (tb) probe_trace_close(tb);
  if (t) probe_trace_close(t);
  json_decref(bisect);
  return rc;
}
