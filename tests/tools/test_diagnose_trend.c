/*
 * tests/tools/test_diagnose_trend.c - Check suite for what the post-mortem
 * reads from the run's course rather than from one non-finite value
 * (libprobe/analysis/diagnose_trend.c and its rules): a finite loss that
 * diverges (loss-diverging, a lower-lr finding) and a streak of skipped
 * steps in the middle of a run (skip-streak). A hunt on unseen models
 * (2026-12-04) found both called healthy: a loss from 0.5 to 1e6, every
 * value finite; 50 steps skipped after 500 good ones, the scale halving
 * at each.
 *
 * Each case writes a trace of a 3-layer model (enc.fc1 -> head.fc2 ->
 * loss, FP16 but the loss) through the libprobe writer and reads it back
 * isolated; the tables hold the cases that must fire and the ones that
 * must stay healthy (a noisy loss, a warm-up that doubles it, a loss that
 * starts high, isolated and routine skips, a warm-up's backoffs). The
 * checks use the verdict and the findings' names and text only.
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/analysis.h"
#include "ampprobe/probe.h"
#include "probe_testutil.h"
#include "diag_testutil.h"

#define N 16

/* a path in this process's test folder, removed with it (pt_path) */
static char path_buf[256];
static const char *tmp_path(const char *tag) {
  pt_path(path_buf, sizeof path_buf, tag);
  return path_buf;
}

/* N values v * (0.5 + i/N), the first inf of them +inf. The data must stay
 * valid until probe_step_end: each record of a step has its own buffer. */
#define PUT_BUFFERS 32
static void put(probe_session *s, int32_t id, probe_site site, float v, int inf) {
  static float pool[PUT_BUFFERS][N];
  static unsigned next;
  float *x = pool[next++ % PUT_BUFFERS];
  for (int i = 0; i < N; i++) x[i] = v * (0.5f + (float)i / N);
  for (int i = 0; i < inf; i++) x[i] = INFINITY;
  ck_assert_int_eq(probe_tensor_record(s, id, site, PROBE_DTYPE_F32, x, N),
                   PROBE_OK);
}

/* A deterministic noise factor exp(sigma * z), z ~ N(0, 1) (Box-Muller on
 * a fixed LCG), so a case is the same at every run. */
static double noise(unsigned *state, double sigma) {
  *state = *state * 1103515245u + 12345u;
  double u1 = ((*state >> 8) + 1.0) / 16777218.0;
  *state = *state * 1103515245u + 12345u;
  double u2 = ((*state >> 8) + 1.0) / 16777218.0;
  return exp(sigma * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- the run's course, one case a row --------------------------------------- */

typedef struct run_case {
  const char *tag;
  int n;                          /* steps */
  double (*loss)(int s, int n);   /* the loss (before noise) */
  double sigma;                   /* log-normal noise of the loss, 0: none */
  int grow_from;                  /* head.fc2's activations grow from this
                                     step on (-1: none) */
  int (*skip)(int s, int n);      /* skipped steps (NULL: none) */
  int inf_fc1;                    /* the skipped steps' inf is made in
                                     enc.fc1's weight gradient (else in
                                     head.fc2's) */
  int fp32;                       /* every module in FP32 */
  int growth_interval;            /* the scaler doubles the scale after
                                     this many clean steps (0: 2000, as
                                     GradScaler), up to 65536 */
  /* expected */
  probe_verdict verdict;
  const char *finding;            /* a finding of this name ranks first
                                     (NULL: healthy, and nothing else) */
  const char *text[3];            /* in that finding's text */
} run_case;

/* head.fc2's name in the trace (test_json_keys gives it a hostile one) */
static const char *fc2_name = "head.fc2";

static void write_run(const char *p, const run_case *c) {
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.overwrite = 1;
  o.precision_policy = c->fp32 ? "fp32" : "fp16";
  o.command_line = "ampprobe run --scenario unit --trace";
  o.config_json = "{\"name\": \"unit\"}";
  probe_session *s = NULL;
  ck_assert_int_eq(probe_session_open(&s, p, &o), PROBE_OK);
  probe_dtype prec = c->fp32 ? PROBE_DTYPE_F32 : PROBE_DTYPE_F16;
  int32_t fc1, fc2, loss;
  ck_assert_int_eq(probe_layer_register(s, "enc.fc1", PROBE_KIND_LINEAR, prec, &fc1), PROBE_OK);
  ck_assert_int_eq(probe_layer_register(s, fc2_name, PROBE_KIND_LINEAR, prec, &fc2), PROBE_OK);
  ck_assert_int_eq(probe_layer_register(s, "loss", PROBE_KIND_LOSS, PROBE_DTYPE_F32, &loss), PROBE_OK);
  double scale = c->fp32 ? 1.0 : 65536.0;
  int interval = c->growth_interval > 0 ? c->growth_interval : 2000, tracker = 0;
  unsigned rng = 12345u;
  for (int step = 0; step < c->n; step++) {
    double l = c->loss(step, c->n) * (c->sigma > 0 ? noise(&rng, c->sigma) : 1.0);
    /* head.fc2's activations grow x10 every 30 steps from grow_from on */
    double g = c->grow_from >= 0 && step >= c->grow_from
                   ? pow(10.0, (step - c->grow_from) / 30.0)
                   : 1.0;
    int skip = c->skip && c->skip(step, c->n);
    int inf2 = skip && !c->inf_fc1 ? 2 : 0, inf1 = skip ? 2 : 0;
    ck_assert_int_eq(probe_step_begin(s, step), PROBE_OK);
    put(s, fc1, PROBE_SITE_FWD_IN, 1.0f, 0);
    put(s, fc1, PROBE_SITE_WEIGHT, 0.5f, 0);
    put(s, fc1, PROBE_SITE_FWD_OUT, 2.0f, 0);
    put(s, fc2, PROBE_SITE_FWD_IN, 2.0f, 0);
    put(s, fc2, PROBE_SITE_WEIGHT, 0.5f, 0);
    put(s, fc2, PROBE_SITE_FWD_OUT, (float)(3.0 * g), 0);
    put(s, loss, PROBE_SITE_FWD_IN, (float)(3.0 * g), 0);
    put(s, loss, PROBE_SITE_FWD_OUT, (float)l, 0);
    float gr = (float)(0.01 * scale);
    put(s, loss, PROBE_SITE_GRAD_IN, gr, 0);
    put(s, fc2, PROBE_SITE_GRAD_OUT, gr, 0);
    put(s, fc2, PROBE_SITE_WEIGHT_GRAD, gr, inf2);
    put(s, fc2, PROBE_SITE_GRAD_IN, gr, inf2);
    put(s, fc1, PROBE_SITE_GRAD_OUT, gr, inf2);
    put(s, fc1, PROBE_SITE_WEIGHT_GRAD, gr, inf1);
    probe_step_scalars sc = {.loss = l, .loss_scale = scale, .lr = 1e-3,
                             .found_inf = skip, .skipped = skip};
    ck_assert_int_eq(probe_step_set_scalars(s, &sc), PROBE_OK);
    ck_assert_int_eq(probe_step_end(s), PROBE_OK);
    if (skip) {
      probe_scaler_event e = {.step = step, .kind = PROBE_SCALER_BACKOFF,
                              .old_scale = scale, .new_scale = scale / 2};
      ck_assert_int_eq(probe_scaler_transition(s, &e), PROBE_OK);
      scale /= 2;
      tracker = 0;
    } else if (!c->fp32 && ++tracker == interval && scale < 65536.0) {
      probe_scaler_event e = {.step = step, .kind = PROBE_SCALER_GROWTH,
                              .old_scale = scale, .new_scale = scale * 2};
      ck_assert_int_eq(probe_scaler_transition(s, &e), PROBE_OK);
      scale *= 2;
      tracker = 0;
    }
  }
  ck_assert_int_eq(probe_session_close(s), PROBE_OK);
}

/* the diagnosis over several chunks of 64 rows */
#define diag_of(d, p) diag_of_rows((d), (p), 64)

#define finding_has(f, needle) diag_finding_has(f, needle)

static void check_case(const run_case *c) {
  const char *p = tmp_path(c->tag);
  write_run(p, c);
  probe_diag d;
  diag_of(&d, p);
  ck_assert_msg(d.verdict == c->verdict, "%s: verdict %s, first finding %s: %s",
                c->tag, probe_verdict_name(d.verdict),
                probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
  if (!c->finding) {
    ck_assert_msg(d.n_findings == 1 && d.findings[0].id == PROBE_DIAG_FINDING_HEALTHY,
                  "%s: %d findings, first %s: %s", c->tag, d.n_findings,
                  probe_diag_finding_name(d.findings[0].id), d.findings[0].title);
  } else {
    const probe_diag_finding *f = &d.findings[0];
    ck_assert_msg(!strcmp(probe_diag_finding_name(f->id), c->finding),
                  "%s: first finding %s: %s", c->tag,
                  probe_diag_finding_name(f->id), f->title);
    for (int k = 0; k < 3 && c->text[k]; k++)
      ck_assert_msg(finding_has(f, c->text[k]), "%s: no '%s' in '%s' / '%s' / '%s'",
                    c->tag, c->text[k], f->title,
                    f->n_evidence > 0 ? f->evidence[0] : "",
                    f->n_evidence > 1 ? f->evidence[1] : "");
  }
  probe_diag_free(&d);
  unlink(p);
}

/* ---- 1: a finite loss that diverges ------------------------------------------ */

/* 0.5 flat to step 50, then x10 every 25 steps to 5e5 at the end (250). */
static double loss_explodes(int s, int n) {
  (void)n;
  return s < 50 ? 0.5 : 0.5 * pow(10.0, (s - 50) / 33.0);
}
/* learns (2.3 -> 0.1 by step 150), then climbs to 5 (x50). */
static double loss_learns_then_climbs(int s, int n) {
  (void)n;
  if (s < 150) return 2.3 * pow(0.1 / 2.3, s / 150.0);
  return 0.1 * pow(50.0, (s - 150) / 100.0);
}
/* a short run: 1 -> 1e3 over 30 steps */
static double loss_short(int s, int n) { (void)n; return pow(10.0, s / 10.0); }
/* x4 over the run: a climb below the factor */
static double loss_climbs_4x(int s, int n) { return 1.0 + 3.0 * s / (n - 1); }
/* falls as 2 e^(-s/100) */
static double loss_falls(int s, int n) { (void)n; return 2.0 * exp(-s / 100.0); }
/* a warm-up that doubles it (1 -> 2 over 50 steps), then falls to 1.5 */
static double loss_warmup_2x(int s, int n) {
  (void)n;
  return s < 50 ? 1.0 + s / 50.0 : 2.0 - 0.5 * (s - 50) / 250.0;
}
/* starts at 1e6 and falls to ~1 */
static double loss_starts_high(int s, int n) { return 1e6 * pow(1e-6, (double)s / (n - 1)); }
/* falls, with one step of 1e6 in the middle */
static double loss_one_spike(int s, int n) { return s == n / 2 ? 1e6 : 1.0 - 0.5 * s / n; }
/* a loss below 0 that grows in magnitude (a log-likelihood): no ratio */
static double loss_negative(int s, int n) { (void)n; return -1.0 - 10.0 * s; }
/* spikes x100 for 30 steps mid-run, then comes back */
static double loss_recovers(int s, int n) {
  (void)n;
  return s >= 100 && s < 130 ? 100.0 : 1.0;
}

/* falls from 1 to 1e-6 by step 200, then drifts up to 1e-4 (x100 its
 * lowest, far below its start): near-zero noise, not a divergence */
static double loss_converged_drift(int s, int n) {
  (void)n;
  return s < 200 ? pow(1e-6, s / 200.0) : 1e-6 * pow(100.0, (s - 200) / 100.0);
}
/* learns 2.3 -> 0.01, climbs back to 0.5 (x50, still below its start) */
static double loss_climbs_below_start(int s, int n) {
  (void)n;
  if (s < 150) return 2.3 * pow(0.01 / 2.3, s / 150.0);
  return 0.01 * pow(50.0, (s - 150) / 150.0);
}

static const run_case diverge_cases[] = {
    /* fires: degraded, lower-lr, the growth and the steps named */
    {"explodes", 300, loss_explodes, 0, 40, NULL, 0, 0, 0, PROBE_VERDICT_DEGRADED,
     "lower-lr", {"diverged while staying finite", "'head.fc2'", "grew first"}},
    {"explodes_noisy", 300, loss_explodes, 0.5, -1, NULL, 0, 0, 0,
     PROBE_VERDICT_DEGRADED, "lower-lr", {"diverged while staying finite",
                                          "lower the learning rate", NULL}},
    {"learns_then_climbs", 250, loss_learns_then_climbs, 0.2, -1, NULL, 0, 0, 0,
     PROBE_VERDICT_DEGRADED, "lower-lr", {"diverged while staying finite",
                                          "check the data", "clip"}},
    {"explodes_fp32", 300, loss_explodes, 0, 40, NULL, 0, 1, 0,
     PROBE_VERDICT_DEGRADED, "lower-lr", {"diverged while staying finite",
                                          "not a precision problem", NULL}},
    {"short", 30, loss_short, 0, -1, NULL, 0, 0, 0, PROBE_VERDICT_DEGRADED,
     "lower-lr", {"diverged while staying finite", NULL, NULL}},
    /* stays healthy */
    {"climbs_4x", 300, loss_climbs_4x, 0, -1, NULL, 0, 0, 0, PROBE_VERDICT_HEALTHY,
     NULL, {NULL}},
    {"noisy_falls", 400, loss_falls, 0.7, -1, NULL, 0, 0, 0, PROBE_VERDICT_HEALTHY,
     NULL, {NULL}},
    {"warmup_2x", 300, loss_warmup_2x, 0.1, -1, NULL, 0, 0, 0, PROBE_VERDICT_HEALTHY,
     NULL, {NULL}},
    {"starts_high", 300, loss_starts_high, 0.3, -1, NULL, 0, 0, 0,
     PROBE_VERDICT_HEALTHY, NULL, {NULL}},
    {"one_spike", 200, loss_one_spike, 0, -1, NULL, 0, 0, 0, PROBE_VERDICT_HEALTHY,
     NULL, {NULL}},
    {"negative", 200, loss_negative, 0, -1, NULL, 0, 0, 0, PROBE_VERDICT_HEALTHY,
     NULL, {NULL}},
    {"recovers", 300, loss_recovers, 0, -1, NULL, 0, 0, 0, PROBE_VERDICT_HEALTHY,
     NULL, {NULL}},
    {"converged_drift", 300, loss_converged_drift, 0.3, -1, NULL, 0, 0, 0,
     PROBE_VERDICT_HEALTHY, NULL, {NULL}},
    {"climbs_below_start", 300, loss_climbs_below_start, 0.2, -1, NULL, 0, 0, 0,
     PROBE_VERDICT_HEALTHY, NULL, {NULL}},
};

START_TEST(test_finite_divergence) { check_case(&diverge_cases[_i]); }
END_TEST

/* ---- 2: a streak of skipped steps -------------------------------------------- */

static double loss_flat(int s, int n) { return 2.0 - 1.0 * s / n; }
/* the hunt's case: 500 good steps, 50 skipped, then training again */
static int skip_500_50(int s, int n) { (void)n; return s >= 500 && s < 550; }
/* a warm-up (3) and a streak of 12 */
static int skip_warm_and_12(int s, int n) { (void)n; return s < 3 || (s >= 100 && s < 112); }
/* two streaks: 15 and 30 */
static int skip_two(int s, int n) { (void)n; return (s >= 50 && s < 65) || (s >= 120 && s < 150); }
/* a long warm-up (9 skips), then clean */
static int skip_warm9(int s, int n) { (void)n; return s < 9; }
/* a growth probe every 50 steps (one skip) */
static int skip_routine(int s, int n) { (void)n; return s < 2 || s % 50 == 49; }
/* with hysteresis: two skips every 100 steps */
static int skip_pairs(int s, int n) { (void)n; return s % 100 == 98 || s % 100 == 99; }
/* 9 in a row mid-run: one short of the streak */
static int skip_9(int s, int n) { (void)n; return s >= 80 && s < 89; }
/* the last 20: a collapse (scale-collapse), not a streak */
static int skip_last20(int s, int n) { return s >= n - 20; }

static const run_case streak_cases[] = {
    /* fires: degraded, skip-streak, the steps, the scale and the layer */
    {"streak_50", 1200, loss_flat, 0, -1, skip_500_50, 0, 0, 10, PROBE_VERDICT_DEGRADED,
     "skip-streak", {"50 consecutive steps were skipped", "steps 500..549",
                     "'head.fc2'"}},
    {"streak_12", 200, loss_flat, 0, -1, skip_warm_and_12, 1, 0, 0,
     PROBE_VERDICT_DEGRADED, "skip-streak",
     {"12 consecutive steps", "'enc.fc1'", "loss scale 8192 at step 100"}},
    {"streak_two", 400, loss_flat, 0, -1, skip_two, 0, 0, 5, PROBE_VERDICT_DEGRADED,
     "skip-streak", {"steps 120..149", "2 streaks", NULL}},
    /* stays healthy */
    {"warm9", 200, loss_flat, 0, -1, skip_warm9, 0, 0, 0, PROBE_VERDICT_HEALTHY,
     NULL, {NULL}},
    {"routine", 600, loss_flat, 0, -1, skip_routine, 0, 0, 48, PROBE_VERDICT_HEALTHY,
     NULL, {NULL}},
    {"pairs", 600, loss_flat, 0, -1, skip_pairs, 0, 0, 0, PROBE_VERDICT_HEALTHY,
     NULL, {NULL}},
    {"nine", 200, loss_flat, 0, -1, skip_9, 0, 0, 0, PROBE_VERDICT_HEALTHY, NULL,
     {NULL}},
    /* at the end: the collapse and its overflow say it, as before */
    {"last20", 200, loss_flat, 0, -1, skip_last20, 0, 0, 0, PROBE_VERDICT_DIVERGED,
     "force-fp32", {"'head.fc2'", NULL, NULL}},
};

START_TEST(test_skip_streak) { check_case(&streak_cases[_i]); }
END_TEST

/* A streak at the end is the collapse's alone: no second finding of it. */
START_TEST(test_trailing_streak_not_twice) {
  int collapse = 0;
  const run_case *c = &streak_cases[sizeof streak_cases / sizeof streak_cases[0] - 1];
  const char *p = tmp_path("last20b");
  write_run(p, c);
  probe_diag d;
  diag_of(&d, p);
  for (int i = 0; i < d.n_findings; i++) {
    ck_assert_msg(strcmp(probe_diag_finding_name(d.findings[i].id), "skip-streak"),
                  "skip-streak beside scale-collapse: %s", d.findings[i].title);
    collapse |= d.findings[i].id == PROBE_DIAG_FINDING_SCALE_COLLAPSE &&
                strstr(d.findings[i].title, "stopped training") != NULL;
  }
  ck_assert(collapse);
  probe_diag_free(&d);
  unlink(p);
}
END_TEST

/* ---- 3: the numbers in `postmortem --json` ------------------------------------
 * loss_trend, skip_streak and each finding's weak_evidence, read back with
 * /usr/bin/python3's json module: CHECK is a Python expression over d (the
 * document), t (loss_trend), k (skip_streak) and f (diagnosis). */
static void json_check(const probe_diag *d, const char *tag, const char *check) {
  char *js = NULL;
  ck_assert_int_eq(probe_diag_render_json(d, &js), PROBE_OK);
  char jp[300], sp[300], cmd[700];
  snprintf(jp, sizeof jp, "%s.json", tmp_path(tag));
  snprintf(sp, sizeof sp, "%s.py", tmp_path(tag));
  FILE *fj = fopen(jp, "w");
  ck_assert(fj != NULL);
  fputs(js, fj);
  fclose(fj);
  free(js);
  FILE *fs = fopen(sp, "w");
  ck_assert(fs != NULL);
  fprintf(fs,
          "import json, os, sys\n"
          "raw = open(sys.argv[1], encoding='utf-8').read()\n"
          "d = json.loads(raw)\n"
          "t, k, f = d['loss_trend'], d['skip_streak'], d['diagnosis']\n"
          "ok = (%s)\n"
          "if os.environ.get('AMPPROBE_TEST_SHOW'):\n"
          "    print(sys.argv[2], json.dumps({'loss_trend': t, 'skip_streak': k}),"
          " file=sys.stderr)\n"
          "if not ok:\n"
          "    print('%s: failed:', %s, file=sys.stderr)\n"
          "    print(json.dumps({'loss_trend': t, 'skip_streak': k, 'weak': "
          "[x['weak_evidence'] for x in f]}, indent=1), file=sys.stderr)\n"
          "sys.exit(0 if ok else 1)\n",
          check, tag, "repr(sys.argv[2])");
  fclose(fs);
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' '%s'", sp, jp, tag);
  int rc = system(cmd);
  unlink(jp);
  unlink(sp);
  ck_assert_msg(rc == 0, "%s: %s", tag, check);
}

static void json_case(const run_case *c, const char *check) {
  const char *p = tmp_path(c->tag);
  write_run(p, c);
  probe_diag d;
  diag_of(&d, p);
  json_check(&d, c->tag, check);
  probe_diag_free(&d);
  unlink(p);
}

/* shared by every case: the keys and their types, no weak finding here */
#define JSON_COMMON                                                          \
  "set(t) == {'judged','window','best','last','growth','rise_step',"         \
  "'diverged','first_grown_layer'} and set(t['best']) == {'step','median',"  \
  "'lr'} and set(t['last']) == {'median','lr'} and "                         \
  "all(x['weak_evidence'] is False for x in f) and "

START_TEST(test_json_diverging) {
  json_case(&diverge_cases[0], /* explodes: head.fc2 grows from step 40 */
            JSON_COMMON
            "t['judged'] is True and t['diverged'] is True and "
            "isinstance(t['window'], int) and 5 <= t['window'] <= 25 and "
            "isinstance(t['best']['step'], int) and t['best']['lr'] == 1e-3 and "
            "t['last']['lr'] == 1e-3 and t['growth'] >= 10 and "
            "abs(t['growth'] - t['last']['median'] / t['best']['median']) < "
            "1e-6 * t['growth'] and t['rise_step'] > t['best']['step'] and "
            "t['first_grown_layer']['name'] == 'head.fc2' and "
            "t['first_grown_layer']['site'] == 'activation' and "
            "t['first_grown_layer']['step'] > t['best']['step'] and "
            "t['first_grown_layer']['growth'] >= 10 and k is None and "
            "f[0]['id'] == 'lower-lr'");
}
END_TEST

START_TEST(test_json_healthy) {
  json_case(&diverge_cases[6], /* noisy_falls */
            JSON_COMMON
            "t['judged'] is True and t['diverged'] is False and "
            "t['growth'] < 10 and t['rise_step'] is None and "
            "t['first_grown_layer'] is None and k is None and "
            "d['verdict'] == 'healthy'");
}
END_TEST

START_TEST(test_json_too_short) {
  /* 8 losses: fewer than 2 windows of 5, not judged */
  const run_case c = {"json_short", 8, loss_falls, 0, -1, NULL, 0, 0, 0,
                      PROBE_VERDICT_HEALTHY, NULL, {NULL}};
  json_case(&c, JSON_COMMON
                "t['judged'] is False and t['window'] is None and "
                "t['diverged'] is False and t['growth'] is None and "
                "t['best'] == {'step': None, 'median': None, 'lr': None} and "
                "t['last'] == {'median': None, 'lr': None} and "
                "t['rise_step'] is None and t['first_grown_layer'] is None and "
                "k is None");
}
END_TEST

START_TEST(test_json_skip_streak) {
  json_case(&streak_cases[0], /* streak_50: steps 500..549, head.fc2's inf */
            JSON_COMMON
            "set(k) == {'start','end','length','streaks','scale_from',"
            "'scale_to','layer','layer_steps','loss_nonfinite'} and "
            "k['start'] == 500 and k['end'] == 549 and k['length'] == 50 and "
            "k['streaks'] == 1 and k['scale_from'] > k['scale_to'] > 0 and "
            "k['layer'] == 'head.fc2' and k['layer_steps'] == 50 and "
            "k['loss_nonfinite'] == 0 and t['judged'] is True and "
            "any(x['id'] == 'skip-streak' for x in f)");
}
END_TEST

START_TEST(test_json_hostile_layer_name) {
  /* the layer that grew first has control characters and a quote in its
   * name: it is escaped as every other layer name of the document */
  fc2_name = "head\x01\x1b[2J\n\"fc2\\";
  run_case c = diverge_cases[0];
  c.tag = "json_hostile";
  json_case(&c, JSON_COMMON
                "t['diverged'] is True and "
                "t['first_grown_layer']['name'] in "
                "[x['layer'] for x in d['layers']] and "
                "not any(ord(ch) < 32 for ch in t['first_grown_layer']['name']) "
                "and '\\x1b' not in raw and '\\x01' not in raw");
  fc2_name = "head.fc2";
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("diagnose_trend");
  TCase *tc = tcase_create("trend");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_finite_divergence, 0,
                      (int)(sizeof diverge_cases / sizeof diverge_cases[0]));
  tcase_add_loop_test(tc, test_skip_streak, 0,
                      (int)(sizeof streak_cases / sizeof streak_cases[0]));
  tcase_add_test(tc, test_trailing_streak_not_twice);
  tcase_add_test(tc, test_json_diverging);
  tcase_add_test(tc, test_json_healthy);
  tcase_add_test(tc, test_json_too_short);
  tcase_add_test(tc, test_json_skip_streak);
  tcase_add_test(tc, test_json_hostile_layer_name);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(make_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
