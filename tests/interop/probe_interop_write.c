/*
 * probe_interop_write.c - writes a small trace with known values for
 * check_probe_h5py.py, which reads it with h5py (Debian's python3-h5py).
 *
 *   probe_interop_write OUT.h5 complete   closes the session normally
 *   probe_interop_write OUT.h5 killed     flushes, then SIGKILLs itself
 *
 * Layers: 0 "encoder.lin1" (linear, fp16), 1 "encoder.ré" (bn, fp32; a
 * UTF-8 name). Steps 0..4, full mode. Per step: layer 0 fwd_out = the 10
 * floats step, 1, 2, ..., 9; layer 1 grad_in = 4 fp16 values 0.5*step,
 * with a NaN in element 2 at step 3. Step scalars: loss 1/(step+1), loss
 * scale 65536/2^step, lr 0.01, weight digest probe_digest64 of layer 0's
 * 10 floats (not measured at step 4). One backoff event at step 3. Rank
 * attributes: rank 2 of 4, run id "interop-run.1".
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdio.h>
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
  if (argc != 3 || (strcmp(argv[2], "complete") && strcmp(argv[2], "killed"))) {
    fprintf(stderr, "usage: %s OUT.h5 complete|killed\n", argv[0]);
    return 2;
  }
  int killed = strcmp(argv[2], "killed") == 0;
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.command_line = "probe_interop_write";
  o.config_json = "{\"scenario\": \"interop\", \"steps\": 5}";
  o.precision_policy = "fp16; fp32: bn";
  o.flush_seconds = 1e9;
  o.rank = 2;
  o.world_size = 4;
  o.run_id = "interop-run.1";
  probe_session *s;
  CHECK(probe_session_open(&s, argv[1], &o));
  int32_t lin, bn;
  CHECK(probe_layer_register(s, "encoder.lin1", PROBE_KIND_LINEAR,
                             PROBE_DTYPE_F16, &lin));
  CHECK(probe_layer_register(s, "encoder.r\xc3\xa9", PROBE_KIND_BN,
                             PROBE_DTYPE_F32, &bn));
  for (int step = 0; step < 5; step++) {
    float a[10];
    uint16_t g[4];
    a[0] = (float)step;
    for (int i = 1; i < 10; i++) a[i] = (float)i;
    for (int i = 0; i < 4; i++) g[i] = probe_f32_to_f16(0.5f * (float)step);
    if (step == 3) g[2] = probe_f32_to_f16(NAN);
    CHECK(probe_step_begin(s, step));
    CHECK(probe_tensor_record(s, lin, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, a,
                              10));
    CHECK(probe_tensor_record(s, bn, PROBE_SITE_GRAD_IN, PROBE_DTYPE_F16, g,
                              4));
    probe_step_scalars sc = {.loss = 1.0 / (step + 1),
                             .loss_scale = 65536.0 / (double)(1 << step),
                             .lr = 0.01,
                             .found_inf = step == 3,
                             .skipped = step == 3,
                             .clip_coef = 1.0,
                             /* step 2: no clipper ran (not measured) */
                             .unmeasured = step == 2 ? PROBE_SCALAR_GRAD_NORM |
                                                           PROBE_SCALAR_CLIP
                                                     : 0};
    if (step == 4) sc.unmeasured |= PROBE_SCALAR_WEIGHT_DIGEST;
    else sc.weight_digest = probe_digest64(a, sizeof a, PROBE_DIGEST64_INIT);
    CHECK(probe_step_set_scalars(s, &sc));
    if (step == 3) {
      probe_scaler_event ev = {.kind = PROBE_SCALER_BACKOFF,
                               .old_scale = 8192,
                               .new_scale = 4096,
                               .growth_tracker = 0};
      CHECK(probe_scaler_transition(s, &ev));
    }
    CHECK(probe_step_end(s));
  }
  if (killed) {
    CHECK(probe_session_flush(s));
    raise(SIGKILL);
  }
  CHECK(probe_session_close(s));
  return 0;
}
