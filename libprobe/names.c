/*
 * names.c - names of the probe vocabulary (module kinds, precisions, sites,
 * phases, scaler event kinds) and their parsers, generated from the X-macro
 * lists in include/ampprobe/probe.h so names and enums cannot drift apart.
 */
#include <string.h>

#include "ampprobe/probe.h"

const char *probe_kind_name(probe_kind k) {
  switch (k) {
#define PROBE_KIND_NAME_(name, str)                                            \
  case PROBE_KIND_##name:                                                      \
    return str;
    PROBE_KIND_MAP(PROBE_KIND_NAME_)
#undef PROBE_KIND_NAME_
  case PROBE_KIND_COUNT:
    break;
  }
  return NULL;
}

probe_status probe_kind_parse(const char *name, probe_kind *out) {
  if (name == NULL || out == NULL) return PROBE_ERR_INVALID_ARG;
  for (int k = 0; k < PROBE_KIND_COUNT; k++) {
    if (strcmp(name, probe_kind_name((probe_kind)k)) == 0) {
      *out = (probe_kind)k;
      return PROBE_OK;
    }
  }
  return PROBE_ERR_NOT_FOUND;
}

/* One list of format names: the kernels' probe_dtype_name; a module's
 * precision is a probe_dtype too. Returns PROBE_ERR_NOT_FOUND for a name
 * that is not "fp32", "fp16" or "bf16". */
probe_status probe_dtype_parse(const char *name, probe_dtype *out) {
  if (name == NULL || out == NULL) return PROBE_ERR_INVALID_ARG;
  for (int p = 0; p < 3; p++) {
    if (strcmp(name, probe_dtype_name((probe_dtype)p)) == 0) {
      *out = (probe_dtype)p;
      return PROBE_OK;
    }
  }
  return PROBE_ERR_NOT_FOUND;
}

const char *probe_site_name(probe_site s) {
  switch (s) {
#define PROBE_SITE_NAME_(name, str, phase)                                     \
  case PROBE_SITE_##name:                                                      \
    return str;
    PROBE_SITE_MAP(PROBE_SITE_NAME_)
#undef PROBE_SITE_NAME_
  case PROBE_SITE_COUNT:
    break;
  }
  return NULL;
}

probe_status probe_site_parse(const char *name, probe_site *out) {
  if (name == NULL || out == NULL) return PROBE_ERR_INVALID_ARG;
  for (int s = 0; s < PROBE_SITE_COUNT; s++) {
    if (strcmp(name, probe_site_name((probe_site)s)) == 0) {
      *out = (probe_site)s;
      return PROBE_OK;
    }
  }
  return PROBE_ERR_NOT_FOUND;
}

int probe_record_nonfinite(probe_kind kind, probe_site site,
                           const probe_stats *s) {
  if (!s || probe_stats_nonfinite(s) == 0) return 0;
  int masked_logits = (kind == PROBE_KIND_SOFTMAX || kind == PROBE_KIND_LOSS) &&
                      site == PROBE_SITE_FWD_IN && s->nan_count == 0 &&
                      s->posinf_count == 0;
  return !masked_logits;
}

probe_phase probe_site_phase(probe_site s) {
  switch (s) {
#define PROBE_SITE_PHASE_(name, str, phase)                                    \
  case PROBE_SITE_##name:                                                      \
    return PROBE_PHASE_##phase;
    PROBE_SITE_MAP(PROBE_SITE_PHASE_)
#undef PROBE_SITE_PHASE_
  case PROBE_SITE_COUNT:
    break;
  }
  return PROBE_PHASE_FORWARD;
}

const char *probe_phase_name(probe_phase p) {
  switch (p) {
  case PROBE_PHASE_FORWARD:
    return "forward";
  case PROBE_PHASE_BACKWARD:
    return "backward";
  case PROBE_PHASE_OPTIMIZER:
    return "optimizer";
  }
  return NULL;
}

const char *probe_scaler_kind_name(probe_scaler_kind k) {
  switch (k) {
  case PROBE_SCALER_BACKOFF:
    return "backoff";
  case PROBE_SCALER_GROWTH:
    return "growth";
  case PROBE_SCALER_HYSTERESIS:
    return "hysteresis";
  case PROBE_SCALER_MIN_CLAMP:
    return "min_clamp";
  }
  return NULL;
}
