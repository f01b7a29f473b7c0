/*
 * tests/tools/many_layers_trace.c - writes a full trace of N linear layers
 * and S steps, one fwd_out record of 16 values per layer and step (the
 * shape of a model with very many modules), for scale_layers.sh.
 *
 * usage: many_layers_trace PATH N_LAYERS STEPS [SCALE]
 */
#include <stdio.h>
#include <stdlib.h>

#include "ampprobe/probe.h"

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: many_layers_trace PATH N_LAYERS STEPS [SCALE]\n");
    return 2;
  }
  long nl = atol(argv[2]), ns = atol(argv[3]);
  float scale = argc > 4 ? (float)atof(argv[4]) : 1.0f;
  probe_options o;
  probe_options_init(&o);
  o.mode = PROBE_MODE_FULL;
  o.overwrite = 1;
  o.config_json = "{\"name\": \"many-layers\"}";
  o.precision_policy = "fp16";
  probe_session *s = NULL;
  if (probe_session_open(&s, argv[1], &o) != PROBE_OK) {
    fprintf(stderr, "open: %s\n", probe_session_last_error(NULL));
    return 1;
  }
  int32_t *ids = malloc((size_t)nl * sizeof *ids);
  if (!ids) return 1;
  for (long i = 0; i < nl; i++) {
    char name[64];
    snprintf(name, sizeof name, "blocks.%ld.fc", i);
    if (probe_layer_register(s, name, PROBE_KIND_LINEAR, PROBE_DTYPE_F16,
                             &ids[i]) != PROBE_OK) {
      fprintf(stderr, "register: %s\n", probe_session_last_error(s));
      return 1;
    }
  }
  float x[16];
  for (long st = 0; st < ns; st++) {
    if (probe_step_begin(s, st) != PROBE_OK) return 1;
    for (long i = 0; i < nl; i++) {
      for (int k = 0; k < 16; k++)
        x[k] = scale * (float)((i % 7) + k + 1) / (float)(st + 1);
      if (probe_tensor_record(s, ids[i], PROBE_SITE_FWD_OUT, PROBE_DTYPE_F32,
                              x, 16) != PROBE_OK)
        return 1;
    }
    probe_step_scalars sc = {0};
    sc.step = st;
    sc.loss = 1.0 / (double)(st + 1);
    sc.loss_scale = 1.0;
    sc.lr = 1e-3;
    sc.clip_coef = 1.0;
    if (probe_step_set_scalars(s, &sc) != PROBE_OK ||
        probe_step_end(s) != PROBE_OK)
      return 1;
  }
  free(ids);
  return probe_session_close(s) == PROBE_OK ? 0 : 1;
}
