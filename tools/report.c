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
#define _GNU_SOURCE /* open_memstream, strverscmp, memmem */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ampprobe/report.h"
#include "cli.h"
#include "diagnose.h"
#include "diffcore.h"
#include "ranks-impl.h" /* probe__rank_joined, probe__rank_aborted */

static const char *SUB = "report";

#define CHUNK 4096
#define DIFF_TABLE_ROWS 40 /* rows of the diff table, earliest first */

static void usage(FILE *f) {
  fprintf(f,
          "usage: ampprobe report TRACE [--baseline FP32_TRACE] "
          "[--bisect RESULT.json]\n"
          "                       -o report.html [--force] [--width PX] "
          "[--heat-cols N]\n"
          "                       [--title TEXT] [-q]\n"
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
          "  -o, --output FILE     the HTML file to write (required); an "
          "earlier page of\n"
          "                        'ampprobe report' there is replaced, any "
          "other file\n"
          "                        (a trace, a text) is refused without "
          "--force. Not\n"
          "                        one of the inputs, and not a *.h5 name "
          "inside a set's\n"
          "                        directory (it would join the set)\n"
          "  --force               replace FILE even when it is not a page "
          "of ours\n"
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
          "  -q, --quiet           no progress line and no summary line on stderr\n"
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
                               int baseline, cli_read_line *line) {
  probe_status st = PROBE_OK;
  size_t got;
  /* "plotting t.h5: N% (rows)": the rows of the three tables read */
  probe_progress_fn fn = baseline ? NULL : cli_read_line_fn(line);
  const probe_trace_info *info = probe_trace_get_info(t);
  uint64_t total = baseline ? 0
                            : (uint64_t)(info->n_steps + info->n_scaler_events +
                                         info->n_records);
  uint64_t done = 0;
#define FEED_PROGRESS(n)                                                       \
  do {                                                                         \
    done += (n);                                                               \
    if (fn) fn(CLI_PHASE_PLOTTING, done < total ? done : total, total, line);  \
  } while (0)
  probe_step_scalars *steps = malloc(CHUNK * sizeof *steps);
  probe_record *recs = malloc(CHUNK * sizeof *recs);
  probe_scaler_event *evs = malloc(CHUNK * sizeof *evs);
  if (!steps || !recs || !evs) st = PROBE_ERR_NOMEM;
  for (int64_t at = 0; st == PROBE_OK; at += (int64_t)got) {
    st = probe_trace_read_steps(t, at, CHUNK, steps, &got);
    if (st != PROBE_OK || got == 0) break;
    st = baseline ? probe_report_add_baseline_steps(rep, steps, got)
                  : probe_report_add_steps(rep, steps, got);
    FEED_PROGRESS(got);
  }
  if (!baseline) {
    for (int64_t at = 0; st == PROBE_OK; at += (int64_t)got) {
      st = probe_trace_read_scaler_events(t, at, CHUNK, evs, &got);
      if (st != PROBE_OK || got == 0) break;
      st = probe_report_add_scaler_events(rep, evs, got);
      FEED_PROGRESS(got);
    }
    for (int64_t at = 0; st == PROBE_OK; at += (int64_t)got) {
      st = probe_trace_read_records(t, at, CHUNK, recs, &got);
      if (st != PROBE_OK || got == 0) break;
      st = probe_report_add_records(rep, recs, got);
      FEED_PROGRESS(got);
    }
  }
#undef FEED_PROGRESS
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
  /* a trace the writer did not close (a killed run) is healthy only as far
   * as it goes: not the green bar of a finished run. Its post-mortem is
   * degraded (exit 1) by the not-closed finding alone; the steps it holds
   * showing no problem, the bar is the grey one, not the red */
  int only_not_closed = d->n_findings == 1 &&
                        d->findings[0].id == PROBE_DIAG_FINDING_NOT_CLOSED &&
                        d->silent_layer < 0;
  int unfinished = !set_head && !d->complete && (!problem || only_not_closed);
  if (unfinished) problem = 0;
  if (unfinished && d->aborted[0]) /* the abort mark: what ended it, no guess */
    snprintf(head, sizeof head, "HEALTHY SO FAR: the job ended by %.200s "
             "(the tracer closed its trace, marked aborted); the steps it "
             "holds show no problem", esc(e1, d->aborted));
  else if (unfinished)
    snprintf(head, sizeof head, "HEALTHY SO FAR: the trace was not closed "
             "(the run was killed, or is still running); the steps it holds "
             "show no problem");

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
                  rep, problem      ? PROBE_REPORT_PROBLEM
                       : unfinished ? PROBE_REPORT_UNKNOWN
                                    : PROBE_REPORT_HEALTHY,
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
                  d->threshold_used, (long long)d->loss_steps);
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
           "(threshold %.3g)", d->threshold_used);
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

/* A copy of a JSON value whose strings and keys have their controls
 * escaped (cli_escape_controls): text from a file is data, and a newline, ESC
 * or C1 control in a bisect result's hint or why must not reach the page
 * raw nor start a line of its own. NULL when out of memory. */
static json_t *escaped_copy(json_t *v) {
  if (json_is_string(v)) {
    char *e = cli_escape_controls(json_string_value(v));
    json_t *r = e ? json_string(e) : NULL;
    free(e);
    return r;
  }
  if (json_is_array(v)) {
    json_t *r = json_array(), *x;
    size_t i;
    json_array_foreach(v, i, x) {
      json_t *c = escaped_copy(x);
      if (!r || !c || json_array_append_new(r, c) != 0) { /* takes c */
        if (!r) json_decref(c);
        json_decref(r);
        return NULL;
      }
    }
    return r;
  }
  if (json_is_object(v)) {
    json_t *r = json_object(), *x;
    const char *k;
    json_object_foreach(v, k, x) {
      char *ek = cli_escape_controls(k);
      json_t *c = escaped_copy(x);
      /* json_object_set_new takes c, even when it fails */
      int bad = !r || !ek || !c || json_object_set_new(r, ek, c) != 0;
      if (bad && (!r || !ek)) json_decref(c);
      free(ek);
      if (bad) {
        json_decref(r);
        return NULL;
      }
    }
    return r;
  }
  return json_incref(v);
}

static probe_status add_bisect_escaped(probe_report *rep, json_t *root);

/* The bisect result drawn the way `ampprobe bisect` prints it: the header
 * with the failure criteria, the trial table (#, trial, forced to FP32,
 * verdict, steps, time, why) and the result lines, every string escaped as
 * on the terminal (escaped_copy). Members it does not know are kept in the
 * folded raw JSON under it (ASCII only: a control is a \u escape there). */
static probe_status add_bisect(probe_report *rep, json_t *orig) {
  json_t *root = escaped_copy(orig);
  if (!root) return PROBE_ERR_NOMEM;
  probe_status st = add_bisect_escaped(rep, root);
  json_decref(root);
  char *raw = json_dumps(orig, JSON_INDENT(2) | JSON_PRESERVE_ORDER |
                                   JSON_ENSURE_ASCII);
  if (st == PROBE_OK && raw)
    st = probe_report_add_folded_text(rep, PROBE_REPORT_BISECT,
                                      "The whole bisect result (JSON)", raw);
  free(raw);
  return st;
}

static probe_status add_bisect_escaped(probe_report *rep, json_t *root) {
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
    if (json_is_true(json_object_get(x, "reused"))) /* bisect --resume */
      snprintf(tm, sizeof tm, "reused");
    else if (json_is_number(v = json_object_get(x, "seconds")))
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
    /* the role all-fp16 is the trial with nothing in FP32 whatever the
     * reduced precision: shown as all-bf16 for a BF16 bisect's */
    const char *prec = jstr(x, "precision");
    if (!strcmp(role, "all-fp16") && prec && !strcmp(prec, "bf16"))
      role = "all-bf16";
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
    json_t *ru = json_object_get(root, "trials_reused");
    char reused[48] = "";
    if (json_integer_value(ru) > 0) /* bisect --resume: not run again */
      snprintf(reused, sizeof reused, ", %lld reused",
               (long long)json_integer_value(ru));
    probe_buf_printf(&r, "  %-15s %lld run%s (%lld in ddmin), %lld cancelled, "
                         "%.2f s wall with -j %lld\n",
                     "trials", (long long)json_integer_value(ran), reused,
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

/* 1 when a and b are the same JSON value, numbers compared as numbers:
 * 1e-05 and 1.0000000000000001e-5 (one double, two writers), 1 and 1.0,
 * two integers exactly, an integer and a real when the real is that
 * integer. The rule of diff's config comparison (libprobe/analysis/diff.c,
 * same_number), so that report and diff agree on two configs. */
static int same_json(json_t *a, json_t *b) {
  if (json_is_integer(a) && json_is_integer(b))
    return json_integer_value(a) == json_integer_value(b);
  if (json_is_number(a) && json_is_number(b)) {
    if (json_is_real(a) && json_is_real(b))
      return json_real_value(a) == json_real_value(b);
    json_int_t i = json_integer_value(json_is_integer(a) ? a : b);
    double r = json_real_value(json_is_real(a) ? a : b);
    return r == (double)i && r >= -9223372036854775808.0 &&
           r < 9223372036854775808.0 && (json_int_t)r == i;
  }
  if (json_is_object(a) && json_is_object(b)) {
    if (json_object_size(a) != json_object_size(b)) return 0;
    const char *k;
    json_t *va;
    json_object_foreach(a, k, va) {
      json_t *vb = json_object_get(b, k);
      if (!vb || !same_json(va, vb)) return 0;
    }
    return 1;
  }
  if (json_is_array(a) && json_is_array(b)) {
    if (json_array_size(a) != json_array_size(b)) return 0;
    for (size_t i = 0; i < json_array_size(a); i++)
      if (!same_json(json_array_get(a, i), json_array_get(b, i))) return 0;
    return 1;
  }
  return json_equal(a, b); /* strings, true, false, null; or two types */
}

/* Keys of the config a precision baseline may change. */
static int precision_key(const char *k) {
  return !strcmp(k, "precision") || !strcmp(k, "fp32") ||
         !strcmp(k, "loss_fp32");
}

/* Appends a name read from a file or a command line (a config key, a path)
 * escaped as on the terminal: a newline in it would otherwise start a
 * forged warning line when the buffer is split below. */
static void buf_add_name(probe_buf *b, const char *s) {
  size_t n = probe_text_escape(NULL, 0, s) + 1;
  char *e = malloc(n);
  if (!e) {
    b->oom = 1;
    return;
  }
  probe_text_escape(e, n, s);
  probe_buf_append(b, e, strlen(e));
  free(e);
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
  char qn[200], qo[200], qp[1024], qb[1024], qj[1024];
  cli_escape_name(qn, sizeof qn, name ? name : "");
  cli_escape_name(qp, sizeof qp, path);
  cli_escape_name(qb, sizeof qb, base_path ? base_path : "");
  cli_escape_name(qj, sizeof qj, bisect_path ? bisect_path : "");
  if (tb && ca) {
    json_t *cb = trace_config(tb);
    const char *bname = cb ? jstr(cb, "name") : NULL;
    if (cb && name && bname && strcmp(name, bname) != 0) {
      cli_escape_name(qo, sizeof qo, bname);
      probe_buf_printf(&w, "the baseline %s is a run of config '%s', the "
                           "trace %s of '%s': the comparison is not a "
                           "precision baseline\n",
                       qb, qo, qp, qn);
    } else if (cb) {
      probe_buf diffk;
      probe_buf_init(&diffk);
      const char *k;
      json_t *va;
      json_object_foreach(ca, k, va) {
        if (precision_key(k) || !strcmp(k, "description")) continue;
        json_t *vb = json_object_get(cb, k);
        if (!vb || !same_json(va, vb)) {
          probe_buf_printf(&diffk, "%s", diffk.len ? ", " : "");
          buf_add_name(&diffk, k);
        }
      }
      json_object_foreach(cb, k, va)
        if (!precision_key(k) && strcmp(k, "description") &&
            !json_object_get(ca, k)) {
          probe_buf_printf(&diffk, "%s", diffk.len ? ", " : "");
          buf_add_name(&diffk, k);
        }
      if (diffk.len)
        probe_buf_printf(&w, "the baseline %s and the trace %s are of config "
                             "'%s' but differ in more than precision (%s)\n",
                         qb, qp, qn, diffk.data);
      if (diffk.oom) w.oom = 1;
      probe_buf_free(&diffk);
    }
    json_decref(cb);
  }
  const char *bname = bisect ? jstr(bisect, "scenario") : NULL;
  if (bname && name && strcmp(bname, name) != 0) {
    cli_escape_name(qo, sizeof qo, bname);
    probe_buf_printf(&w, "the bisect result %s is of config '%s', the trace "
                         "%s of '%s'\n",
                     qj, qo, qp, qn);
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

/* A value read from a file, escaped as on the terminal (\n, \e, ...: the
 * HTML escaping after it would keep a newline and drop a control). */
static void add_meta_escaped(probe_report *rep, const char *key, const char *value) {
  char e[1024];
  cli_escape_name(e, sizeof e, value);
  probe_report_add_meta(rep, key, e);
}

static void add_trace_meta(probe_report *rep, const char *label,
                           const char *path, probe_trace *t) {
  const probe_trace_info *in = probe_trace_get_info(t);
  char v[768], qp[256], how[320], why[4 * PROBE_ABORT_REASON_MAX];
  cli_escape_name(qp, sizeof qp, path);
  /* the marks: the join (uneven inputs) and the abort (what ended the job,
   * data: escaped) */
  cli_escape_name(why, sizeof why, in->aborted ? in->aborted : "");
  if (in->complete)
    snprintf(how, sizeof how, "%s", in->joined
                                        ? "complete; the rank ran out of "
                                          "inputs and joined the others "
                                          "(uneven inputs: DDP's join())"
                                        : "complete");
  else if (why[0] && in->aborted_step >= 0)
    snprintf(how, sizeof how, "aborted: ended by %.200s in step %lld (closed "
             "half done by the tracer)", why, (long long)in->aborted_step);
  else if (why[0])
    snprintf(how, sizeof how, "aborted: ended by %.200s, closed by the tracer",
             why);
  else
    snprintf(how, sizeof how, "incomplete: writer did not close it");
  snprintf(v, sizeof v, "%s (%s, %s; %lld steps, %lld layers, %lld layer "
                        "records)",
           qp, how,
           in->record_mode == PROBE_MODE_FULL ? "full trace" : "flight recorder",
           (long long)in->n_steps, (long long)in->n_layers,
           (long long)in->n_records);
  probe_report_add_meta(rep, label, v);
  if (in->precision_policy && in->precision_policy[0]) {
    snprintf(v, sizeof v, "%s precision", label);
    add_meta_escaped(rep, v, in->precision_policy);
  }
  if (in->created && in->created[0]) {
    snprintf(v, sizeof v, "%s created", label);
    add_meta_escaped(rep, v, in->created);
  }
  if (in->command_line && in->command_line[0]) {
    snprintf(v, sizeof v, "%s command", label);
    add_meta_escaped(rep, v, in->command_line);
  }
}

/* ---- a trace set: the ranks of one job --------------------------------------- */

/* The set is read by the analysis library's cross-rank post-mortem
 * (probe_ranks_run: which ranks were read, missing, unreadable, killed;
 * the job's first non-finite value and how the all-reduce spread it; the
 * verdict), which is what the page says in words and what the table and
 * the ring show. The cells of the ranks x steps view are this file's own
 * scan of each readable trace, in a forked worker (set_scan_all). */

#define SET_MAP_COLS 500    /* step columns of the ranks x steps view */
#define SET_TABLE_ROWS 64   /* rows of the ranks table at most */
#define SET_NOTE_MAX 480
#define NF_BITS_MAX (INT64_C(1) << 30) /* steps counted exactly, at most */
#define SCAN_SECONDS 30     /* a worker's time per file: 30 s + 1 s per */
#define SCAN_BYTES_PER_SECOND (20 << 20) /* 20 MB, as the isolated reader */

/* A row of the view: a rank (read, missing or unreadable) of probe_ranks. */
typedef struct set_row {
  const probe_rank_entry *e;
  char label[48];
  char note[SET_NOTE_MAX];
} set_row;

/* What the scan of one file leaves (shared memory: the worker writes it). */
typedef struct scan_res {
  int state;           /* 0 not scanned, 1 scanned, 2 failed */
  int64_t first, last; /* step range, -1 none */
  int64_t nf_steps;    /* steps with inf/NaN by this page's rule */
  int64_t count[4];    /* steps per final probe_rank_cell */
  char err[200];
} scan_res;

typedef struct trace_set {
  probe_ranks R;
  int have_R;
  set_row *rows;
  int n_rows;
  scan_res *scan;      /* (n_rows) shared memory */
  int64_t x0, x1;
} trace_set;

/* Rows in probe_ranks' order (by rank; unreadable files without a rank
 * after). An unreadable file's rank is the one its name gives
 * (probe_ranks does that, and lists that rank as unreadable, not
 * missing), so each rank has one row. */
static int set_rows(trace_set *s) {
  const probe_ranks *R = &s->R;
  s->rows = calloc(R->n_entries ? R->n_entries : 1, sizeof *s->rows);
  if (!s->rows) return -1;
  int n = 0;
  for (size_t i = 0; i < R->n_entries; i++) {
    const probe_rank_entry *e = &R->entries[i];
    set_row *w = &s->rows[n++];
    w->e = e;
    if (e->rank >= 0) snprintf(w->label, sizeof w->label, "rank %d", (int)e->rank);
    else snprintf(w->label, sizeof w->label, "file %d", n - 1);
  }
  s->n_rows = n;
  return n > PROBE_RANKMAP_MAX_ROWS ? -1 : 0;
}

/* One bit per step of a file (over its step range). */
typedef struct step_bits {
  unsigned char *bit;
  int64_t first, n;
} step_bits;

static void bits_init(step_bits *b, int64_t first, int64_t last) {
  b->bit = NULL;
  b->first = first;
  /* last - first + 1 overflows for steps 0 .. 2^63 - 1: no bits then */
  b->n = first >= 0 && last >= first && last - first < NF_BITS_MAX
             ? last - first + 1 : 0;
  if (b->n > 0)
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

typedef struct scan_ctx {
  probe_rankmap *m;
  int row;
  scan_res *res;
  step_bits nf, skip, seen;
  const probe_layer_info *layers; /* the trace's: their kinds */
  size_t n_layers;
} scan_ctx;

/* A step's cell from its scalars. Gradients that overflowed in a step the
 * loss scaler skipped are dynamic loss scaling at work: such a step is
 * "skipped", not "inf/NaN" (a non-finite loss always is). */
static void scan_steps(scan_ctx *c, const probe_step_scalars *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const probe_step_scalars *p = &s[i];
    bits_set(&c->seen, p->step);
    int loss_bad = !(p->unmeasured & PROBE_SCALAR_LOSS) && !isfinite(p->loss);
    int norm_bad = !(p->unmeasured & PROBE_SCALAR_GRAD_NORM) &&
                   !isfinite(p->grad_norm) && !p->skipped;
    probe_rank_cell cell = loss_bad || norm_bad ? PROBE_RANK_CELL_NONFINITE
                           : p->skipped         ? PROBE_RANK_CELL_SKIPPED
                                                : PROBE_RANK_CELL_HEALTHY;
    probe_rankmap_add(c->m, c->row, p->step, cell);
    if (p->skipped) bits_set(&c->skip, p->step);
    if (cell == PROBE_RANK_CELL_NONFINITE) c->res->nf_steps += bits_set(&c->nf, p->step);
  }
}

static void scan_records(scan_ctx *c, const probe_record *r, size_t n) {
  for (size_t i = 0; i < n; i++) {
    /* inf/NaN as the post-mortem takes them: masked logits are none */
    probe_kind kind = r[i].layer >= 0 && (size_t)r[i].layer < c->n_layers
                          ? (probe_kind)c->layers[r[i].layer].kind
                          : PROBE_KIND_OTHER;
    if (!probe_record_nonfinite(kind, (probe_site)r[i].site, &r[i].stats))
      continue;
    int ph = (int)probe_site_phase((probe_site)r[i].site);
    if (ph == PROBE_PHASE_BACKWARD && bits_get(&c->skip, r[i].step)) {
      probe_rankmap_add(c->m, c->row, r[i].step, PROBE_RANK_CELL_SKIPPED);
      continue; /* caught by the loss scaler */
    }
    probe_rankmap_add(c->m, c->row, r[i].step, PROBE_RANK_CELL_NONFINITE);
    c->res->nf_steps += bits_set(&c->nf, r[i].step);
  }
}

/* The legend's (rank, step) counts: each step once, in its final state. */
static void scan_count(scan_ctx *c) {
  for (int64_t k = 0; c->seen.bit && k < c->seen.n; k++) {
    int64_t step = c->seen.first + k;
    if (bits_get(&c->nf, step)) c->res->count[PROBE_RANK_CELL_NONFINITE]++;
    else if (bits_get(&c->seen, step))
      c->res->count[bits_get(&c->skip, step) ? PROBE_RANK_CELL_SKIPPED
                                             : PROBE_RANK_CELL_HEALTHY]++;
  }
}

/* One readable file into the map: every row of its steps table, and its
 * records from the writer's first non-finite step on (before it every
 * record was finite: /meta/state, docs/trace-format.md). */
static probe_status scan_file(const char *path, probe_rankmap *m, int row,
                              scan_res *res) {
  probe_trace *t = NULL;
  probe_status st = probe_trace_open(&t, path);
  if (st < 0) {
    snprintf(res->err, sizeof res->err, "%s", *cli_trace_error(NULL) ? cli_trace_error(NULL) : probe_status_str(st));
    return st;
  }
  scan_ctx c = {m, row, res, {0}, {0}, {0}, NULL, 0};
  c.layers = probe_trace_layers(t, &c.n_layers);
  int64_t writer_nf = probe_trace_get_info(t)->first_nonfinite_step;
  st = trace_range(t, &res->first, &res->last);
  bits_init(&c.nf, res->first, res->last);
  bits_init(&c.skip, res->first, res->last);
  bits_init(&c.seen, res->first, res->last);
  probe_step_scalars *steps = malloc(CHUNK * sizeof *steps);
  probe_record *recs = malloc(CHUNK * sizeof *recs);
  if (!steps || !recs) st = PROBE_ERR_NOMEM;
  size_t got = 0;
  for (int64_t at = 0; st == PROBE_OK; at += (int64_t)got) {
    st = probe_trace_read_steps(t, at, CHUNK, steps, &got);
    if (st != PROBE_OK || got == 0) break;
    scan_steps(&c, steps, got);
  }
  int64_t from = 0;
  if (st == PROBE_OK && writer_nf >= 0) st = records_from(t, writer_nf, &from);
  for (int64_t at = from; st == PROBE_OK && writer_nf >= 0; at += (int64_t)got) {
    st = probe_trace_read_records(t, at, CHUNK, recs, &got);
    if (st != PROBE_OK || got == 0) break;
    scan_records(&c, recs, got);
  }
  if (st < 0) snprintf(res->err, sizeof res->err, "%s", *cli_trace_error(t) ? cli_trace_error(t) : probe_status_str(st));
  else scan_count(&c);
  free(c.nf.bit);
  free(c.skip.bit);
  free(c.seen.bit);
  free(steps);
  free(recs);
  probe_trace_close(t);
  return st;
}

/* The worker: scans rows from `from` on, marking each before it starts,
 * with an alarm per file against a hang. */
static void scan_worker(trace_set *s, probe_rankmap *m, int from,
                        volatile int *at) {
  for (int i = from; i < s->n_rows; i++) {
    const probe_rank_entry *e = s->rows[i].e;
    if (e->status != PROBE_RANK_READ) continue;
    *at = i;
    struct stat sb;
    off_t size = stat(e->path, &sb) == 0 ? sb.st_size : 0;
    alarm((unsigned)(SCAN_SECONDS + size / SCAN_BYTES_PER_SECOND));
    s->scan[i].state = scan_file(e->path, m, i, &s->scan[i]) < 0 ? 2 : 1;
    alarm(0);
  }
  *at = s->n_rows;
}

/* Waits for the scan worker pid; with the progress line on, polls it and
 * draws "scanning rank files: N% (k of n files)" from the row it is at. */
#define SCAN_POLL_NS 50000000L /* 50 ms */
static int scan_wait(const trace_set *s, pid_t pid, int *status,
                     volatile int *at, cli_read_line *line) {
  probe_progress_fn fn = cli_read_line_fn(line);
  uint64_t total = 0;
  for (int i = 0; fn && i < s->n_rows; i++)
    total += s->rows[i].e->status == PROBE_RANK_READ;
  for (;;) {
    pid_t r = waitpid(pid, status, fn ? WNOHANG : 0);
    if (r == pid) return 0;
    if (r < 0 && errno != EINTR) return -1;
    if (r != 0) continue;
    uint64_t done = 0;
    for (int i = 0; i < s->n_rows && i < *at; i++)
      done += s->rows[i].e->status == PROBE_RANK_READ;
    fn(CLI_PHASE_SCANNING, done, total, line);
    struct timespec ts = {0, SCAN_POLL_NS};
    nanosleep(&ts, NULL);
  }
}

/* Scans every readable file in a forked worker process that fills the
 * map's shared cells, so that a crash or hang inside HDF5 on a malformed
 * file marks that rank unreadable (a new worker goes on with the next
 * file) instead of killing the report. */
static int set_scan_all(trace_set *s, probe_rankmap *m, cli_read_line *line) {
  size_t bytes = (size_t)s->n_rows * sizeof *s->scan + sizeof(int);
  void *shm = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) return -1;
  s->scan = shm;
  volatile int *at = (volatile int *)(s->scan + s->n_rows);
  int from = 0;
  while (from < s->n_rows) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
      signal(SIGALRM, SIG_DFL);
      scan_worker(s, m, from, at);
      _exit(0);
    }
    int status = 0;
    if (scan_wait(s, pid, &status, at, line) != 0) return -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && *at >= s->n_rows)
      break;
    int bad = *at; /* it died on this file */
    if (bad < from || bad >= s->n_rows) return -1;
    s->scan[bad].state = 2;
    snprintf(s->scan[bad].err, sizeof s->scan[bad].err, "%s",
             WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM
                 ? "reading it hung (stopped)"
                 : "reading it crashed the reader");
    from = bad + 1;
  }
  return 0;
}

static const char *role_str(int32_t role) {
  return role == PROBE_RANK_ROLE_BORN      ? "born here"
         : role == PROBE_RANK_ROLE_CARRIED ? "carried by the all-reduce"
         : role == PROBE_RANK_ROLE_LATER   ? "its own, later"
                                           : "";
}

/* "step 30, fwd_out of input" for an entry's first non-finite record. */
static void entry_nf(const probe_rank_entry *e, char *buf, size_t n) {
  if (e->nf_step < 0) {
    snprintf(buf, n, e->first_nonfinite_loss_step >= 0 ? "loss at step %lld"
                                                       : "none",
             (long long)e->first_nonfinite_loss_step);
    return;
  }
  snprintf(buf, n, "step %lld, %s of %s", (long long)e->nf_step,
           e->nf_site >= 0 && e->nf_site < PROBE_SITE_COUNT
               ? probe_site_name((probe_site)e->nf_site)
               : "?",
           e->nf_layer_name);
}

static void add_note(set_row *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void add_note(set_row *w, const char *fmt, ...) {
  size_t o = strlen(w->note);
  if (o && o + 2 < sizeof w->note) {
    memcpy(w->note + o, "; ", 3);
    o += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->note + o, sizeof w->note - o, fmt, ap);
  va_end(ap);
}

/* The notes of each row, what the scan found failing included. */
static void set_notes(trace_set *s) {
  const probe_ranks *R = &s->R;
  for (int i = 0; i < s->n_rows; i++) {
    set_row *w = &s->rows[i];
    const probe_rank_entry *e = w->e;
    char where[PROBE_NAME_MAX * 4 + 64], err[240];
    if (e->status == PROBE_RANK_MISSING) add_note(w, "missing: no trace file");
    if (e->status == PROBE_RANK_UNREADABLE) {
      cli_escape_name(err, sizeof err, e->error ? e->error : "unreadable");
      add_note(w, "unreadable: %s", err);
    }
    if (e->status != PROBE_RANK_READ) continue;
    if (s->scan && s->scan[i].state == 2)
      add_note(w, "its steps could not be read: %s", s->scan[i].err);
    if (probe__rank_aborted(e) && e->aborted_step >= 0)
      add_note(w, "aborted: ended by %.200s in step %lld (closed half done "
               "by the tracer)", e->aborted, (long long)e->aborted_step);
    else if (probe__rank_aborted(e))
      add_note(w, "aborted: ended by %.200s after step %lld (its trace "
               "closed by the tracer)", e->aborted, (long long)e->last_step);
    else if (!e->complete)
      add_note(w, "incomplete (writer did not close it%s)",
               e->joined ? ", after it joined" : "");
    if (probe__rank_joined(e))
      add_note(w, "joined: ran out of inputs and joined the others after "
               "step %lld (uneven inputs: DDP's join())",
               (long long)e->last_step);
    if (R->stopped_first >= 0 && e == &R->entries[R->stopped_first] &&
        !probe_ranks_stopped_tie(R))
      add_note(w, "stopped first: last step %lld of %lld",
               (long long)e->last_step, (long long)R->max_last_step);
    if (R->first >= 0 && e == &R->entries[R->first]) {
      entry_nf(e, where, sizeof where);
      add_note(w, "first inf/NaN of the job: %s", where);
    } else if (e->role == PROBE_RANK_ROLE_BORN) { /* born on several */
      entry_nf(e, where, sizeof where);
      add_note(w, "%s: %s", role_str(e->role), where);
    } /* "carried" is the rule in a DDP job: in the table, not a note */
    for (int f = 0; f < PROBE_RANKS_FIELD_COUNT; f++) {
      const probe_ranks_disagreement *d = &R->disagree[f];
      if (d->found && d->rank_b == e->rank)
        add_note(w, "%s differs from rank %d's at step %lld",
                 probe_ranks_field_name((probe_ranks_field)f), (int)d->rank_a,
                 (long long)d->step);
    }
  }
}

/* Reads the set: the cross-rank post-mortem, the rows, the scan; fills the
 * map. Returns an exit code. */
static int set_build(trace_set *s, char **paths, size_t n, int heat_cols,
                     probe_rankmap **map, cli_read_line *line) {
  *map = NULL;
  probe_ranks_options o;
  probe_ranks_options_init(&o);
  o.isolate = 1;
  /* "reading rank files: N% ...", then the focus rank's checking/analysing */
  snprintf(line->name, sizeof line->name, "the focus rank");
  probe_status st = probe_ranks_run_progress(&s->R, (const char *const *)paths,
                                             n, &o, cli_read_line_fn(line), line);
  s->have_R = 1;
  /* refused as a set (not one job: exit 2; corrupt: 3), with its reason */
  if (st == PROBE_ERR_INVALID_ARG || (st < 0 && s->R.error[0])) {
    cli_error(SUB, "%s", s->R.error[0] ? s->R.error : "not the traces of one job");
    return st == PROBE_ERR_NOMEM ? CLI_EXIT_INTERNAL : cli_exit_for_status(st);
  }
  if (st < 0) {
    const char *e = cli_trace_error(NULL);
    cli_error(SUB, "no readable trace in the set: %s", e && *e ? e : probe_status_str(st));
    return st == PROBE_ERR_NOMEM ? CLI_EXIT_INTERNAL : cli_exit_for_status(st);
  }
  if (set_rows(s) != 0) {
    cli_error(SUB, "the set has more than %d ranks and files",
              PROBE_RANKMAP_MAX_ROWS);
    return CLI_EXIT_USAGE;
  }
  /* the step range: of the ranks read (probe_ranks knows the last steps;
   * the first is read with the cells, so the map starts at step 0 unless a
   * rank's steps start later, which the scan's range then shows) */
  s->x0 = 0;
  s->x1 = s->R.max_last_step > 0 ? s->R.max_last_step : 0;
  int cols = heat_cols > SET_MAP_COLS ? heat_cols : SET_MAP_COLS;
  st = probe_rankmap_new(map, s->n_rows, cols, s->x0, s->x1);
  if (st == PROBE_OK && set_scan_all(s, *map, line) != 0) st = PROBE_ERR_NOMEM;
  for (int i = 0; st == PROBE_OK && i < s->n_rows; i++) {
    const probe_rank_entry *e = s->rows[i].e;
    st = probe_rankmap_set_row(*map, i, s->rows[i].label,
                               e->status == PROBE_RANK_READ ? PROBE_RANK_ROW_TRACE
                               : e->status == PROBE_RANK_MISSING
                                   ? PROBE_RANK_ROW_MISSING
                                   : PROBE_RANK_ROW_UNREADABLE,
                               e->path);
    if (e->status != PROBE_RANK_READ) continue;
    probe_rankmap_set_last(*map, i, s->scan[i].last >= 0 ? s->scan[i].last
                                                         : e->last_step);
    for (int c = 1; c < 4; c++)
      probe_rankmap_count_add(*map, (probe_rank_cell)c, s->scan[i].count[c]);
    if (s->R.stopped_first >= 0 && e == &s->R.entries[s->R.stopped_first] &&
        !probe_ranks_stopped_tie(&s->R))
      probe_rankmap_mark_stop(*map, i);
    if (s->R.first >= 0 && e == &s->R.entries[s->R.first])
      probe_rankmap_mark_first(*map, i, s->R.event_step);
    else if (s->R.first < 0 && s->R.first_loss >= 0 &&
             e == &s->R.entries[s->R.first_loss])
      probe_rankmap_mark_first(*map, i, e->first_nonfinite_loss_step);
  }
  if (st == PROBE_OK) {
    set_notes(s);
    for (int i = 0; st == PROBE_OK && i < s->n_rows; i++)
      if (s->rows[i].note[0]) st = probe_rankmap_note(*map, i, s->rows[i].note);
  }
  if (st != PROBE_OK) {
    cli_error(SUB, "%s", probe_status_str(st));
    return CLI_EXIT_INTERNAL;
  }
  return CLI_EXIT_OK;
}

static void set_free(trace_set *s) {
  if (s->have_R) probe_ranks_free(&s->R);
  if (s->scan)
    munmap(s->scan, (size_t)s->n_rows * sizeof *s->scan + sizeof(int));
  free(s->rows);
}

/* The row whose panels are drawn: --rank R, else the post-mortem's focus
 * (the rank the first inf/NaN was born on, else ...), else the first
 * readable one. */
static int set_choose(const trace_set *s, int64_t want, const char **why) {
  for (int i = 0; i < s->n_rows; i++) {
    const probe_rank_entry *e = s->rows[i].e;
    if (e->status != PROBE_RANK_READ || (s->scan && s->scan[i].state == 2))
      continue;
    if (want >= 0 && e->rank == want) {
      *why = "chosen with --rank";
      return i;
    }
    if (want < 0 && s->R.focus >= 0 && e == &s->R.entries[s->R.focus]) {
      *why = s->R.first >= 0 ? "the rank of the job's first inf/NaN"
             : s->R.first_loss >= 0 ? "the rank of the first non-finite loss"
             : s->R.stopped_first >= 0 && probe_ranks_stopped_tie(&s->R)
                 ? "every rank stopped at the same step: the first read"
             : s->R.stopped_first >= 0 ? "the rank that stopped first"
                                       : "no rank stands out: the first read";
      return i;
    }
  }
  if (want >= 0) return -1;
  for (int i = 0; i < s->n_rows; i++)
    if (s->rows[i].e->status == PROBE_RANK_READ) {
      *why = "the first readable trace";
      return i;
    }
  return -1;
}

/* The set's headline and summary (the post-mortem over the set), and
 * whether it shows a problem. */
static int set_summary(const trace_set *s, char *head, size_t hn,
                       probe_buf *b) {
  const probe_ranks *R = &s->R;
  int problem = R->verdict != PROBE_VERDICT_HEALTHY;
  probe_buf_printf(b, "job: %zu rank files%s%s%s, world size %d; verdict %s\n",
                   R->n_files, R->run_id[0] ? " of run '" : "", R->run_id,
                   R->run_id[0] ? "'" : "", (int)R->world_size,
                   probe_verdict_name(R->verdict));
  if (R->origin != PROBE_RANKS_ORIGIN_NONE && R->origin_text[0])
    probe_buf_printf(b, "origin: %s\n", R->origin_text);
  if (R->fix_text[0]) probe_buf_printf(b, "next step: %s\n", R->fix_text);
  for (int f = 0; f < PROBE_RANKS_FIELD_COUNT; f++) {
    const probe_ranks_disagreement *d = &R->disagree[f];
    if (d->found)
      probe_buf_printf(b, "disagreement: %s differs between ranks %d and %d "
                          "at step %lld (%lld ranks differ)\n",
                       probe_ranks_field_name((probe_ranks_field)f),
                       (int)d->rank_a, (int)d->rank_b, (long long)d->step,
                       (long long)d->ranks_differing);
  }
  probe_buf_printf(b, "ranks: %lld read, %lld missing, %lld unreadable, "
                      "%lld not closed\n",
                   (long long)R->n_read, (long long)R->n_missing,
                   (long long)R->n_unreadable, (long long)R->n_incomplete);
  if (R->stopped_first >= 0 && probe_ranks_stopped_tie(R)) {
    probe_buf_printf(b, "every rank stopped at step %lld without closing its "
                        "trace: cannot tell which stopped first\n",
                     (long long)R->entries[R->stopped_first].last_step);
  } else if (R->stopped_first >= 0) {
    const probe_rank_entry *e = &R->entries[R->stopped_first];
    probe_buf_printf(b, "rank %d stopped first: last step %lld, the others "
                        "went on to %lld\n",
                     (int)e->rank, (long long)e->last_step,
                     (long long)R->max_last_step);
  }
  if (R->origin != PROBE_RANKS_ORIGIN_NONE && R->origin_text[0])
    snprintf(head, hn, "%s", R->origin_text);
  else if (R->stopped_first >= 0 && probe_ranks_stopped_tie(R))
    snprintf(head, hn, "every rank stopped after step %lld (not closed)",
             (long long)R->entries[R->stopped_first].last_step);
  else if (R->stopped_first >= 0)
    snprintf(head, hn, "rank %d stopped first, after step %lld",
             (int)R->entries[R->stopped_first].rank,
             (long long)R->entries[R->stopped_first].last_step);
  else if (R->n_disagreements > 0)
    snprintf(head, hn, "the ranks disagree (%d field%s)", R->n_disagreements,
             R->n_disagreements == 1 ? "" : "s");
  else if (R->n_missing || R->n_unreadable)
    snprintf(head, hn, "%lld rank%s missing, %lld file%s unreadable",
             (long long)R->n_missing, R->n_missing == 1 ? "" : "s",
             (long long)R->n_unreadable, R->n_unreadable == 1 ? "" : "s");
  else
    snprintf(head, hn, "%lld ranks, no inf/NaN on any rank",
             (long long)R->n_read);
  for (int i = 0; i < s->n_rows; i++)
    problem |= s->scan && s->scan[i].state == 2;
  return problem;
}

/* The ranks table: every rank up to SET_TABLE_ROWS files, else only the
 * ranks with a note and the chosen one (the rest counted). */
static probe_status set_table(probe_report *rep, const trace_set *s,
                              int chosen) {
  static const char *hdr[8] = {"rank", "file", "steps", "closed",
                               "first inf/NaN", "steps with inf/NaN",
                               "skipped steps", "note"};
  int tid;
  probe_status st = probe_report_add_table(rep, PROBE_REPORT_RANKS,
                                           "Ranks", 8, hdr, &tid);
  int all = s->n_rows <= SET_TABLE_ROWS, shown = 0, hidden = 0;
  for (int i = 0; i < s->n_rows && st == PROBE_OK; i++) {
    const set_row *w = &s->rows[i];
    const probe_rank_entry *e = w->e;
    if ((!all && !w->note[0] && i != chosen) || shown >= SET_TABLE_ROWS) {
      hidden++;
      continue;
    }
    shown++;
    char steps[64] = "", nf[PROBE_NAME_MAX * 4 + 96] = "", a[24] = "";
    char b[24] = "", fname[1200] = "(none)", note[SET_NOTE_MAX + 32];
    if (e->path) cli_escape_name(fname, sizeof fname, e->path);
    if (e->status == PROBE_RANK_READ) {
      snprintf(steps, sizeof steps, "%lld-%lld (%lld)",
               (long long)s->scan[i].first, (long long)e->last_step,
               (long long)e->n_steps);
      entry_nf(e, nf, sizeof nf);
      if (e->nf_step >= 0 && e->role != PROBE_RANK_ROLE_NONE) {
        size_t o = strlen(nf);
        snprintf(nf + o, sizeof nf - o, " (%s)", role_str(e->role));
      }
      snprintf(a, sizeof a, "%lld", (long long)s->scan[i].nf_steps);
      snprintf(b, sizeof b, "%lld", (long long)e->skipped_steps);
    }
    snprintf(note, sizeof note, "%s%s", i == chosen ? "(panels below) " : "",
             w->note);
    /* closed: yes, joined (with the join mark), aborted (closed by the
     * tracer with the abort mark; the note says what ended it), no */
    const char *closed = e->status != PROBE_RANK_READ ? ""
                         : probe__rank_joined(e)      ? "joined"
                         : e->complete                ? "yes"
                         : probe__rank_aborted(e)     ? "aborted"
                                                      : "no";
    const char *cells[8] = {w->label, fname, steps, closed,
                            nf, a, b, note};
    st = probe_report_table_row(rep, tid, cells);
  }
  if (st == PROBE_OK && hidden) {
    char more[128];
    snprintf(more, sizeof more, "%d more ranks: nothing to note (not "
             "listed; 'ampprobe postmortem' --json lists them all).", hidden);
    st = probe_report_add_text(rep, PROBE_REPORT_RANKS, "", more);
  }
  char *text = NULL;
  if (st == PROBE_OK && probe_ranks_render_text(&s->R, &text) == PROBE_OK &&
      text)
    st = probe_report_add_folded_text(rep, PROBE_REPORT_RANKS,
                                      "Cross-rank post-mortem (what "
                                      "'ampprobe postmortem' prints for the "
                                      "set)", text);
  probe_free(text);
  return st;
}

typedef struct report_args {
  const char *out, *base_path, *bisect_path, *title;
  int quiet;
  int force; /* --force: -o may replace a file that is not our page */
  int64_t rank; /* --rank, -1 when not given */
  probe_report_options ro;
  cli_read_line *line; /* the command's progress line (cli.h) */
} report_args;

/* 1 when a file starts as the pages probe_report_write writes: its head
 * with the generator tag, or (a page written before the tag) the same
 * doctype, charset and title followed by the report's own style sheet. */
static int own_page(const char *head, size_t n) {
  static const char tag[] = PROBE_REPORT_HEAD;
  static const char old[] = "<!DOCTYPE html>\n<html lang=\"en\"><head>"
                            "<meta charset=\"utf-8\">\n<title>";
  static const char css[] = "</title>\n<style>body{font-family:sans-serif;"
                            "margin:20px 28px;";
  if (n >= sizeof tag - 1 && !memcmp(head, tag, sizeof tag - 1)) return 1;
  if (n < sizeof old - 1 || memcmp(head, old, sizeof old - 1)) return 0;
  /* a --title longer than the head read (escaped, over 4 KiB) pushes the
   * style sheet out of it: a title that runs to the end of the head is
   * taken for ours (review 9: such a page was refused) */
  static const char end_title[] = "</title>";
  const char *t = head + sizeof old - 1;
  size_t left = n - (sizeof old - 1);
  if (n == CLI_OWN_HEAD && !memmem(t, left, end_title, sizeof end_title - 1))
    return 1;
  return memmem(head, n, css, sizeof css - 1) != NULL;
}

/* The checks of -o before anything is read (after the inputs'): not one
 * of the inputs, not a member-to-be of a set argument, not a file that is
 * no page of ours unless --force. */
static int check_out(const report_args *a, const char *const *inputs,
                     size_t n, char *const *set_args, size_t n_set) {
  int rc = cli_check_output(SUB, a->out, inputs, n);
  if (!rc) rc = cli_check_out_joins_set(SUB, a->out, set_args, n_set);
  if (!rc)
    rc = cli_check_replace(SUB, a->out, a->force, own_page,
                           "a page that 'ampprobe report' wrote");
  return rc;
}

/* The bisect JSON, checked: a bad file is an input error found before any
 * trace is read. */
static int load_bisect(const char *bisect_path, json_t **out) {
  *out = NULL;
  if (!bisect_path) return CLI_EXIT_OK;
  /* a file that cannot be read is that, not "not a bisect result (line
   * -1: unable to open ...)" */
  FILE *f = fopen(bisect_path, "rb");
  if (!f) {
    char esc[700];
    cli_escape_name(esc, sizeof esc, bisect_path);
    cli_error(SUB, "--bisect %s: %s", esc, strerror(errno));
    return CLI_EXIT_INPUT;
  }
  fclose(f);
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
  size_t n_paths;
  const char *first_path;
  probe_rankmap *map; /* handed to the report */
  int chosen;
  const char *why;
  char head[PROBE_RANKS_TEXT_MAX + 64];
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
  snprintf(title, sizeof title, "Ranks x steps: %d rank%s", v->set->n_rows,
           v->set->n_rows == 1 ? "" : "s");
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
  /* the line names this trace now: "checking", "analysing", "plotting" */
  cli_escape_name(a->line->name, sizeof a->line->name, path);
  probe_progress_fn fn = cli_read_line_fn(a->line);
  int rc = cli_open_trace_progress(SUB, &t, path, fn, a->line);
  if (rc == CLI_EXIT_OK && a->base_path) rc = cli_open_trace(SUB, &tb, a->base_path);
  if (rc != CLI_EXIT_OK) goto done;

  char deftitle[600], rank_label[96] = "";
  if (v) {
    snprintf(rank_label, sizeof rank_label, "%s (%s)",
             v->set->rows[v->chosen].label, v->why);
    snprintf(deftitle, sizeof deftitle, "ampprobe report: %zu traces (%.500s%s)",
             v->n_paths, v->first_path, v->n_paths > 1 ? ", ..." : "");
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
  if (st == PROBE_OK) st = probe_diag_run_progress(&diag, t, path, &dopt, fn, a->line);
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

  if (st == PROBE_OK) st = feed_trace(rep, t, 0, a->line);
  if (st == PROBE_OK && tb) {
    const probe_trace_info *bi = probe_trace_get_info(tb);
    char label[160];
    if (bi->precision_policy && bi->precision_policy[0])
      snprintf(label, sizeof label, "baseline (%.120s)", bi->precision_policy);
    else
      snprintf(label, sizeof label, "baseline");
    probe_report_set_baseline_label(rep, label);
    st = feed_trace(rep, tb, 1, a->line);
    if (st == PROBE_OK) {
      probe_diff_options fo;
      probe_diff_options_init(&fo);
      st = probe_diff_run(&diff, t, tb, &fo);
      have_diff = 1;
      if (st == PROBE_OK) st = add_diff(rep, &diff);
    }
  }
  if (st < 0) {
    const char *e = cli_trace_error(t);
    const char *eb = tb ? cli_trace_error(tb) : NULL;
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

  /* written to a temporary file renamed over `out` once complete; a file
   * that appeared there while the traces were read is checked as one that
   * was there from the start */
  cli_out o;
  rc = cli_check_replace(SUB, a->out, a->force, own_page,
                         "a page that 'ampprobe report' wrote");
  if (rc != CLI_EXIT_OK) goto done;
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
  cli_busy_done();
  if (!a->quiet) {
    char qo[1024];
    cli_escape_name(qo, sizeof qo, a->out);
    fprintf(stderr, "ampprobe: report: wrote %s (%.1f KiB) in %.2f s\n",
            qo, size / 1024.0, cli_now() - t0);
  }

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
  int rc = check_out(a, inputs, 3, NULL, 0);
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
    const char *e = cli_trace_error(NULL);
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
  set_view v;
  memset(&v, 0, sizeof v);
  probe_buf_init(&v.body);
  json_t *bisect = NULL;
  int rc = inputs ? CLI_EXIT_OK : CLI_EXIT_INTERNAL;
  for (size_t i = 0; rc == CLI_EXIT_OK && i < n; i++) {
    inputs[i] = paths[i];
    rc = cli_check_input(SUB, paths[i]);
  }
  if (rc == CLI_EXIT_OK) {
    inputs[n] = a->base_path;
    inputs[n + 1] = a->bisect_path;
    for (size_t i = n; rc == CLI_EXIT_OK && i < n + 2; i++)
      rc = inputs[i] ? cli_check_input(SUB, inputs[i]) : 0;
  }
  if (rc == CLI_EXIT_OK)
    rc = check_out(a, inputs, n + 2, args, (size_t)n_args);
  if (rc == CLI_EXIT_OK) rc = load_bisect(a->bisect_path, &bisect);
  if (rc == CLI_EXIT_OK) rc = set_build(&set, paths, n, a->ro.heat_cols, &v.map, a->line);
  if (rc == CLI_EXIT_OK) {
    v.set = &set;
    v.n_paths = n;
    v.first_path = paths[0];
    v.chosen = set_choose(&set, a->rank, &v.why);
    if (v.chosen < 0) {
      if (a->rank >= 0)
        cli_error(SUB, "--rank %lld: no readable trace of that rank in the "
                       "set", (long long)a->rank);
      else
        cli_error(SUB, "no readable trace in the set");
      rc = a->rank >= 0 ? CLI_EXIT_USAGE : CLI_EXIT_INPUT;
    }
  }
  if (rc == CLI_EXIT_OK) {
    v.problem = set_summary(&set, v.head, sizeof v.head, &v.body);
    rc = report_write(a, set.rows[v.chosen].e->path, &v, bisect, t0);
  }
  probe_rankmap_free(v.map);
  probe_buf_free(&v.body);
  json_decref(bisect);
  set_free(&set);
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
      {"force", no_argument, NULL, 'f'},
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
    case 'f': a.force = 1; break;
    case 'b': a.base_path = optarg; break;
    case 'B': a.bisect_path = optarg; break;
    case 't': a.title = optarg; break;
    case 'q': a.quiet = 1, cli_busy_quiet = 1; break;
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
  if (cli_check_out_arg(SUB, "-o", a.out)) return CLI_EXIT_USAGE;
  int arc = cli_check_trace_args(SUB, argv + optind, argc - optind);
  if (!arc) arc = cli_check_trace_files(SUB, argv + optind, argc - optind);
  if (arc) return arc;
  double t0 = cli_now();
  cli_read_line line;
  cli_read_line_init(&line, a.quiet, NULL, "the trace");
  a.line = &line;
  if (is_single(argv + optind, argc - optind))
    return report_single(&a, argv[optind], t0);
  return report_set(&a, argv + optind, argc - optind, t0);
}
