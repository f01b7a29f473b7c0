#include <math.h>
#include <stdio.h>
#include "ampprobe/probe.h"
/* Writes tests/probe/data/trace-v1-2026-12.h5 with the writer of main at
 * 7164ce6: /steps rows of 80 bytes with `unmeasured` and without
 * `weight_digest`, no rank attributes. 5 steps, one layer; step 1 has
 * grad_norm and clip unmeasured, step 3 lr; a measured NaN loss at step 4. */
int main(int argc, char **argv) {
  probe_options o; probe_options_init(&o); o.mode = PROBE_MODE_FULL;
  probe_session *s; if (argc < 2 || probe_session_open(&s, argv[1], &o)) return 1;
  int32_t id; probe_layer_register(s, "lin", PROBE_KIND_LINEAR, PROBE_DTYPE_F16, &id);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int step = 0; step < 5; step++) {
    probe_step_begin(s, step);
    probe_tensor_record(s, id, PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32, x, 8);
    probe_step_scalars sc = {.loss = step == 4 ? NAN : 0.5, .loss_scale = 1024,
      .lr = 0.1, .grad_norm = 2.0, .clip_threshold = 1, .clip_coef = 0.5,
      .unmeasured = step == 1 ? PROBE_SCALAR_GRAD_NORM | PROBE_SCALAR_CLIP
                  : step == 3 ? PROBE_SCALAR_LR : 0};
    probe_step_set_scalars(s, &sc);
    probe_step_end(s);
  }
  return probe_session_close(s) != 0;
}
