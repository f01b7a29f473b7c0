/*
 * trainer/optim.c - optimizers on FP32 master weights with FP32 state, as
 * torch.optim does on FP32 parameters: SGD (momentum, dampening 0, L2 weight
 * decay), Adam (L2 weight decay added to the gradient) and AdamW (decoupled
 * decay); and the learning-rate schedules (constant, warmup + cosine, step).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer-impl.h"

probe_status pt_optim_init(pt_optim *o, const pt_opt_spec *spec, size_t n) {
  memset(o, 0, sizeof *o);
  o->spec = *spec;
  o->n = n;
  o->m = calloc(n ? n : 1, sizeof(float));
  o->v = calloc(n ? n : 1, sizeof(float));
  if (!o->m || !o->v) {
    pt_optim_free(o);
    return PROBE_ERR_NOMEM;
  }
  return PROBE_OK;
}

void pt_optim_free(pt_optim *o) {
  free(o->m);
  free(o->v);
  o->m = o->v = NULL;
}

void pt_optim_step(pt_optim *o, float *w, const float *g, double lr) {
  const pt_opt_spec *sp = &o->spec;
  const float flr = (float)lr, wd = (float)sp->weight_decay;
  o->t += 1;
  if (sp->type == PT_OPT_SGD) {
    const float mom = (float)sp->momentum;
    for (size_t i = 0; i < o->n; i++) {
      float d = g[i] + wd * w[i];
      if (mom != 0.0f) {
        d = (o->t == 1) ? d : mom * o->m[i] + d;
        o->m[i] = d;
      }
      w[i] -= flr * d;
    }
    return;
  }
  const float b1 = (float)sp->beta1, b2 = (float)sp->beta2;
  const float eps = (float)sp->eps;
  const double bc1 = 1.0 - pow(sp->beta1, (double)o->t);
  const double bc2 = 1.0 - pow(sp->beta2, (double)o->t);
  const float step_size = (float)(lr / bc1);
  const float bc2_sqrt = (float)sqrt(bc2);
  for (size_t i = 0; i < o->n; i++) {
    float gi = g[i];
    if (sp->type == PT_OPT_ADAMW)
      w[i] *= 1.0f - flr * wd;
    else
      gi += wd * w[i];
    o->m[i] = b1 * o->m[i] + (1.0f - b1) * gi;
    o->v[i] = b2 * o->v[i] + (1.0f - b2) * gi * gi;
    float denom = sqrtf(o->v[i]) / bc2_sqrt + eps;
    w[i] -= step_size * o->m[i] / denom;
  }
}

double pt_sched_lr(const pt_sched_spec *s, double base_lr, int64_t step,
                   int64_t total) {
  if (s->warmup > 0 && step < s->warmup)
    return base_lr * (double)(step + 1) / (double)s->warmup;
  switch (s->type) {
  case PT_SCHED_COSINE: {
    int64_t span = total - s->warmup;
    if (span <= 1) return base_lr;
    double p = (double)(step - s->warmup) / (double)(span - 1);
    if (p > 1.0) p = 1.0;
    /* the floor never lifts the rate above lr (lr 0 stays 0: --lr 0 is how
     * bisect's "baseline does not train" check is shown) */
    double floor_lr = s->min_lr < base_lr ? s->min_lr : base_lr;
    return floor_lr + 0.5 * (base_lr - floor_lr) * (1.0 + cos(3.14159265358979323846 * p));
  }
  case PT_SCHED_STEP: {
    if (s->step_size <= 0) return base_lr;
    int64_t k = (step - s->warmup) / s->step_size;
    return base_lr * pow(s->gamma, (double)k);
  }
  case PT_SCHED_CONSTANT:
  default:
    return base_lr;
  }
}
