/*
 * tools/diff.c - `ampprobe diff A.h5 B.h5`: compares a run (A, usually
 * FP16) with its baseline (B, usually FP32) layer by layer and step by step.
 * The analysis is the library's probe_diff_run (ampprobe/analysis.h); this
 * file parses options, opens both
 * traces (isolated: a malformed file is "corrupt", never a crash), and
 * renders the verdict, the alignment, the loss curves and the table sorted
 * by where divergence begins, or the same as JSON.
 * A and B may each be a set of rank traces (a directory, a quoted glob):
 * then each side is read as one job (as the post-mortem reads a set: one
 * that is not is refused), the files are paired by their rank attribute
 * and each pair is opened, compared and closed; ranks without a partner
 * are reported.
 * Exit 0 agree within tolerance, 1 diverge or not aligned (of a set: any
 * pair, or a rank without a partner), 3 an unreadable trace.
 */
#define _GNU_SOURCE /* getopt_long, strdup, open_memstream */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "ampprobe/analysis.h"

static const char *SUB = "diff";

static void usage(FILE *f) {
  fprintf(f,
"usage: ampprobe diff A.h5 B.h5 [--threshold X] [--window W] [--top N]\n"
"                     [--json] [-o FILE [--force]] [-q]\n"
"       ampprobe diff DIR_A|'GLOB_A' DIR_B|'GLOB_B' [options]\n"
"\n"
"Compares trace A with trace B (same config and seed, different precision\n"
"policy: A is usually the FP16 run, B its FP32 baseline). Layers are aligned\n"
"by name, records by site and step. For each layer and site it reports the\n"
"relative difference of absmax, RMS and L2 norm over the steps, the first\n"
"step it exceeds the threshold, the first non-finite value on either side,\n"
"and whether the error was introduced there (its inputs agreed) or carried\n"
"in from upstream. The verdict names the error introduction point: at the\n"
"first diverging step, the earliest layer whose output differs while its\n"
"inputs did not. Loss curves are compared too. Record both runs with\n"
"'ampprobe run --trace' for a step-by-step comparison.\n"
"\n"
"A and B may be sets of rank traces of two multi-rank runs (a directory of\n"
"rank files or a quoted glob): the files are paired by their rank and each\n"
"pair is compared as above; a rank found on one side only is reported.\n"
"\n"
"options:\n"
"  --threshold X    relative difference that counts as divergence\n"
"                   (default %.2f); rel = |a-b| / max(|a|,|b|). It is FP16's:\n"
"                   when a trace has BF16 layers it is multiplied by %.0f\n"
"                   (BF16 rounds 8x coarser than FP16)\n"
"  --window W       steps the RMS difference is averaged over before it is\n"
"                   compared with the threshold (default %d, 1 = per step)\n"
"  --top N          rows of the table to print (default 20, 0 = all); for\n"
"                   one pair: rank sets print one row per rank\n"
"  --json           print the result as JSON on stdout\n"
"  -o, --output F   also write the JSON result to F; an earlier result of\n"
"                   'ampprobe diff' there is replaced, any other file (a\n"
"                   trace, a text) is refused without --force. Not one of\n"
"                   the traces, and not a *.h5 name inside a set's\n"
"                   directory (it would join the set)\n"
"  --force          replace F even when it is not a result of diff\n"
"  -q, --quiet      no progress line (on a terminal, a long diff shows\n"
"                   checking A, checking B, then comparing: NN%%)\n"
"  -h, --help       this help\n"
"\n"
"exit: 0 A agrees with B within tolerance, 1 they diverge or do not align,\n"
"      2 usage error, 3 unreadable or corrupt trace, 4 cannot write output\n"
"\n"
"example:\n"
"  ampprobe run --scenario revin-overflow --trace -o fp16.h5\n"
"  ampprobe run --scenario revin-overflow --precision fp32 --trace -o fp32.h5\n"
"  ampprobe diff fp16.h5 fp32.h5\n",
          PROBE_DIFF_DEFAULT_THRESHOLD,
          PROBE_DIFF_BF16_THRESHOLD_FACTOR, PROBE_DIFF_DEFAULT_WINDOW);
}

static void fmt_step(char *b, size_t n, int64_t s) {
  if (s < 0)
    snprintf(b, n, "-");
  else
    snprintf(b, n, "%lld", (long long)s);
}

static void fmt_val(char *b, size_t n, double x) { probe_num_format(b, n, x, 6); }

static void print_text(const probe_diff *d, const char *pa, const char *pb,
                       int top) {
  FILE *f = stdout;
  char ea[1024], eb[1024];
  probe_text_escape(ea, sizeof ea, pa);
  probe_text_escape(eb, sizeof eb, pb);
  fprintf(f, "ampprobe diff: A = %s (%s)\n", ea, d->policy_a[0] ? d->policy_a : "?");
  fprintf(f, "               B = %s (%s)\n\n", eb, d->policy_b[0] ? d->policy_b : "?");
  fprintf(f, "verdict: %s\n\n",
          d->verdict == PROBE_DIFF_AGREE     ? "AGREE"
          : d->verdict == PROBE_DIFF_DIVERGE ? "DIVERGE"
                                             : "NOT ALIGNED");
  fprintf(f, "  %s\n\n", d->verdict_text);

  fprintf(f, "alignment\n");
  fprintf(f, "  layers          %lld in common (A %lld, B %lld)\n",
          (long long)d->n_layers_common, (long long)d->n_layers_a,
          (long long)d->n_layers_b);
  char s1[32], s2[32];
  fmt_step(s1, sizeof s1, d->first_common_step);
  fmt_step(s2, sizeof s2, d->last_common_step);
  fprintf(f, "  steps           %lld with per-layer records in both (%s..%s; "
             "A %lld, B %lld)\n",
          (long long)d->steps_common, s1, s2, (long long)d->steps_a,
          (long long)d->steps_b);
  size_t nc = d->n_config_diff;
  if (!d->config_compared) { /* "identical" would claim a comparison */
    fprintf(f, "  config          not compared (a trace holds no readable "
               "configuration: see the notes)\n");
  } else if (nc == 0) {
    fprintf(f, "  config          identical\n");
  } else {
    fprintf(f, "  config          %zu difference%s%s\n", nc, nc > 1 ? "s" : "",
            d->config_other ? " (beyond the precision policy)" : " (precision "
                                                                 "policy only)");
    for (size_t i = 0; i < nc && i < 12; i++) {
      const probe_diff_config_row *row = &d->config_diff[i];
      char va[256], vb[256];
      probe_text_escape(va, sizeof va, row->a ? row->a : "null");
      probe_text_escape(vb, sizeof vb, row->b ? row->b : "null");
      fprintf(f, "    %-30s A %s  B %s\n", row->key, va, vb);
    }
    if (nc > 12)
      fprintf(f, "    ... %zu more (see --json)\n", nc - 12);
  }
  for (int i = 0; i < d->n_notes; i++)
    fprintf(f, "  note            %s\n", d->notes[i]);

  char a[32], b[32];
  fprintf(f, "\nloss\n");
  fprintf(f, "  steps compared  %lld\n", (long long)d->loss_steps);
  fmt_val(a, sizeof a, d->final_loss_a);
  fmt_val(b, sizeof b, d->final_loss_b);
  fprintf(f, "  final           A %s  B %s", a, b);
  if (isfinite(d->final_loss_rel))
    fprintf(f, "  (%.2f%% apart; mean of the last 10 common steps)",
            100.0 * d->final_loss_rel);
  else if (d->loss_steps > 0)
    fprintf(f, "  (not comparable: a non-finite loss among the last 10 "
               "common steps)");
  fprintf(f, "\n");
  if (d->loss_part_step >= 0) {
    fmt_val(a, sizeof a, d->loss_a_at_part);
    fmt_val(b, sizeof b, d->loss_b_at_part);
    fprintf(f, "  curves part     at step %lld (A %s, B %s)\n",
            (long long)d->loss_part_step, a, b);
  } else {
    fprintf(f, "  curves part     never (largest difference %.3g)\n",
            d->max_loss_rel);
  }
  if (d->first_nonfinite_loss_a >= 0 || d->first_nonfinite_loss_b >= 0) {
    fmt_step(s1, sizeof s1, d->first_nonfinite_loss_a);
    fmt_step(s2, sizeof s2, d->first_nonfinite_loss_b);
    fprintf(f, "  non-finite loss A from step %s, B from step %s\n", s1, s2);
  }

  if (d->n_entries == 0)
    return;
  fprintf(f, "\nlayers (sorted by where divergence begins)\n");
  fprintf(f, "  %-16s %-13s %9s %7s %7s %9s %8s %10s %10s %11s\n", "layer",
          "site", "first div", "rel@div", "max win", "1st exceed", "max step",
          "nonfin A/B", "local/carr", "zeros A/B");
  size_t n = top > 0 && (size_t)top < d->n_entries ? (size_t)top : d->n_entries;
  for (size_t i = 0; i < n; i++) {
    const probe_diff_entry *e = &d->entries[i];
    char fd[24], ra[16], fe[24], nf[72], lc[48], zz[40], mw[16], ms[16];
    fmt_step(fd, sizeof fd, e->first_div_step);
    if (e->first_div_step >= 0)
      snprintf(ra, sizeof ra, "%.3g", e->first_div_rel);
    else
      snprintf(ra, sizeof ra, "-");
    fmt_step(fe, sizeof fe, e->first_exceed_step);
    fmt_step(s1, sizeof s1, e->first_nonfinite_a);
    fmt_step(s2, sizeof s2, e->first_nonfinite_b);
    snprintf(nf, sizeof nf, "%s/%s", s1, s2);
    snprintf(lc, sizeof lc, "%lld/%lld", (long long)e->local_steps,
             (long long)e->carried_steps);
    if (e->count_a && e->count_b)
      snprintf(zz, sizeof zz, "%.0f%%/%.0f%%%s",
               100.0 * (double)e->zero_a / (double)e->count_a,
               100.0 * (double)e->zero_b / (double)e->count_b,
               e->flushes_to_zero ? "!" : "");
    else
      snprintf(zz, sizeof zz, "-"); /* no step compared */
    double mx = fmax(e->max_rel_absmax, fmax(e->max_rel_rms, e->max_rel_l2));
    if (e->steps > e->steps_left_out) {
      snprintf(mw, sizeof mw, "%.3g", e->max_window_rel);
      snprintf(ms, sizeof ms, "%.3g", mx);
    } else { /* every step left out (the scaler skipped them): no figure */
      snprintf(mw, sizeof mw, "-");
      snprintf(ms, sizeof ms, "-");
    }
    fprintf(f, "  %-16s %-13s %9s %7s %7s %10s %8s %10s %10s %11s\n",
            e->layer, probe_site_name((probe_site)e->site), fd, ra, mw, fe, ms,
            nf, lc, zz);
  }
  if (n < d->n_entries)
    fprintf(f, "  ... %zu more rows (--top 0 shows all)\n", d->n_entries - n);
  fprintf(f,
          "\n  first div: first step the RMS difference averaged over %d "
          "steps exceeds %.3g (or one side is non-finite); rel@div, max win:\n"
          "  that windowed difference (rel@div 1: one side non-finite); 1st "
          "exceed, max step: the same\n"
          "  for the largest single-step difference of absmax, RMS or L2; "
          "local/carr: diverging steps\n"
          "  whose inputs agreed (error introduced here) / already differed "
          "(carried in); '!': gradients\n"
          "  underflowed to zero in A; '-': nothing compared (every step left "
          "out: its scaler skipped it)\n",
          d->opt.window, d->threshold_used);
}

/* 1 when a file starts as what diff -o writes: the JSON of one pair
 * (probe_diff_json: "verdict", then "summary") or of two sets ("verdict",
 * then "kind": "ranks"), as both are indented. */
static int own_result(const char *head, size_t n) {
  static const char *const verdicts[] = {"agree", "diverge", "not-aligned"};
  static const char start[] = "{\n  \"verdict\": \"";
  if (n < sizeof start - 1 || memcmp(head, start, sizeof start - 1)) return 0;
  const char *p = head + sizeof start - 1, *end = head + n;
  for (size_t i = 0; i < 3; i++) {
    size_t k = strlen(verdicts[i]);
    if ((size_t)(end - p) < k || memcmp(p, verdicts[i], k)) continue;
    static const char pair[] = "\",\n  \"summary\": \"";
    static const char set[] = "\",\n  \"kind\": \"ranks\",";
    const char *q = p + k;
    return ((size_t)(end - q) >= sizeof pair - 1 && !memcmp(q, pair, sizeof pair - 1)) ||
           ((size_t)(end - q) >= sizeof set - 1 && !memcmp(q, set, sizeof set - 1));
  }
  return 0;
}

static const char *const OWN = "a result that 'ampprobe diff' wrote";

/* The checks of -o, after the inputs': not one of the n inputs, not a
 * member-to-be of a set argument (args, the two), not a file that is no
 * result of ours unless --force. */
static int check_out(const char *out, int force, const char *const *inputs,
                     size_t n, char *const *args) {
  int rc = cli_check_output(SUB, out, inputs, n);
  if (!rc) rc = cli_check_out_joins_set(SUB, out, args, 2);
  if (!rc) rc = cli_check_replace(SUB, out, force, own_result, OWN);
  return rc;
}

/* Writes the JSON to -o; a file that appeared there while the traces were
 * read is checked as one that was there from the start. */
static int write_out(const char *out, int force, const char *doc) {
  if (cli_check_replace(SUB, out, force, own_result, OWN)) return CLI_EXIT_USAGE;
  return cli_write_text(SUB, out, doc) ? CLI_EXIT_INTERNAL : 0; /* temp + rename */
}

/* Two single traces: today's diff. */
static int diff_two(const char *pa, const char *pb,
                    const probe_diff_options *optp, int json, const char *out,
                    int force, char *const *args, int64_t top, int quiet) {
  probe_diff_options opt = *optp;
  /* the file rules (tools/cli.h): regular-file inputs, -o none of them */
  const char *inputs[2] = {pa, pb};
  int fr = cli_check_input(SUB, pa);
  if (!fr) fr = cli_check_input(SUB, pb);
  if (!fr) fr = check_out(out, force, inputs, 2, args);
  if (fr) return fr;
  probe_trace *ta = NULL, *tb = NULL;
  /* "checking A.h5: 42% (...)", the same for B, then "comparing A.h5 and
   * B.h5: ..." */
  cli_read_line pg;
  cli_read_line_init(&pg, quiet, pa, NULL);
  probe_progress_fn fn = cli_read_line_fn(&pg);
  int orc = cli_open_trace_progress(SUB, &ta, pa, fn, &pg);
  if (orc) return orc;
  cli_read_line_name(&pg, pb, NULL);
  orc = cli_open_trace_progress(SUB, &tb, pb, fn, &pg);
  if (orc) {
    probe_trace_close(ta);
    return orc;
  }
  char ea_[300], eb_[300], both[640];
  cli_escape_name(ea_, sizeof ea_, pa);
  cli_escape_name(eb_, sizeof eb_, pb);
  snprintf(both, sizeof both, "%s and %s", ea_, eb_);
  cli_read_line_name(&pg, NULL, both);
  probe_diff d;
  probe_status st = probe_diff_run_progress(&d, ta, tb, &opt, fn, &pg);
  cli_line_clear(&pg.line);
  if (st < 0) {
    const char *ea = cli_trace_error(ta), *eb = cli_trace_error(tb);
    const char *e = ea && *ea ? ea : (eb && *eb ? eb : "");
    cli_error(SUB, "reading %s / %s: %s%s%s", pa, pb, probe_status_str(st),
              *e ? ": " : "", e);
    probe_diff_free(&d);
    probe_trace_close(ta);
    probe_trace_close(tb);
    return st == PROBE_ERR_NOMEM ? CLI_EXIT_INTERNAL : CLI_EXIT_INPUT;
  }
  int rc = d.verdict == PROBE_DIFF_AGREE ? CLI_EXIT_OK : CLI_EXIT_PROBLEM;
  char *j = NULL;
  if ((json || out) && probe_diff_json(&d, pa, pb, &j) != PROBE_OK) {
    cli_error(SUB, "cannot render the result: out of memory");
    rc = CLI_EXIT_INTERNAL;
  }
  /* a -o that cannot be written (its error line is printed) does not
   * lose the result: stdout still gets it, the write's error is the exit */
  int wrc = out && j ? write_out(out, force, j) : 0;
  cli_busy_done();
  if (rc == CLI_EXIT_INTERNAL) {
    /* the error is reported: nothing on stdout (docs/cli.md) */
  } else if (json && j) {
    fputs(j, stdout);
    if (cli_stdout_check(SUB) != 0) rc = CLI_EXIT_INTERNAL;
  } else if (!json) {
    print_text(&d, pa, pb, (int)top);
    if (cli_stdout_check(SUB) != 0) rc = CLI_EXIT_INTERNAL;
  }
  probe_free(j);
  probe_diff_free(&d);
  probe_trace_close(ta);
  probe_trace_close(tb);
  return wrc ? wrc : rc;
}

/* ---- sets of rank traces ------------------------------------------------- */

/* One side: its files, read as a set by the rank post-mortem's reader
 * (probe_ranks_run: one job or refused, every file in a forked worker, in
 * part), whose entries give each rank's file; the pair compared is opened
 * then and closed after, so memory holds two traces at most (every trace of
 * both sides stayed open: 650 MB for two sets of 500 ranks). */
typedef struct side {
  char **paths;
  size_t n;
  probe_ranks r;
  int have_r;
} side;

static void side_free(side *s) {
  if (s->have_r) probe_ranks_free(&s->r);
  probe_trace_set_free(s->paths, s->n);
}

/* Reads a side as one job; the line (may be off) counts its files.
 * Returns 0, or the exit code after the one-line error: a set that is not
 * one job (mixed run ids or world sizes, a rank twice) is refused as the
 * post-mortem refuses it. */
static int side_open(side *s, const char *label, cli_read_line *pg) {
  probe_ranks_options ro;
  probe_ranks_options_init(&ro);
  ro.isolate = 1;
  ro.focus_diag = 0;
  cli_read_line_name(pg, NULL, label);
  probe_status st = probe_ranks_run_progress(&s->r, (const char *const *)s->paths,
                                             s->n, &ro, cli_read_line_fn(pg), pg);
  s->have_r = 1;
  if (st == PROBE_ERR_INTERRUPTED) return CLI_EXIT_INTERRUPTED;
  int any_read = 0;
  for (size_t i = 0; i < s->r.n_entries; i++)
    any_read |= s->r.entries[i].status == PROBE_RANK_READ;
  /* refused (not one job, a corrupt world size or rank number): every
   * failure but the one where no file could be read, whose files are
   * rows of the result (UNREADABLE, exit 3) */
  if (st < 0 && (any_read || st == PROBE_ERR_INVALID_ARG || st == PROBE_ERR_NOMEM)) {
    cli_line_clear(&pg->line);
    cli_error(SUB, "%s: %s", label, s->r.error[0] ? s->r.error : probe_status_str(st));
    return st == PROBE_ERR_NOMEM ? CLI_EXIT_INTERNAL : cli_exit_for_status(st);
  }
  return 0;
}

/* The entry of rank r read on a side, NULL none. */
static const probe_rank_entry *side_find(const side *s, int32_t r) {
  for (size_t i = 0; i < s->r.n_entries; i++) {
    const probe_rank_entry *e = &s->r.entries[i];
    if (e->status == PROBE_RANK_READ && e->rank == r) return e;
  }
  return NULL;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* The ranks read on either side, sorted and unique. */
static int32_t *union_ranks(const side *a, const side *b, size_t *n) {
  int32_t *u = malloc((a->r.n_entries + b->r.n_entries + 1) * sizeof *u);
  if (!u) return NULL;
  size_t k = 0;
  const side *sd[2] = {a, b};
  for (int j = 0; j < 2; j++)
    for (size_t i = 0; i < sd[j]->r.n_entries; i++)
      if (sd[j]->r.entries[i].status == PROBE_RANK_READ)
        u[k++] = sd[j]->r.entries[i].rank;
  qsort(u, k, sizeof *u, cmp_i32);
  size_t m = 0;
  for (size_t i = 0; i < k; i++)
    if (m == 0 || u[m - 1] != u[i]) u[m++] = u[i];
  *n = m;
  return u;
}

static const char *verdict_word(probe_diff_verdict v) {
  return v == PROBE_DIFF_AGREE     ? "agree"
         : v == PROBE_DIFF_DIVERGE ? "diverge"
                                   : "not-aligned";
}

/* " (A not closed)", " (A and B not closed)" or "": a trace its writer did
 * not close (killed) compares only the steps it reached. */
static const char *not_closed(const probe_rank_entry *ea, const probe_rank_entry *eb) {
  return !ea->complete && !eb->complete ? " (A and B not closed)"
         : !ea->complete                ? " (A not closed)"
         : !eb->complete                ? " (B not closed)"
                                        : "";
}

/* "A rank 1 signal SIGTERM, A rank 0 another rank's stop": the abort
 * marks of a side's ranks, the first 4 (escaped when read). */
static void aborted_reasons(FILE *f, const side *s, const char *name) {
  int64_t shown = 0;
  for (size_t i = 0; i < s->r.n_entries; i++) {
    const probe_rank_entry *e = &s->r.entries[i];
    if (e->status != PROBE_RANK_READ || e->complete || !e->aborted[0]) continue;
    if (shown++ == 4) {
      fprintf(f, ", ...");
      break;
    }
    fprintf(f, "%s%s rank %d ended by %.200s", shown > 1 ? ", " : "", name,
            (int)e->rank, e->aborted);
  }
}

/* One pair, both files opened (isolated) for it and closed after: a text
 * row and a JSON entry. Returns its verdict or -1. */
static int diff_pair_row(const probe_rank_entry *ea, const probe_rank_entry *eb,
                         const probe_diff_options *opt, json_t *pairs, FILE *f,
                         cli_read_line *pg, int with_diff) {
  int32_t rank = ea->rank;
  probe_diff d;
  memset(&d, 0, sizeof d);
  char who[32], err[512] = "";
  snprintf(who, sizeof who, "rank %d", (int)rank);
  cli_read_line_name(pg, NULL, who);
  probe_trace *ta = NULL, *tb = NULL;
  probe_status st = probe_trace_open_isolated(&ta, ea->path, err, sizeof err);
  if (st >= 0) st = probe_trace_open_isolated(&tb, eb->path, err, sizeof err);
  if (st >= 0)
    st = probe_diff_run_progress(&d, ta, tb, opt, cli_read_line_fn(pg), pg);
  json_t *e = json_object();
  json_object_set_new(e, "rank", json_integer(rank));
  json_object_set_new(e, "trace_a", cli_json_text(ea->path));
  json_object_set_new(e, "trace_b", cli_json_text(eb->path));
  json_object_set_new(e, "closed_a", json_boolean(ea->complete));
  json_object_set_new(e, "closed_b", json_boolean(eb->complete));
  int v = -1;
  if (st < 0) {
    char m[600];
    probe_text_escape(m, sizeof m, err[0] ? err : probe_status_str(st));
    json_object_set_new(e, "verdict", json_string("error"));
    json_object_set_new(e, "error", cli_json_text(err[0] ? err : probe_status_str(st)));
    fprintf(f, "%5d  error: %s\n", (int)rank, m);
  } else {
    v = (int)d.verdict;
    char *doc = NULL;
    json_object_set_new(e, "verdict", json_string(verdict_word(d.verdict)));
    /* the pair's whole document only where JSON is written (it is most
     * of the memory of a large set) */
    if (with_diff && probe_diff_json(&d, ea->path, eb->path, &doc) == PROBE_OK) {
      json_t *dj = json_loads(doc, 0, NULL);
      if (dj) json_object_set_new(e, "diff", dj);
    }
    probe_free(doc);
    char where[200] = "-";
    if (d.intro.found)
      snprintf(where, sizeof where, "step %lld %s/%s", (long long)d.intro.step,
               d.intro.layer, probe_site_name((probe_site)d.intro.site));
    fprintf(f, "%5d  %-11s  %s%s\n", (int)rank,
            d.verdict == PROBE_DIFF_AGREE     ? "AGREE"
            : d.verdict == PROBE_DIFF_DIVERGE ? "DIVERGE"
                                              : "NOT ALIGNED",
            where, not_closed(ea, eb));
  }
  json_array_append_new(pairs, e);
  probe_diff_free(&d);
  if (ta) probe_trace_close(ta);
  if (tb) probe_trace_close(tb);
  return v;
}

static void unreadable_rows(const side *s, const char *label, json_t *arr,
                            FILE *f) {
  for (size_t i = 0; i < s->r.n_entries; i++) {
    const probe_rank_entry *e = &s->r.entries[i];
    if (e->status != PROBE_RANK_UNREADABLE) continue;
    char p[1024], m[1024];
    const char *err = e->error ? e->error : "unreadable";
    size_t pl = strlen(e->path);
    /* the reader's message often starts with the path already: once */
    if (pl && !strncmp(err, e->path, pl) && err[pl] == ':')
      err += pl + 1 + (err[pl + 1] == ' ');
    probe_text_escape(p, sizeof p, e->path);
    probe_text_escape(m, sizeof m, err);
    fprintf(f, "UNREADABLE %s: %s: %s\n", label, p, m);
    json_t *j = json_object();
    json_object_set_new(j, "side", json_string(label));
    json_object_set_new(j, "path", cli_json_text(e->path));
    json_object_set_new(j, "error", cli_json_text(e->error ? e->error : "unreadable"));
    json_array_append_new(arr, j);
  }
}

/* Compares two sets rank by rank. */
static int diff_sets(side *a, side *b, const probe_diff_options *opt, int json,
                     const char *out, int force, int quiet) {
  cli_read_line pg; /* "reading rank files: ...", "comparing rank 3: ..." */
  cli_read_line_init(&pg, quiet, NULL, NULL);
  int rc0 = side_open(a, "A", &pg);
  if (!rc0) rc0 = side_open(b, "B", &pg);
  if (rc0) return rc0;
  size_t nu = 0;
  int32_t *u = union_ranks(a, b, &nu);
  char *text = NULL;
  size_t tlen = 0;
  FILE *f = open_memstream(&text, &tlen);
  json_t *root = json_object(), *pairs = json_array(), *oa = json_array(),
         *ob = json_array(), *bad = json_array();
  if (!u || !f || !root) {
    cli_error(SUB, "out of memory");
    return CLI_EXIT_INTERNAL;
  }
  fprintf(f, "\n rank  verdict      error introduced at\n");
  int worst = PROBE_DIFF_AGREE, failed = 0;
  for (size_t i = 0; i < nu; i++) {
    const probe_rank_entry *ea = side_find(a, u[i]), *eb = side_find(b, u[i]);
    if (!ea || !eb) {
      fprintf(f, "%5d  only in %s\n", (int)u[i], !ea ? "B" : "A");
      json_array_append_new(!ea ? ob : oa, json_integer(u[i]));
      if (worst == PROBE_DIFF_AGREE) worst = PROBE_DIFF_NOT_ALIGNED;
      continue;
    }
    int v = diff_pair_row(ea, eb, opt, pairs, f, &pg, json || out);
    if (v < 0) failed = 1;
    else if (v == PROBE_DIFF_DIVERGE) worst = PROBE_DIFF_DIVERGE;
    else if (v == PROBE_DIFF_NOT_ALIGNED && worst == PROBE_DIFF_AGREE)
      worst = PROBE_DIFF_NOT_ALIGNED;
  }
  cli_line_clear(&pg.line);
  unreadable_rows(a, "A", bad, f);
  unreadable_rows(b, "B", bad, f);
  /* traces their writers did not close: each pair compared the steps both
   * reached; the verdict holds for those only */
  int64_t nca = a->r.n_incomplete, ncb = b->r.n_incomplete;
  /* of those, the traces with the abort mark say what ended them: a
   * recorded reason, not a guess */
  int64_t kla = nca - a->r.n_aborted, klb = ncb - b->r.n_aborted;
  if (kla || klb)
    fprintf(f, "note: %lld trace%s of A and %lld of B were not closed "
               "(killed?): their pairs compare the steps both reached\n",
            (long long)kla, kla == 1 ? "" : "s", (long long)klb);
  if (a->r.n_aborted || b->r.n_aborted) {
    fprintf(f, "note: %lld trace%s of A and %lld of B were marked aborted "
               "(",
            (long long)a->r.n_aborted, a->r.n_aborted == 1 ? "" : "s",
            (long long)b->r.n_aborted);
    aborted_reasons(f, a, "A");
    if (a->r.n_aborted && b->r.n_aborted) fputs("; ", f);
    aborted_reasons(f, b, "B");
    fputs("): their pairs compare the steps both reached\n", f);
  }
  fclose(f);
  json_object_set_new(root, "verdict", json_string(verdict_word(worst)));
  json_object_set_new(root, "kind", json_string("ranks"));
  json_object_set_new(root, "pairs", pairs);
  json_object_set_new(root, "only_a", oa);
  json_object_set_new(root, "only_b", ob);
  json_object_set_new(root, "unreadable", bad);
  json_object_set_new(root, "not_closed_a", json_integer(nca));
  json_object_set_new(root, "not_closed_b", json_integer(ncb));
  json_object_set_new(root, "aborted_a", json_integer(a->r.n_aborted));
  json_object_set_new(root, "aborted_b", json_integer(b->r.n_aborted));
  int rc = json_array_size(bad) || failed  ? CLI_EXIT_INPUT
           : worst == PROBE_DIFF_AGREE ? CLI_EXIT_OK
                                       : CLI_EXIT_PROBLEM;
  char *doc = json_dumps(root, JSON_INDENT(2));
  int wrc = out && doc ? write_out(out, force, doc) : 0; /* as diff_two */
  cli_busy_done();
  if (rc != CLI_EXIT_INTERNAL) {
    if (json && doc)
      printf("%s\n", doc);
    else if (!json)
      printf("ampprobe diff: %zu rank%s compared, A %zu file%s, B %zu "
             "file%s\nverdict: %s\n%s",
             json_array_size(pairs), json_array_size(pairs) == 1 ? "" : "s",
             a->n, a->n == 1 ? "" : "s", b->n, b->n == 1 ? "" : "s",
             worst == PROBE_DIFF_AGREE     ? "AGREE"
             : worst == PROBE_DIFF_DIVERGE ? "DIVERGE"
                                           : "NOT ALIGNED",
             text ? text : "");
    if (cli_stdout_check(SUB) != 0) rc = CLI_EXIT_INTERNAL;
  }
  free(doc);
  free(text);
  free(u);
  json_decref(root);
  return wrc ? wrc : rc;
}

static int expand(const char *arg, side *s) {
  memset(s, 0, sizeof *s);
  probe_status st = probe_trace_set_expand(&arg, 1, &s->paths, &s->n);
  if (st < 0) {
    const char *e = cli_trace_error(NULL);
    cli_error(SUB, "%s", e && *e ? e : probe_status_str(st));
    return cli_exit_for_status(st);
  }
  return 0;
}

int cmd_diff(int argc, char **argv) {
  static const struct option longs[] = {
      {"threshold", required_argument, NULL, 't'},
      {"top", required_argument, NULL, 'n'},
      {"window", required_argument, NULL, 'w'},
      {"json", no_argument, NULL, 'j'},
      {"output", required_argument, NULL, 'o'},
      {"quiet", no_argument, NULL, 'q'},
      {"force", no_argument, NULL, 'f'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  probe_diff_options opt;
  probe_diff_options_init(&opt);
  int json = 0, force = 0, quiet = 0;
  int64_t top = 20;
  const char *out = NULL;
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":o:qh", longs, NULL)) != -1) {
    switch (c) {
    case 't':
      if (cli_parse_double_gt(SUB, "--threshold", optarg, 0, 1.0,
                              &opt.threshold))
        return CLI_EXIT_USAGE;
      break;
    case 'n':
      if (cli_parse_i64(SUB, "--top", optarg, 0, 1000000, &top))
        return CLI_EXIT_USAGE;
      break;
    case 'w': {
      int64_t w;
      if (cli_parse_i64(SUB, "--window", optarg, 1, PROBE_DIFF_MAX_WINDOW, &w))
        return CLI_EXIT_USAGE;
      opt.window = (int)w;
      break;
    }
    case 'j': json = 1; break;
    case 'o': out = optarg; break;
    case 'f': force = 1; break;
    case 'q': quiet = 1; break;
    case 'h': usage(stdout); return CLI_EXIT_OK;
    default: return cli_getopt_error(SUB, argv, c);
    }
  }
  if (argc - optind != 2) {
    cli_error(SUB, "%s (see 'ampprobe diff --help')",
              argc - optind < 2 ? "expected two traces: A.h5 B.h5"
                                : "too many arguments: expected A.h5 B.h5");
    return CLI_EXIT_USAGE;
  }
  int rc = cli_check_trace_args(SUB, argv + optind, 2);
  if (!rc) rc = cli_check_out_arg(SUB, "-o", out);
  if (rc) return rc;
  side a, b;
  rc = expand(argv[optind], &a);
  if (rc) return rc;
  rc = expand(argv[optind + 1], &b);
  if (rc) {
    side_free(&a);
    return rc;
  }
  if (a.n == 1 && b.n == 1) {
    rc = diff_two(a.paths[0], b.paths[0], &opt, json, out, force,
                  argv + optind, top, quiet);
  } else {
    for (size_t i = 0; i < a.n && !rc; i++) rc = cli_check_input(SUB, a.paths[i]);
    for (size_t i = 0; i < b.n && !rc; i++) rc = cli_check_input(SUB, b.paths[i]);
    /* -o none of the files of either set (the file rules, tools/cli.h) */
    if (!rc) rc = cli_check_output(SUB, out, (const char *const *)a.paths, a.n);
    if (!rc) rc = check_out(out, force, (const char *const *)b.paths, b.n,
                            argv + optind);
    if (!rc) rc = diff_sets(&a, &b, &opt, json, out, force, quiet);
  }
  side_free(&a);
  side_free(&b);
  return rc;
}
