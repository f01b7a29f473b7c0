/*
 * tools/postmortem.c - `ampprobe postmortem TRACE`: opens a trace through
 * the isolated reader (a crash inside HDF5 on a malformed file becomes
 * "corrupt trace", exit 3), runs the analysis library's post-mortem
 * (probe_diag_run, include/ampprobe/analysis.h) and prints its text or its
 * JSON document (probe_diag_render_json: the same document as
 * probe_postmortem_json). Exit 0 healthy, 1 degraded or diverged.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ampprobe/analysis.h"

static const char *SUB = "postmortem";

static void usage(FILE *f) {
  fprintf(f,
          "usage: ampprobe postmortem TRACE [--json] [--layer-history N]\n"
          "\n"
          "Explains a trace written by 'ampprobe run' (complete, killed mid-run,"
          "\nor a flight-recorder trace): the first non-finite event (step, "
          "phase,\norigin layer, the layers that passed it on), its kind, the "
          "loss scaler's\nstory, clipping, FP16 gradient underflow, and a "
          "ranked diagnosis with\nevidence and one next step each.\n"
          "\n"
          "options:\n"
          "  --json                print the findings as JSON on stdout\n"
          "  --layer-history N     points of the origin layer's absmax "
          "history (1..64,\n"
          "                        default 8)\n"
          "  -h, --help            this help\n"
          "\n"
          "verdict: healthy, degraded (the loss stayed finite but a layer "
          "collapsed or\nheld inf/NaN after warm-up, or another problem was "
          "found) or diverged\n(non-finite loss or weights, or the loss scale "
          "collapsed)\n"
          "\n"
          "exit: 0 healthy, 1 degraded or diverged, 2 usage, 3 unreadable or "
          "corrupt\n      trace, 4 internal error\n"
          "\n"
          "example:\n"
          "  ampprobe run --scenario bn-overflow --trace -o bn.h5\n"
          "  ampprobe postmortem bn.h5\n");
}

int cmd_postmortem(int argc, char **argv) {
  static const struct option longs[] = {
      {"json", no_argument, NULL, 'j'},
      {"layer-history", required_argument, NULL, 'H'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int json = 0;
  probe_diag_options opt;
  probe_diag_options_init(&opt);
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
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
    case 'h': usage(stdout); return CLI_EXIT_OK;
    default: return cli_getopt_error(SUB, argv, c);
    }
  }
  if (optind >= argc) {
    cli_error(SUB, "missing TRACE argument (see 'ampprobe postmortem --help')");
    return CLI_EXIT_USAGE;
  }
  if (argc - optind > 1) {
    cli_error(SUB, "unexpected argument '%s' (one TRACE only)",
              argv[optind + 1]);
    return CLI_EXIT_USAGE;
  }
  const char *path = argv[optind];
  int in = cli_check_input(SUB, path); /* a FIFO or device: refused */
  if (in) return in;

  probe_trace *t = NULL;
  char err[512] = "";
  probe_status st = probe_trace_open_isolated(&t, path, err, sizeof err);
  if (st < 0) {
    /* the reader's message may already start with the path */
    if (err[0] && !strncmp(err, path, strlen(path)))
      cli_error(SUB, "%s", err);
    else
      cli_error(SUB, "%s: %s", path, err[0] ? err : probe_status_str(st));
    return cli_exit_for_status(st);
  }
  probe_diag d;
  st = probe_diag_run(&d, t, path, &opt);
  if (st < 0) {
    const char *e = probe_trace_last_error(t);
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
  if (st < 0) {
    cli_error(SUB, "cannot render the result: %s", probe_status_str(st));
    rc = CLI_EXIT_INTERNAL;
  } else if (fputs(out, stdout) == EOF || fflush(stdout) != 0) {
    cli_error(SUB, "cannot write standard output: %s", strerror(errno));
    rc = CLI_EXIT_INTERNAL;
  }
  probe_free(out);
  probe_diag_free(&d);
  probe_trace_close(t);
  return rc;
}
