/*
 * bench/report/gen_trace.c - writes a synthetic full trace through the
 * libprobe writer, for timing `ampprobe report` on long runs.
 *
 *   bench_report_gen OUT.h5 [STEPS=10000] [LAYERS=30] [ELEMS=64]
 *
 * Each step records two sites per layer (forward output and gradient to the
 * input, ELEMS FP32 values each), the step scalars (loss scale 2^16 with
 * growth every 2000 steps, clipping at 1.0, a one-step loss spike at 37% of
 * the run) and, from 90% of the run on, an overflow in layer 7 with the
 * scaler backing off at every step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/probe.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    probe_status st_ = (call);                                                 \
    if (st_ != PROBE_OK) {                                                     \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
              probe_status_str(st_));                                          \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_report_gen OUT.h5 [STEPS] [LAYERS] "
                    "[ELEMS]\n");
    return 2;
  }
  int64_t steps = argc > 2 ? atoll(argv[2]) : 10000;
  int layers = argc > 3 ? atoi(argv[3]) : 30;
  int elems = argc > 4 ? atoi(argv[4]) : 64;
  if (steps < 10 || layers < 8 || elems < 1) return 2;

  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.command_line = "bench_report_gen";
  o.precision_policy = "fp16 (synthetic)";
  o.snapshot_on_nonfinite = 0;
  probe_session *s;
  CHECK(probe_session_open(&s, argv[1], &o));
  int32_t *ids = malloc((size_t)layers * sizeof *ids);
  static const probe_kind kinds[] = {PROBE_KIND_LINEAR, PROBE_KIND_BN,
                                     PROBE_KIND_ACTIVATION,
                                     PROBE_KIND_LAYERNORM, PROBE_KIND_REVIN};
  for (int l = 0; l < layers; l++) {
    char name[64];
    snprintf(name, sizeof name, "blocks.%d.%s", l / 5,
             probe_kind_name(kinds[l % 5]));
    CHECK(probe_layer_register(s, name, kinds[l % 5], PROBE_DTYPE_F16,
                               &ids[l]));
  }
  float *act = malloc((size_t)elems * sizeof *act);
  float *grad = malloc((size_t)elems * sizeof *grad);
  double scale = 65536;
  int64_t blow = steps * 9 / 10;
  uint32_t rng = 12345;
  for (int64_t t = 0; t < steps; t++) {
    CHECK(probe_step_begin(s, t));
    int bad = t >= blow;
    for (int l = 0; l < layers; l++) {
      double amp = ldexp(1.0, l % 9) * (1.0 + (double)t / (double)steps);
      for (int i = 0; i < elems; i++) {
        rng = rng * 1664525u + 1013904223u;
        double u = (double)(rng >> 8) / 16777216.0 - 0.5;
        act[i] = (float)(amp * u);
        grad[i] = (float)(ldexp(u, -10 - l % 12));
      }
      if (bad && l == 7) act[0] = INFINITY;
      CHECK(probe_tensor_record(s, ids[l], PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32,
                                act, (size_t)elems));
      if (bad && l <= 7) grad[1] = NAN;
      CHECK(probe_tensor_record(s, ids[l], PROBE_SITE_GRAD_IN, PROBE_DTYPE_F32,
                                grad, (size_t)elems));
    }
    probe_step_scalars sc;
    memset(&sc, 0, sizeof sc);
    sc.loss = bad ? NAN
                  : 2.0 * exp(-(double)t / (steps / 5.0)) + 0.1 +
                        (t == steps * 37 / 100 ? 3.0 : 0.0);
    sc.loss_scale = scale;
    sc.lr = 1e-3;
    sc.grad_norm = bad ? INFINITY : 0.9 + 0.2 * sin((double)t * 0.1);
    sc.clip_threshold = 1.0;
    sc.clip_coef = bad ? 1.0 : fmin(1.0, 1.0 / sc.grad_norm);
    sc.found_inf = sc.skipped = bad;
    CHECK(probe_step_set_scalars(s, &sc));
    if (bad || (t > 0 && t % 2000 == 0)) {
      /* backoff halves the scale down to 1, then stays clamped there */
      probe_scaler_kind k = !bad ? PROBE_SCALER_GROWTH
                            : scale > 1 ? PROBE_SCALER_BACKOFF
                                        : PROBE_SCALER_MIN_CLAMP;
      probe_scaler_event ev = {t, k, scale,
                               !bad ? scale * 2 : fmax(1.0, scale / 2), 0};
      CHECK(probe_scaler_transition(s, &ev));
      scale = ev.new_scale;
    }
    CHECK(probe_step_end(s));
  }
  CHECK(probe_session_close(s));
  free(ids);
  free(act);
  free(grad);
  return 0;
}
