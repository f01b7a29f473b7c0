/*
 * tools/postmortem.c - `ampprobe postmortem TRACE | DIR | 'GLOB' | FILE...`:
 * the arguments are expanded into trace files (probe_trace_set_expand).
 * One file: opens it through the isolated reader (a crash inside HDF5 on a
 * malformed file becomes "corrupt trace", exit 3), runs the analysis
 * library's post-mortem (probe_diag_run, include/ampprobe/analysis.h) and
 * prints its text or its JSON document (probe_diag_render_json: the same
 * document as probe_postmortem_json). Several files, the rank traces of one
 * job: the cross-rank post-mortem (probe_ranks_run, each file read in a
 * child process). Exit 0 healthy, 1 degraded or diverged, 3 when a file (or
 * a rank file of the set) cannot be read.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "ampprobe/analysis.h"
#include "ranks-impl.h" /* probe__ranks_read_one_of_many, the library's */

static const char *SUB = "postmortem";

static void usage(FILE *f) {
  fprintf(f,
          "usage: ampprobe postmortem TRACE [--json] [--layer-history N] [-q]\n"
          "       ampprobe postmortem DIR | 'GLOB' | TRACE... [--json] [--layer-history N] [-q]\n"
          "\n"
          "Explains a trace written by 'ampprobe run' (complete, killed mid-run,"
          "\nor a flight-recorder trace): the first non-finite event (step, "
          "phase,\norigin layer, the layers that passed it on), its kind, the "
          "loss scaler's\nstory, clipping, FP16 gradient underflow, and a "
          "ranked diagnosis with\nevidence and one next step each.\n"
          "\n"
          "Several traces (a directory's .h5 files, a quoted glob, or a list) "
          "are the\nrank files of one job: it names the first non-finite value "
          "by (step, phase,\norder) with its rank, layer and site, whether it "
          "was born on one rank and\ncarried by the all-reduce or born in the "
          "all-reduce itself, steps where\nranks disagree (loss scale, skipped "
          "step, weight digest), the rank that\nstopped first, missing and "
          "unreadable rank files, then the full post-mortem\nof the rank it "
          "started on.\n"
          "\n"
          "options:\n"
          "  --json                print the findings as JSON on stdout\n"
          "  --layer-history N     points of the origin layer's absmax "
          "history (1..64,\n"
          "                        default 8)\n"
          "  -q, --quiet           no progress line (on a terminal, a file "
          "that takes\n"
          "                        over a second shows 'checking TRACE: 42%% "
          "(3.0M of\n"
          "                        7.2M rows)', then 'analysing TRACE: ...', "
          "on stderr)\n"
          "  -h, --help            this help\n"
          "\n"
          "verdict: healthy, degraded (the loss stayed finite but a layer "
          "collapsed or\nheld inf/NaN after warm-up, or another problem was "
          "found) or diverged\n(non-finite loss or weights, or the loss scale "
          "collapsed)\n"
          "\n"
          "exit: 0 healthy, 1 degraded or diverged, 2 usage (or files of "
          "different\n      runs), 3 unreadable or corrupt trace (of a set: "
          "after the diagnosis of\n      the rest), 4 internal error\n"
          "\n"
          "example:\n"
          "  ampprobe run --scenario bn-overflow --trace -o bn.h5\n"
          "  ampprobe postmortem bn.h5\n"
          "  mpirun -np 4 ampprobe run --scenario rank-bad-input --trace -o "
          "out/t.h5\n"
          "  ampprobe postmortem out/\n");
}

static int print_out(probe_status st, char *out) {
  int rc = 0;
  if (st < 0) {
    cli_error(SUB, "cannot render the result: %s", probe_status_str(st));
    rc = CLI_EXIT_INTERNAL;
  } else {
    cli_busy_done();
    fputs(out, stdout);
    rc = cli_stdout_check(SUB);
  }
  probe_free(out);
  return rc;
}

/* One trace named alone: today's post-mortem. */
static int one_trace(const char *path, int json, const probe_diag_options *opt,
                     int quiet) {
  cli_read_line pg; /* "checking t.h5: 42% (...)", then "analysing ..." */
  cli_read_line_init(&pg, quiet, path, NULL);
  probe_progress_fn fn = cli_read_line_fn(&pg);
  probe_trace *t = NULL;
  int rc0 = cli_open_trace_progress(SUB, &t, path, fn, &pg);
  if (rc0) return rc0;
  probe_diag d;
  probe_status st = probe_diag_run_progress(&d, t, path, opt, fn, &pg);
  cli_line_clear(&pg.line);
  if (st < 0) {
    const char *e = cli_trace_error(t);
    cli_error(SUB, "%s: %s%s%s", path, probe_status_str(st),
              e && *e ? ": " : "", e ? e : "");
    probe_diag_free(&d);
    probe_trace_close(t);
    /* A read that fails part-way through is a damaged file. */
    return st == PROBE_ERR_NOMEM ? CLI_EXIT_INTERNAL : CLI_EXIT_INPUT;
  }
  int rc = probe_diag_problem(&d) ? CLI_EXIT_PROBLEM : CLI_EXIT_OK;
  char *out = NULL;
  st = json ? probe_diag_render_json(&d, &out) : probe_diag_render_text(&d, &out);
  int wrc = print_out(st, out);
  probe_diag_free(&d);
  probe_trace_close(t);
  return wrc ? wrc : rc;
}

/* The rank files of one job: the cross-rank post-mortem. one_of_set: the
 * one file a directory or a glob held, read once as a set of one (the
 * summary's partial read, then the focus's full one); a rank file of a job
 * of several ranks gets the cross-rank report, whose missing ranks it
 * names (the one-process report said nothing of them), any other trace
 * the one-process report, the focus's. (It was opened isolated to ask
 * which, then read whole again: two full reads.) */
static int rank_set(const char *const *paths, size_t n, int one_of_set,
                    int json, const probe_diag_options *opt, int quiet) {
  probe_ranks_options ro;
  probe_ranks_options_init(&ro);
  ro.diag = *opt;
  ro.isolate = 1;
  probe_ranks r;
  long long bytes = 0;
  for (size_t i = 0; i < n; i++) bytes += cli_file_bytes(paths[i]);
  cli_busy(SUB, n == 1 ? paths[0] : "the rank files", bytes);
  cli_read_line pg; /* "reading rank files: N% ...", then the focus rank's */
  cli_read_line_init(&pg, quiet, NULL, "the focus rank");
  probe_status st =
      probe_ranks_run_progress(&r, paths, n, &ro, cli_read_line_fn(&pg), &pg);
  cli_line_clear(&pg.line);
  int unread = r.n_entries > 0 && r.entries[0].status == PROBE_RANK_UNREADABLE;
  if (st < 0 && one_of_set && st != PROBE_ERR_NOMEM && unread) {
    /* it cannot be read: said as for a file named alone (its words and
     * exit code: a loop of links, a corrupt file), only on this path; a
     * file read whose set is refused (a world size leaving more than
     * 65,536 ranks without a file) is refused as report refuses it (it
     * got the one-process report, no word of the set) */
    probe_ranks_free(&r);
    return one_trace(paths[0], json, opt, 1);
  }
  if (st < 0) {
    cli_error(SUB, "%s", r.error[0] ? r.error : probe_status_str(st));
    probe_ranks_free(&r);
    return cli_exit_for_status(st);
  }
  if (one_of_set && r.focus_diag && !probe__ranks_read_one_of_many(&r)) {
    int rc = probe_diag_problem(r.focus_diag) ? CLI_EXIT_PROBLEM : CLI_EXIT_OK;
    char *out = NULL;
    st = json ? probe_diag_render_json(r.focus_diag, &out)
              : probe_diag_render_text(r.focus_diag, &out);
    int wrc = print_out(st, out);
    probe_ranks_free(&r);
    return wrc ? wrc : rc;
  }
  int rc = r.n_unreadable     ? CLI_EXIT_INPUT
           : r.verdict != PROBE_VERDICT_HEALTHY ? CLI_EXIT_PROBLEM
                                                : CLI_EXIT_OK;
  char *out = NULL;
  st = json ? probe_ranks_render_json(&r, &out)
            : probe_ranks_render_text(&r, &out);
  int wrc = print_out(st, out);
  probe_ranks_free(&r);
  return wrc ? wrc : rc;
}

int cmd_postmortem(int argc, char **argv) {
  static const struct option longs[] = {
      {"json", no_argument, NULL, 'j'},
      {"layer-history", required_argument, NULL, 'H'},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int json = 0, quiet = 0;
  probe_diag_options opt;
  probe_diag_options_init(&opt);
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":hq", longs, NULL)) != -1) {
    switch (c) {
    case 'j': json = 1; break;
    case 'H': {
      int64_t v;
      if (cli_parse_i64(SUB, "--layer-history", optarg, 1, PROBE_DIAG_HISTORY_MAX,
                        &v))
        return CLI_EXIT_USAGE;
      opt.layer_history = (int)v;
      break;
    }
    case 'q': quiet = 1, cli_busy_quiet = 1; break;
    case 'h': usage(stdout); return CLI_EXIT_OK;
    default: return cli_getopt_error(SUB, argv, c);
    }
  }
  if (optind >= argc) {
    cli_error(SUB, "missing TRACE argument (see 'ampprobe postmortem --help')");
    return CLI_EXIT_USAGE;
  }
  int arc = cli_check_trace_args(SUB, argv + optind, argc - optind);
  if (!arc) arc = cli_check_trace_files(SUB, argv + optind, argc - optind);
  if (arc) return arc;
  char **paths = NULL;
  size_t n = 0;
  probe_status st = probe_trace_set_expand((const char *const *)argv + optind,
                                           (size_t)(argc - optind), &paths, &n);
  if (st < 0) {
    const char *e = cli_trace_error(NULL);
    cli_error(SUB, "%s", e && *e ? e : probe_status_str(st));
    return cli_exit_for_status(st);
  }
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) rc = cli_check_input(SUB, paths[i]);
  /* one argument naming a file is that file; a directory or a glob is a
   * set, even of one */
  struct stat sb;
  int from_set = argc - optind > 1 || stat(argv[optind], &sb) != 0 ||
                 !S_ISREG(sb.st_mode);
  if (!rc)
    rc = n == 1 && !from_set
             ? one_trace(paths[0], json, &opt, quiet)
             : rank_set((const char *const *)paths, n, n == 1, json, &opt,
                        quiet);
  probe_trace_set_free(paths, n);
  return rc;
}
