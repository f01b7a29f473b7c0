/*
 * trainer/scaler.c - dynamic loss scaling with torch.amp.GradScaler's rules
 * (aten's _amp_update_scale_), plus Megatron's hysteresis and minimum scale.
 *
 * GradScaler: on a non-finite gradient scale *= backoff and the growth
 * tracker resets; on a clean step the tracker counts up and when it reaches
 * growth_interval the scale is multiplied by growth, but only when the
 * product is finite, and the tracker resets. The scale is an FP32 number.
 *
 * Megatron (DynamicGradScaler): a non-finite step decrements a hysteresis
 * tracker and the scale backs off only when it reaches zero, never below
 * min_scale; growth resets the hysteresis tracker. hysteresis = 1 and
 * min_scale = 0 give exactly GradScaler.
 */
#include <math.h>

#include "trainer-impl.h"

void pt_scaler_init(pt_scaler *s, const pt_scaler_spec *spec) {
  s->spec = *spec;
  s->scale = spec->enabled ? (float)spec->init : 1.0f;
  s->growth_tracker = 0;
  s->hysteresis_tracker = spec->hysteresis > 0 ? spec->hysteresis : 1;
}

int pt_scaler_update(pt_scaler *s, int found_inf, int64_t step,
                     probe_scaler_event *ev) {
  if (!s->spec.enabled) return 0;
  float old = s->scale;
  ev->step = step;
  ev->old_scale = old;
  if (found_inf) {
    s->growth_tracker = 0;
    s->hysteresis_tracker -= 1;
    if (s->hysteresis_tracker > 0) {
      ev->kind = PROBE_SCALER_HYSTERESIS;
      ev->new_scale = old;
      ev->growth_tracker = 0;
      return 1;
    }
    float next = old * (float)s->spec.backoff;
    ev->kind = PROBE_SCALER_BACKOFF;
    if (s->spec.min_scale > 0 && !(next >= (float)s->spec.min_scale)) {
      next = (float)s->spec.min_scale;
      ev->kind = PROBE_SCALER_MIN_CLAMP;
    }
    s->scale = next;
    ev->new_scale = next;
    ev->growth_tracker = 0;
    return 1;
  }
  int32_t successful = s->growth_tracker + 1;
  if (successful >= s->spec.interval) {
    float next = old * (float)s->spec.growth;
    s->growth_tracker = 0;
    s->hysteresis_tracker = s->spec.hysteresis > 0 ? s->spec.hysteresis : 1;
    if (!isfinite(next)) return 0; /* growth refused, tracker still resets */
    s->scale = next;
    ev->kind = PROBE_SCALER_GROWTH;
    ev->new_scale = next;
    ev->growth_tracker = 0;
    return 1;
  }
  s->growth_tracker = successful;
  return 0;
}
