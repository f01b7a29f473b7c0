/*
 * trainer/train.c - model assembly and the AMP training loop.
 *
 * The model is the config's module stack on (B, width) activations (the
 * attention block sees (B, T, C) with width = T*C). FP32 master weights live
 * in one array; each step they are cast to the module's precision "as used"
 * (the WEIGHT site). A step (docs/precision.md, "The AMP step"):
 *
 *   for each micro-batch: forward, loss, backward of loss * scale / M,
 *     parameter gradients accumulated in FP32 (scaled)
 *   unscale: g * (float)(1.0 / scale) into a separate array, found_inf check
 *   clip by global L2 norm on the unscaled gradients (or, with
 *     clip.before_unscale, on the scaled ones, before unscaling)
 *   optimizer step, skipped when found_inf (and loss scaling is on)
 *   scaler update
 *
 * Data-parallel (opts->comm, trainer/comm.c): rank r of N trains the global
 * micro-batches r*M..r*M+M-1 (data.c), and between the backward and the
 * unscale the scaled FP32 gradients go through the all-reduce as DDP does:
 * pre-divided by N when dist.prediv, rounded to the all-reduce dtype
 * (GRAD_PRE_ALLREDUCE), summed over ranks in that dtype
 * (GRAD_POST_ALLREDUCE), then divided by N when not pre-divided. found_inf is
 * all-reduced with MAX (every rank skips the same steps and keeps the same
 * scale, as GradScaler's per-device found_inf) and the loss is the global
 * mean. The weight digest of the FP32 masters goes into every step's
 * scalars.
 *
 * Every tensor goes through libprobe in execution order; buffers recorded in
 * a step stay untouched until probe_step_end (one workspace per micro-batch,
 * scaled gradients kept apart from the unscaled ones).
 *
 * Backends: the layer kernels are called through the table of operations
 * chosen once at the start (probe_layers_backend_init, ampprobe/layers.h):
 * the CPU one, or (builds with CUDA, opts->backend PROBE_BACKEND_CUDA) the
 * CUDA one on device buffers. With a backend whose memory is not the host's
 * the forward and backward run there and the AMP step (unscale, check, clip,
 * optimizer, scaler) runs on the host on a copy of the gradients, so both
 * backends share it.
 *
 * Memory: everything the run allocates is computed from the config first
 * (run_memory_need) and the run is refused, with the figure, when it exceeds
 * the limit (opts->max_memory, default a fraction of physical memory).
 * Nothing is sized by input on the stack.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "ampprobe/layers.h"
#include "trainer-impl.h"


void openblas_set_num_threads(int num_threads); /* OpenBLAS extension */

/* ---- layer list (no data needed) ------------------------------------------ */

/* Builds the probe layer list of a config: "input", the modules, the RevIN
 * denormalisation when there is one, "loss". Returns the count. */
static size_t layer_list(const probe_train_config *c, probe_layer_desc *out,
                         size_t max) {
  size_t n = 0;
#define PUSH(nm, kd, pr)                                                       \
  do {                                                                         \
    if (n < max) {                                                             \
      snprintf(out[n].name, PROBE_NAME_MAX, "%.*s", PROBE_NAME_MAX - 1, (nm));                       \
      out[n].kind = (kd);                                                      \
      out[n].precision = (pr);                                                 \
    }                                                                          \
    n++;                                                                       \
  } while (0)
  PUSH("input", PROBE_KIND_INPUT, PROBE_DTYPE_F32);
  int denorm = -1;
  for (int i = 0; i < c->n_modules; i++) {
    const pt_module_spec *m = &c->modules[i];
    probe_kind k = pt_module_kind(m->type);
    PUSH(m->name, k, pt_policy_precision(c, m->name, k));
    if (m->type == PT_MOD_REVIN && m->denorm) denorm = i;
  }
  if (denorm >= 0) {
    /* The denormalisation is part of the RevIN module: same precision. */
    const pt_module_spec *m = &c->modules[denorm];
    char nm[PROBE_NAME_MAX + 8];
    snprintf(nm, sizeof nm, "%s.denorm", m->name);
    PUSH(nm, PROBE_KIND_REVIN,
         pt_policy_precision(c, m->name, PROBE_KIND_REVIN));
  }
  PUSH("loss", PROBE_KIND_LOSS, pt_policy_precision(c, "loss", PROBE_KIND_LOSS));
#undef PUSH
  return n;
}

probe_status probe_config_layers(const probe_train_config *c,
                                 probe_layer_desc *out, size_t max, size_t *n) {
  if (!c || !n || (max && !out)) return PROBE_ERR_INVALID_ARG;
  *n = layer_list(c, out, max);
  return PROBE_OK;
}

/* ---- the run's state -------------------------------------------------------- */

typedef struct pt_mod {
  const pt_module_spec *spec;
  probe_kind kind;
  probe_dtype prec;
  int32_t lid;        /* index in the layer list */
  int64_t in_w, out_w; /* row widths of input and output */
  size_t p_off, p_n;   /* parameter block in the master array */
  float *run_mean, *run_var; /* bn (C) */
  /* attention scratch (backward), not recorded */
  float *dqkv, *datty, *dprobs, *dscores;
} pt_mod;

/* One micro-batch's tensors. act[i] is the input of module i, act[L] the
 * model output; dact mirrors it. Saved intermediates per module:
 *   bn         s1 mean (C), s2 var (C)
 *   layernorm  s1 mean (B), s2 rstd (B), s3 var (B)
 *   revin      s1 mean (B), s2 stdev (B), s3 var (B)
 *   attention  s1 qkv, s2 scores, s3 probs, s4 atty */
typedef struct pt_work {
  float *act[PT_MAX_MODULES + 1];
  float *dact[PT_MAX_MODULES + 1];
  float *s1[PT_MAX_MODULES], *s2[PT_MAX_MODULES];
  float *s3[PT_MAX_MODULES], *s4[PT_MAX_MODULES];
  float *pred, *dpred;  /* after denorm (== act[L] without denorm) */
  float *target;        /* (B, out) */
  int *labels;          /* (B) */
  float *loss;          /* (1) backend memory */
  float loss_h, dloss;  /* host copies */
} pt_work;

typedef struct pt_run {
  const probe_train_config *c;
  probe_session *sess;
  probe_layer_desc layers[PT_MAX_MODULES + 3];
  int32_t ids[PT_MAX_MODULES + 3]; /* libprobe layer ids */
  size_t n_layers;
  int32_t lid_input, lid_denorm, lid_loss;
  int n_mods;
  pt_mod mods[PT_MAX_MODULES];
  int revin; /* module index of revin or -1 */
  int64_t B, in_dim, out_dim;
  size_t n_params;
  probe_layers_backend be;    /* the layer backend, chosen once */
  const probe_layer_ops *ops; /* be.ops */
  int dev;                    /* ops->device_memory */
  float *master;   /* (n_params) host FP32 masters */
  float *master_b; /* backend copy of the masters (== master on the CPU) */
  float *wcast;    /* backend: masters rounded to each module's precision */
  float *grad;     /* backend: scaled gradients, accumulated */
  float *grad_h;   /* host copy of grad (== grad on the CPU) */
  float *ugrad;    /* host: unscaled, clipped gradients */
  float *x_h, *y_h; /* host staging of a batch */
  int *lab_h;
  int64_t M;
  /* data-parallel: the communicator (NULL: one process, no all-reduce),
   * world size, and the global index of this rank's first micro-batch */
  probe_comm *comm;
  int world;
  int64_t micro0;
  float *ar_pre;  /* host: what this rank sends into the all-reduce */
  float *ar_post; /* host: what the all-reduce returned */
  float *ar_dev;  /* NCCL (CUDA backend, FP32 all-reduce): the device bucket */
  pt_work *work;
  float *scan;      /* host scratch for the non-finite scan off the host */
  size_t scan_cap;
  void **allocs;
  char *alloc_dev;
  size_t n_allocs, cap_allocs;
  /* first non-finite tensor: found by the trainer's own scan, or, when the
   * probe session computes statistics of every record (nf_from_probe), asked
   * of the session at the end, so that no tensor is read twice */
  int nf_from_probe;
  int64_t nf_step;
  int32_t nf_layer;
  probe_site nf_site;
  int64_t step;
} pt_run;

/* ---- memory: host or backend --------------------------------------------- */

/* n floats (or ints) of zeroed memory; on the backend when dev (device memory
 * on CUDA; the host on the CPU), else on the host. Freed by run_free. */
static void *alloc_mem(pt_run *R, size_t nfloats, int dev) {
  if (R->n_allocs == R->cap_allocs) {
    size_t nc = R->cap_allocs ? R->cap_allocs * 2 : 64;
    void **na = realloc(R->allocs, nc * sizeof(void *));
    if (!na) return NULL;
    R->allocs = na;
    char *nd = realloc(R->alloc_dev, nc);
    if (!nd) return NULL;
    R->alloc_dev = nd;
    R->cap_allocs = nc;
  }
  dev = dev && R->dev;
  size_t bytes = (nfloats ? nfloats : 1) * sizeof(float);
  void *p = NULL;
  if (dev) {
    if (R->ops->alloc(R->be.ctx, &p, bytes) != PROBE_OK) p = NULL;
  } else {
    p = calloc(1, bytes);
  }
  if (p) {
    R->allocs[R->n_allocs] = p;
    R->alloc_dev[R->n_allocs++] = (char)dev;
  }
  return p;
}

static void *ralloc(pt_run *R, size_t nfloats) { return alloc_mem(R, nfloats, 1); }
static void *halloc(pt_run *R, size_t nfloats) { return alloc_mem(R, nfloats, 0); }

/* Copies between host and backend memory; a memcpy on the CPU backend. */
static probe_status to_backend(pt_run *R, void *dst, const void *src,
                               size_t bytes) {
  if (!R->dev) {
    if (dst != src) memcpy(dst, src, bytes);
    return PROBE_OK;
  }
  return R->ops->copy(R->be.ctx, dst, src, bytes);
}
#define to_host to_backend

static void run_free(pt_run *R) {
  for (size_t i = 0; i < R->n_allocs; i++) {
    if (R->alloc_dev[i])
      R->ops->free(R->be.ctx, R->allocs[i]);
    else
      free(R->allocs[i]);
  }
  free(R->allocs);
  free(R->alloc_dev);
  free(R->work);
  free(R->scan);
  probe_layers_backend_free(&R->be);
  R->ops = NULL;
}

/* ---- recording -------------------------------------------------------------- */

static probe_status rec(pt_run *R, int32_t lid, probe_site site,
                        const float *data, size_t n) {
  if (R->nf_step < 0 && !R->nf_from_probe) {
    const float *h = data;
    if (R->dev) {
      if (n > R->scan_cap) {
        float *ns = realloc(R->scan, n * sizeof(float));
        if (!ns) return PROBE_ERR_NOMEM;
        R->scan = ns;
        R->scan_cap = n;
      }
      probe_status st = to_host(R, R->scan, data, n * sizeof(float));
      if (st != PROBE_OK) return st;
      h = R->scan;
    }
    for (size_t i = 0; i < n; i++) {
      if (!isfinite(h[i])) {
        R->nf_step = R->step;
        R->nf_layer = lid;
        R->nf_site = site;
        break;
      }
    }
  }
  if (!R->sess) return PROBE_OK;
  /* No host synchronisation per tensor on the CUDA backend: the layers run on
   * the legacy default stream (probe_layers_backend_init(.., NULL)) and
   * libprobe reads device tensors on a blocking stream of its own, which
   * CUDA orders after the work already queued on the legacy stream (and the
   * legacy stream after it), so the statistics see the finished tensor. */
  return probe_tensor_record(R->sess, R->ids[lid], site, PROBE_DTYPE_F32, data,
                             n);
}

#define TRY(x)                                                                 \
  do {                                                                         \
    probe_status st_ = (x);                                                    \
    if (st_ != PROBE_OK) return st_;                                           \
  } while (0)

/* ---- assembly -------------------------------------------------------------- */

/* Layer list, module widths and parameter layout (no allocation). */
static probe_status build_layout(pt_run *R, char *err, size_t errlen) {
  const probe_train_config *c = R->c;
  R->n_layers = layer_list(c, R->layers, PT_MAX_MODULES + 3);
  R->lid_input = 0;
  R->lid_loss = (int32_t)R->n_layers - 1;
  R->lid_denorm = -1;
  R->revin = -1;
  R->n_mods = c->n_modules;
  int64_t w = R->in_dim;
  size_t off = 0;
  for (int i = 0; i < c->n_modules; i++) {
    pt_mod *m = &R->mods[i];
    const pt_module_spec *s = &c->modules[i];
    m->spec = s;
    m->lid = i + 1;
    m->kind = R->layers[m->lid].kind;
    m->prec = R->layers[m->lid].precision;
    m->in_w = w;
    m->p_off = off;
    switch (s->type) {
    case PT_MOD_LINEAR:
      m->out_w = s->out;
      m->p_n = (size_t)(s->out * w + (s->bias ? s->out : 0));
      break;
    case PT_MOD_BN:
    case PT_MOD_LAYERNORM:
      m->out_w = w;
      m->p_n = (size_t)(2 * w);
      break;
    case PT_MOD_REVIN:
      m->out_w = w;
      m->p_n = s->affine ? 2 : 0;
      R->revin = i;
      if (s->denorm) R->lid_denorm = (int32_t)c->n_modules + 1;
      break;
    case PT_MOD_ATTENTION: {
      if (w % s->seq)
        return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                       "model[%d] (%s): input width %lld is not a multiple of "
                       "seq %lld", i, s->name, (long long)w, (long long)s->seq);
      int64_t C = w / s->seq;
      m->out_w = w;
      m->p_n = (size_t)(3 * C * C + 3 * C + C * C + C);
      break;
    }
    default:
      m->out_w = w;
      m->p_n = 0;
    }
    off += m->p_n;
    w = m->out_w;
  }
  int64_t want = R->out_dim;
  if (w != want)
    return pt_fail(err, errlen, PROBE_ERR_CONFIG,
                   "model: the last module gives %lld values per sample but "
                   "the data needs %lld (%s)", (long long)w, (long long)want,
                   c->loss == PT_LOSS_CE ? "classes" : "targets");
  R->n_params = off;
  return PROBE_OK;
}

/* The parameter arrays: masters, their backend copies and the gradients. */
static probe_status build_params(pt_run *R, char *err, size_t errlen) {
  const size_t off = R->n_params;
  R->master = halloc(R, off);
  R->master_b = R->dev ? ralloc(R, off) : R->master;
  R->wcast = ralloc(R, off);
  R->grad = ralloc(R, off);
  R->grad_h = R->dev ? halloc(R, off) : R->grad;
  R->ugrad = halloc(R, off);
  R->x_h = halloc(R, (size_t)(R->B * R->in_dim));
  R->y_h = halloc(R, (size_t)(R->B * R->out_dim));
  R->lab_h = halloc(R, (size_t)R->B);
  if (R->comm) {
    R->ar_pre = halloc(R, off);
    R->ar_post = halloc(R, off);
    if (!R->ar_pre || !R->ar_post)
      return pt_fail(err, errlen, PROBE_ERR_NOMEM, "trainer: out of memory");
    /* NCCL all-reduces device memory: FP32 buckets of the CUDA backend (the
     * FP16 emulation stays on the host) */
    if (probe_comm_get_kind(R->comm) == PROBE_COMM_NCCL && R->dev &&
        R->c->dist.dtype == PT_REDUCE_F32 && !(R->ar_dev = ralloc(R, off)))
      return pt_fail(err, errlen, PROBE_ERR_NOMEM, "trainer: out of device memory");
  }
  if (!R->master || !R->master_b || !R->wcast || !R->grad || !R->grad_h ||
      !R->ugrad || !R->x_h || !R->y_h || !R->lab_h)
    return pt_fail(err, errlen, PROBE_ERR_NOMEM, "trainer: out of memory");
  return PROBE_OK;
}

/* Initialisation as PyTorch's defaults, from the seed; module state (BN
 * running statistics) and scratch (attention backward). */
static probe_status init_modules(pt_run *R, char *err, size_t errlen) {
  const probe_train_config *c = R->c;
  pt_rng r;
  pt_rng_seed(&r, pt_seed_mix(c->seed, 0x1417ULL));
  for (int i = 0; i < R->n_mods; i++) {
    pt_mod *m = &R->mods[i];
    float *p = R->master + m->p_off;
    int64_t C = m->in_w;
    switch (m->spec->type) {
    case PT_MOD_LINEAR: {
      double k = m->spec->init_gain / sqrt((double)C);
      for (size_t j = 0; j < m->p_n; j++)
        p[j] = (float)((2.0 * pt_rng_uniform(&r) - 1.0) * k);
      break;
    }
    case PT_MOD_BN:
    case PT_MOD_LAYERNORM:
      for (int64_t j = 0; j < C; j++) p[j] = 1.0f; /* gamma; beta = 0 */
      if (m->spec->type == PT_MOD_BN) {
        m->run_mean = ralloc(R, (size_t)C);
        m->run_var = ralloc(R, (size_t)C);
        if (!m->run_mean || !m->run_var) return PROBE_ERR_NOMEM;
        float *ones = malloc((size_t)C * sizeof(float));
        if (!ones) return PROBE_ERR_NOMEM;
        for (int64_t j = 0; j < C; j++) ones[j] = 1.0f;
        probe_status st = to_backend(R, m->run_var, ones, (size_t)C * sizeof(float));
        free(ones);
        if (st != PROBE_OK) return pt_fail(err, errlen, st, "trainer: device copy failed");
      }
      break;
    case PT_MOD_REVIN:
      if (m->p_n) p[0] = 1.0f;
      break;
    case PT_MOD_ATTENTION: {
      int64_t Ca = C / m->spec->seq, T = m->spec->seq;
      double a = sqrt(6.0 / (double)(4 * Ca)); /* xavier on (3C, C) */
      for (int64_t j = 0; j < 3 * Ca * Ca; j++)
        p[j] = (float)((2.0 * pt_rng_uniform(&r) - 1.0) * a);
      float *wo = p + 3 * Ca * Ca + 3 * Ca;
      double k = 1.0 / sqrt((double)Ca);
      for (int64_t j = 0; j < Ca * Ca; j++)
        wo[j] = (float)((2.0 * pt_rng_uniform(&r) - 1.0) * k);
      size_t BT = (size_t)(R->B * T);
      m->dqkv = ralloc(R, BT * (size_t)(3 * Ca));
      m->datty = ralloc(R, BT * (size_t)Ca);
      m->dprobs = ralloc(R, BT * (size_t)T);
      m->dscores = ralloc(R, BT * (size_t)T);
      if (!m->dqkv || !m->datty || !m->dprobs || !m->dscores)
        return PROBE_ERR_NOMEM;
      break;
    }
    default: break;
    }
  }
  return PROBE_OK;
}

/* Workspaces, one per micro-batch: activations, their gradients, saved
 * intermediates, targets. */
static probe_status build_workspaces(pt_run *R, char *err, size_t errlen) {
  R->work = calloc((size_t)R->M, sizeof(pt_work));
  if (!R->work) return PROBE_ERR_NOMEM;
  const size_t B = (size_t)R->B;
  for (int64_t mb = 0; mb < R->M; mb++) {
    pt_work *W = &R->work[mb];
    int ok = 1;
    for (int i = 0; i <= R->n_mods; i++) {
      size_t wd = (size_t)(i == 0 ? R->in_dim : R->mods[i - 1].out_w);
      ok &= (W->act[i] = ralloc(R, B * wd)) != NULL;
      ok &= (W->dact[i] = ralloc(R, B * wd)) != NULL;
    }
    for (int i = 0; i < R->n_mods; i++) {
      pt_mod *m = &R->mods[i];
      size_t C = (size_t)m->in_w;
      switch (m->spec->type) {
      case PT_MOD_BN:
        ok &= (W->s1[i] = ralloc(R, C)) != NULL;
        ok &= (W->s2[i] = ralloc(R, C)) != NULL;
        break;
      case PT_MOD_LAYERNORM:
      case PT_MOD_REVIN:
        ok &= (W->s1[i] = ralloc(R, B)) != NULL; /* mean */
        ok &= (W->s2[i] = ralloc(R, B)) != NULL; /* rstd / stdev */
        ok &= (W->s3[i] = ralloc(R, B)) != NULL; /* var */
        break;
      case PT_MOD_ATTENTION: {
        size_t T = (size_t)m->spec->seq, Ca = C / T;
        ok &= (W->s1[i] = ralloc(R, B * T * 3 * Ca)) != NULL; /* qkv */
        ok &= (W->s2[i] = ralloc(R, B * T * T)) != NULL;      /* scores */
        ok &= (W->s3[i] = ralloc(R, B * T * T)) != NULL;      /* probs */
        ok &= (W->s4[i] = ralloc(R, B * T * Ca)) != NULL;     /* atty */
        break;
      }
      default: break;
      }
    }
    size_t od = (size_t)R->out_dim;
    if (R->lid_denorm >= 0) {
      ok &= (W->pred = ralloc(R, B * od)) != NULL;
      ok &= (W->dpred = ralloc(R, B * od)) != NULL;
    } else {
      W->pred = W->act[R->n_mods];
      W->dpred = W->dact[R->n_mods];
    }
    ok &= (W->target = ralloc(R, B * od)) != NULL;
    ok &= (W->labels = ralloc(R, B)) != NULL;
    ok &= (W->loss = ralloc(R, 1)) != NULL;
    if (!ok) return pt_fail(err, errlen, PROBE_ERR_NOMEM, "trainer: out of memory");
  }
  return PROBE_OK;
}

/* The model of R->c on R's backend, initialised. */
static probe_status build(pt_run *R, char *err, size_t errlen) {
  probe_status st = build_layout(R, err, errlen);
  if (st == PROBE_OK) st = build_params(R, err, errlen);
  if (st == PROBE_OK) st = init_modules(R, err, errlen);
  if (st == PROBE_OK) st = build_workspaces(R, err, errlen);
  return st;
}

/* ---- forward / backward of one micro-batch -------------------------------- */

/* Module i's forward kernel on micro-batch W, and its saved intermediate
 * recorded (fwd_saved: the quantity that overflows or loses precision). */
static probe_status module_forward(pt_run *R, pt_work *W, int i) {
  const probe_layer_ops *ops = R->ops;
  void *bx = R->be.ctx;
  const int B = (int)R->B;
  pt_mod *m = &R->mods[i];
  const pt_module_spec *s = m->spec;
  float *in = W->act[i], *out = W->act[i + 1];
  const float *p = R->wcast + m->p_off;
  const int C = (int)m->in_w;
  const size_t n_in = (size_t)B * (size_t)C;
  switch (s->type) {
  case PT_MOD_LINEAR:
    TRY(ops->linear_forward(bx, out, in, p, s->bias ? p + s->out * C : NULL,
                            B, C, (int)s->out, m->prec));
    break;
  case PT_MOD_BN:
    TRY(ops->bn_forward(bx, out, W->s1[i], W->s2[i], m->run_mean, m->run_var,
                        in, p, p + C, (float)s->momentum, (float)s->eps, B, C,
                        m->prec));
    TRY(rec(R, m->lid, PROBE_SITE_FWD_SAVED, W->s2[i], (size_t)C)); /* var */
    break;
  case PT_MOD_LAYERNORM:
    TRY(ops->layernorm_forward(bx, out, W->s1[i], W->s2[i], W->s3[i], in, p,
                               p + C, (float)s->eps, B, C, m->prec));
    /* the variance as materialised: inf where it overflowed, 0 where it
     * lost all precision (rstd would read 0 and finite) */
    TRY(rec(R, m->lid, PROBE_SITE_FWD_SAVED, W->s3[i], (size_t)B));
    break;
  case PT_MOD_REVIN:
    TRY(ops->revin_norm_forward(
        bx, out, W->s1[i], W->s2[i], W->s3[i], in, s->affine ? p : NULL,
        s->affine ? p + 1 : NULL, (float)s->eps, B, C, 1, m->prec));
    TRY(rec(R, m->lid, PROBE_SITE_FWD_SAVED, W->s3[i], (size_t)B)); /* var */
    break;
  case PT_MOD_RELU:
    TRY(ops->relu_forward(bx, out, in, n_in, m->prec));
    break;
  case PT_MOD_GELU:
    TRY(ops->gelu_forward(bx, out, in, n_in, m->prec));
    break;
  case PT_MOD_SOFTMAX:
    TRY(ops->softmax_forward(bx, out, in, B, C, m->prec));
    break;
  case PT_MOD_ATTENTION: {
    int T = (int)s->seq, Ca = C / T;
    const float *wqkv = p, *bqkv = p + 3 * Ca * Ca, *wo = bqkv + 3 * Ca,
                *bo = wo + Ca * Ca;
    TRY(ops->attention_forward(bx, out, W->s1[i], W->s2[i], W->s3[i],
                               W->s4[i], in, wqkv, bqkv, wo, bo, 0, B, T, Ca,
                               m->prec));
    TRY(rec(R, m->lid, PROBE_SITE_FWD_SAVED, W->s2[i],
            (size_t)B * (size_t)T * (size_t)T)); /* scores */
    break;
  }
  default:
    return PROBE_ERR_STATE;
  }
  return PROBE_OK;
}

/* The RevIN denormalisation (when there is one) and the loss. */
static probe_status head_forward(pt_run *R, pt_work *W) {
  const probe_layer_ops *ops = R->ops;
  void *bx = R->be.ctx;
  const int B = (int)R->B, L = R->n_mods;
  const size_t n_out = (size_t)(R->B * R->out_dim);
  if (R->lid_denorm >= 0) {
    pt_mod *m = &R->mods[R->revin];
    const float *p = R->wcast + m->p_off;
    int aff = m->spec->affine;
    TRY(rec(R, R->lid_denorm, PROBE_SITE_FWD_IN, W->act[L], n_out));
    TRY(ops->revin_denorm_forward(bx, W->pred, W->act[L], W->s1[R->revin],
                                  W->s2[R->revin], aff ? p : NULL,
                                  aff ? p + 1 : NULL, (float)m->spec->eps, B,
                                  (int)R->out_dim, 1, m->prec));
    TRY(rec(R, R->lid_denorm, PROBE_SITE_FWD_OUT, W->pred, n_out));
  }
  probe_dtype lp = R->layers[R->lid_loss].precision;
  TRY(rec(R, R->lid_loss, PROBE_SITE_FWD_IN, W->pred, n_out));
  if (R->c->loss == PT_LOSS_MSE)
    TRY(ops->mse_forward(bx, W->loss, W->pred, W->target, n_out, lp));
  else
    TRY(ops->crossentropy_forward(bx, W->loss, NULL, W->pred, W->labels, B,
                                  (int)R->out_dim, lp));
  TRY(to_host(R, &W->loss_h, W->loss, sizeof(float)));
  if (R->c->loss_weight != 1.0) {
    W->loss_h *= (float)R->c->loss_weight;
    TRY(to_backend(R, W->loss, &W->loss_h, sizeof(float)));
  }
  TRY(rec(R, R->lid_loss, PROBE_SITE_FWD_OUT, W->loss, 1));
  return PROBE_OK;
}

static probe_status forward(pt_run *R, pt_work *W, int first_micro) {
  const int B = (int)R->B;
  TRY(rec(R, R->lid_input, PROBE_SITE_FWD_OUT, W->act[0],
          (size_t)(R->B * R->in_dim)));
  for (int i = 0; i < R->n_mods; i++) {
    pt_mod *m = &R->mods[i];
    TRY(rec(R, m->lid, PROBE_SITE_FWD_IN, W->act[i],
            (size_t)B * (size_t)m->in_w));
    if (m->p_n && first_micro)
      TRY(rec(R, m->lid, PROBE_SITE_WEIGHT, R->wcast + m->p_off, m->p_n));
    TRY(module_forward(R, W, i));
    TRY(rec(R, m->lid, PROBE_SITE_FWD_OUT, W->act[i + 1],
            (size_t)B * (size_t)m->out_w));
  }
  return head_forward(R, W);
}

/* Module i's backward kernel: dact[i] from dact[i+1]; parameter gradients
 * accumulated into grad. */
static probe_status module_backward(pt_run *R, pt_work *W, int i) {
  const probe_layer_ops *ops = R->ops;
  void *bx = R->be.ctx;
  const int B = (int)R->B;
  pt_mod *m = &R->mods[i];
  const pt_module_spec *s = m->spec;
  const float *p = R->wcast + m->p_off;
  float *g = R->grad + m->p_off;
  float *in = W->act[i], *out = W->act[i + 1];
  float *din = W->dact[i], *dout = W->dact[i + 1];
  const int C = (int)m->in_w;
  const size_t n_in = (size_t)B * (size_t)C;
  switch (s->type) {
  case PT_MOD_LINEAR:
    TRY(ops->linear_backward(bx, din, g, s->bias ? g + s->out * C : NULL,
                             dout, in, p, B, C, (int)s->out, m->prec));
    break;
  case PT_MOD_BN:
    TRY(ops->bn_backward(bx, din, g, g + C, dout, in, W->s1[i], W->s2[i], p,
                         (float)s->eps, B, C, m->prec));
    break;
  case PT_MOD_LAYERNORM:
    TRY(ops->layernorm_backward(bx, din, g, g + C, dout, in, W->s1[i],
                                W->s2[i], p, B, C, m->prec));
    break;
  case PT_MOD_REVIN:
    TRY(ops->revin_norm_backward(
        bx, din, s->affine ? g : NULL, s->affine ? g + 1 : NULL, dout, in,
        W->s1[i], W->s2[i], s->affine ? p : NULL, B, C, 1, m->prec));
    break;
  case PT_MOD_RELU:
    TRY(ops->relu_backward(bx, din, dout, in, n_in, m->prec));
    break;
  case PT_MOD_GELU:
    TRY(ops->gelu_backward(bx, din, dout, in, n_in, m->prec));
    break;
  case PT_MOD_SOFTMAX:
    TRY(ops->softmax_backward(bx, din, dout, out, B, C, m->prec));
    break;
  case PT_MOD_ATTENTION: {
    int T = (int)s->seq, Ca = C / T;
    const float *wqkv = p, *wo = p + 3 * Ca * Ca + 3 * Ca;
    float *gwqkv = g, *gbqkv = g + 3 * Ca * Ca, *gwo = gbqkv + 3 * Ca,
          *gbo = gwo + Ca * Ca;
    TRY(ops->attention_backward(bx, din, gwqkv, gbqkv, gwo, gbo, m->dqkv,
                                m->datty, m->dprobs, m->dscores, dout, in,
                                W->s1[i], W->s3[i], W->s4[i], wqkv, wo, B, T,
                                Ca, m->prec));
    break;
  }
  default:
    return PROBE_ERR_STATE;
  }
  return PROBE_OK;
}

/* The loss's backward (seeded with dloss) and the denormalisation's. */
static probe_status head_backward(pt_run *R, pt_work *W, float dloss) {
  const probe_layer_ops *ops = R->ops;
  void *bx = R->be.ctx;
  const int B = (int)R->B, L = R->n_mods;
  const size_t n_out = (size_t)(R->B * R->out_dim);
  probe_dtype lp = R->layers[R->lid_loss].precision;
  W->dloss = dloss; /* host value: libprobe takes host or device memory */
  TRY(rec(R, R->lid_loss, PROBE_SITE_GRAD_OUT, &W->dloss, 1));
  if (R->c->loss == PT_LOSS_MSE)
    TRY(ops->mse_backward(bx, W->dpred, W->pred, W->target, dloss, n_out, lp));
  else
    TRY(ops->crossentropy_backward(bx, W->dpred, W->pred, W->labels, dloss, B,
                                   (int)R->out_dim, lp));
  TRY(rec(R, R->lid_loss, PROBE_SITE_GRAD_IN, W->dpred, n_out));
  if (R->lid_denorm >= 0) {
    pt_mod *m = &R->mods[R->revin];
    const float *p = R->wcast + m->p_off;
    float *g = R->grad + m->p_off;
    int aff = m->spec->affine;
    TRY(rec(R, R->lid_denorm, PROBE_SITE_GRAD_OUT, W->dpred, n_out));
    TRY(ops->revin_denorm_backward(
        bx, W->dact[L], aff ? g : NULL, aff ? g + 1 : NULL, W->dpred, W->act[L],
        W->s2[R->revin], aff ? p : NULL, aff ? p + 1 : NULL,
        (float)m->spec->eps, B, (int)R->out_dim, 1, m->prec));
    TRY(rec(R, R->lid_denorm, PROBE_SITE_GRAD_IN, W->dact[L], n_out));
  }
  return PROBE_OK;
}

static probe_status backward(pt_run *R, pt_work *W, float dloss,
                             int last_micro) {
  const int B = (int)R->B;
  TRY(head_backward(R, W, dloss));
  for (int i = R->n_mods - 1; i >= 0; i--) {
    pt_mod *m = &R->mods[i];
    TRY(rec(R, m->lid, PROBE_SITE_GRAD_OUT, W->dact[i + 1],
            (size_t)B * (size_t)m->out_w));
    TRY(module_backward(R, W, i));
    if (m->p_n && last_micro)
      TRY(rec(R, m->lid, PROBE_SITE_WEIGHT_GRAD, R->grad + m->p_off, m->p_n));
    TRY(rec(R, m->lid, PROBE_SITE_GRAD_IN, W->dact[i],
            (size_t)B * (size_t)m->in_w));
  }
  return PROBE_OK;
}

/* ---- memory: computed from the config before anything is allocated -------- */

/* Bytes build() and the kernels will allocate for the model (host and
 * backend), mirroring build(): parameters and their copies, optimizer state,
 * one workspace per micro-batch, module scratch, the CPU kernels' rounding
 * copies (FP16/BF16) and, off the host, the scan buffer. Computed in double:
 * the largest configs overflow 64-bit integers of bytes only in theory, but
 * products of several 2^20 sizes come close. */
static void model_memory(const probe_train_config *c, int64_t in_dim,
                         int64_t out_dim, int dev, int world, double *host,
                         double *backend) {
  const double B = (double)c->data.batch, M = (double)c->micro_batches;
  double P = 0, work = 0, mod = 0, transient = 0, largest = B * (double)in_dim;
  double w = (double)in_dim, acts = w;
  for (int i = 0; i < c->n_modules; i++) {
    const pt_module_spec *s = &c->modules[i];
    double out_w = w;
    switch (s->type) {
    case PT_MOD_LINEAR: {
      out_w = (double)s->out;
      P += out_w * w + (s->bias ? out_w : 0);
      /* rounded input, weight, dout copies + the dweight tile */
      double t = B * w + 2 * out_w * w + B * out_w + B * w;
      if (t > transient) transient = t;
      break;
    }
    case PT_MOD_BN:
      P += 2 * w;
      mod += 2 * w;       /* running statistics */
      work += 2 * w;      /* mean, var */
      break;
    case PT_MOD_LAYERNORM:
      P += 2 * w;
      work += 3 * B;      /* mean, rstd, var */
      break;
    case PT_MOD_REVIN:
      P += s->affine ? 2 : 0;
      work += 3 * B;
      break;
    case PT_MOD_ATTENTION: {
      double T = (double)s->seq, Ca = w / T;
      P += 4 * Ca * Ca + 4 * Ca;
      double bt = B * T;
      mod += bt * (4 * Ca + 2 * T);              /* backward scratch */
      work += bt * (3 * Ca + 2 * T + Ca);        /* qkv, scores, probs, atty */
      double t = 2 * bt * 3 * Ca + 2 * 3 * Ca * Ca + bt * Ca + bt * 3 * Ca;
      if (t > transient) transient = t;
      if (bt * T > largest) largest = bt * T;
      break;
    }
    default: break;
    }
    w = out_w;
    acts += w;
    if (B * w > largest) largest = B * w;
  }
  const double od = (double)out_dim;
  work += 2 * B * acts;                     /* act, dact */
  work += B * od + B + 1;                   /* target, labels, loss */
  for (int i = 0; i < c->n_modules; i++)
    if (c->modules[i].type == PT_MOD_REVIN && c->modules[i].denorm)
      work += 2 * B * od;                   /* pred, dpred */
  const double fl = (double)sizeof(float);
  /* host: masters, unscaled gradients, optimizer m and v, batch staging */
  double h = 4 * P + B * (double)in_dim + B * od + B;
  /* backend: the masters as used, scaled gradients, workspaces, scratch */
  double b = 2 * P + M * work + mod + transient;
  if (world > 0) { /* all-reduce send and result buffers, the gather */
    h += 2 * P + (double)world * fmin(P, (double)PT_COMM_CHUNK);
    if (dev) b += P; /* NCCL's device bucket */
  }
  if (dev) {
    b += P;           /* the backend copy of the masters */
    h += P + largest; /* host copy of the gradients; scan buffer */
    transient /= 2;   /* 16-bit operands on the device */
  }
  *host = h * fl + (dev ? 0 : b * fl);
  *backend = dev ? b * fl : 0;
}

/* What a run maps besides what run_memory_need counts, against an
 * address-space limit: OpenBLAS's GEMM buffer (128 MiB + a page, taken at
 * the first GEMM; OpenBLAS retries a failed one forever, a hang), the trace
 * writer's thread (an 8 MiB stack and a 64 MiB malloc arena, reserved even
 * if unused) and slack for HDF5's caches. Under a data limit (`ulimit -d`)
 * only the buffer and the caches count. */
#define PT_RESERVE_AS_BYTES (256.0 * 1024 * 1024)
#define PT_RESERVE_DATA_BYTES (160.0 * 1024 * 1024)

/* This process's address space now, or its data segment (statm's size and
 * data fields), in bytes; 0 where it cannot be read. */
static double process_bytes(int data) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long v[7] = {0};
  int n = fscanf(f, "%llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                 &v[4], &v[5]);
  fclose(f);
  if (n != 6) return 0;
  return (double)(data ? v[5] : v[0]) * (double)sysconf(_SC_PAGESIZE);
}

/* The default limit: 80% of physical memory, or what is left under the
 * address-space / data limit of this process when one is set and lower:
 * the limit less what the process holds already (its libraries: ~0.9 GiB
 * of address space in a CUDA build) and the reserve above. */
static double default_memory_limit(const char **why, double *rlimit,
                                   double *held, double *reserve) {
  double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  double lim = phys > 0 ? 0.8 * phys : 0;
  *why = "80% of physical memory";
  *rlimit = 0;
  static const int res[2] = {RLIMIT_AS, RLIMIT_DATA};
  for (int i = 0; i < 2; i++) {
    struct rlimit rl;
    if (getrlimit(res[i], &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
    double h = process_bytes(i), r = i ? PT_RESERVE_DATA_BYTES : PT_RESERVE_AS_BYTES;
    double left = (double)rl.rlim_cur - h - r;
    if (left < 1) left = 1;
    if (lim <= 0 || left < lim) {
      lim = left;
      *rlimit = (double)rl.rlim_cur;
      *held = h;
      *reserve = r;
      *why = i ? "the process's data limit (ulimit -d)"
               : "the process's address-space limit (ulimit -v)";
    }
  }
  return lim;
}

/* "1.50 GiB" */
static const char *fmt_bytes(double b, char *buf, size_t n) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int k = 0;
  while (b >= 1024.0 && k < 6) {
    b /= 1024.0;
    k++;
  }
  snprintf(buf, n, k ? "%.2f %s" : "%.0f %s", b, u[k]);
  return buf;
}

/* Refuses a run whose host memory need (model plus data already loaded,
 * `data` of it) exceeds the limit, naming both figures. */
static probe_status check_memory(const char *what, double need, double data,
                                 const probe_train_opts *o, char *err,
                                 size_t errlen) {
  const char *why = "max_memory";
  double rlimit = 0, held = 0, reserve = 0;
  double lim = o->max_memory ? (double)o->max_memory
                             : default_memory_limit(&why, &rlimit, &held, &reserve);
  if (lim <= 0 || need <= lim) return PROBE_OK;
  char a[32], b[32], d[48] = "";
  if (data > 0) {
    char t[32];
    snprintf(d, sizeof d, " (its data %s)", fmt_bytes(data, t, sizeof t));
  }
  if (rlimit > 0) {
    char r[32], h[32], k[32];
    return pt_fail(err, errlen, PROBE_ERR_NOMEM,
                   "%s needs %s of memory%s, more than is left under %s of "
                   "%s: the program and its libraries hold %s and %s is kept "
                   "for BLAS and the trace writer; raise the limit, or "
                   "shrink the model, batch or data",
                   what, fmt_bytes(need, a, sizeof a), d, why,
                   fmt_bytes(rlimit, r, sizeof r), fmt_bytes(held, h, sizeof h),
                   fmt_bytes(reserve, k, sizeof k));
  }
  return pt_fail(err, errlen, PROBE_ERR_NOMEM,
                 "%s needs %s of memory%s, more than the limit of %s (%s); "
                 "shrink the model, batch or data, or raise max_memory",
                 what, fmt_bytes(need, a, sizeof a), d,
                 fmt_bytes(lim, b, sizeof b), why);
}

/* ---- the run ------------------------------------------------------------- */

void probe_train_opts_init(probe_train_opts *o) {
  memset(o, 0, sizeof *o);
  o->mode = PROBE_MODE_SCALARS;
  o->stop_on_nonfinite = -1;
  o->final_window = 10;
  o->weight_digest = -1;
}

int probe_train_backend_available(probe_backend b) {
  probe_layers_backend be;
  if (probe_layers_backend_init(&be, b, NULL) != PROBE_OK) return 0;
  probe_layers_backend_free(&be);
  return 1;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void result_init(probe_train_result *res) {
  memset(res, 0, sizeof *res);
  res->final_loss = NAN;
  res->last_loss = NAN;
  res->first_loss = NAN;
  res->min_scale = INFINITY;
  res->max_scale = 0.0;
  res->first_nonfinite_loss_step = -1;
  res->first_nonfinite_step = -1;
  res->first_nonfinite_site = PROBE_SITE_FWD_OUT;
}

/* Opens the trace and registers every layer. */
static probe_status open_trace(pt_run *R, const probe_train_opts *o, char *err,
                               size_t errlen) {
  probe_options po;
  probe_options_init(&po);
  po.mode = o->mode;
  if (o->ring_steps > 0) po.ring_steps = o->ring_steps;
  po.command_line = o->command_line;
  po.overwrite = !o->trace_exclusive;
  char *cfg = probe_config_to_json(R->c);
  char policy[512];
  probe_config_policy_str(R->c, policy, sizeof policy);
  po.config_json = cfg;
  po.precision_policy = policy;
  if (R->comm) {
    po.rank = probe_comm_rank(R->comm);
    po.world_size = R->world;
  }
  po.run_id = o->run_id;
  if (o->flush_steps > 0) po.flush_steps = o->flush_steps;
  if (o->flush_seconds > 0) po.flush_seconds = o->flush_seconds;
  probe_status st = probe_session_open(&R->sess, o->trace_path, &po);
  free(cfg);
  if (st != PROBE_OK) {
    /* a failed open leaves its line for the NULL handle */
    const char *why = probe_session_last_error(R->sess);
    pt_fail(err, errlen, st, "%s: cannot open trace: %s", o->trace_path,
            why && *why ? why : probe_status_str(st));
    if (R->sess) probe_session_close(R->sess);
    R->sess = NULL;
    return st;
  }
  for (size_t i = 0; i < R->n_layers; i++) {
    st = probe_layer_register(R->sess, R->layers[i].name, R->layers[i].kind,
                              R->layers[i].precision, &R->ids[i]);
    if (st != PROBE_OK)
      return pt_fail(err, errlen, st, "trace: registering layer %s: %s",
                     R->layers[i].name, probe_session_last_error(R->sess));
  }
  int64_t step;
  int32_t layer;
  probe_site site;
  if (probe_session_first_nonfinite(R->sess, &step, &layer, &site,
                                    &R->nf_from_probe) != PROBE_OK)
    R->nf_from_probe = 0;
  return PROBE_OK;
}

/* Takes the first non-finite tensor from the session when it computed every
 * record (see pt_run.nf_from_probe). */
static void nf_from_session(pt_run *R) {
  int64_t step;
  int32_t layer;
  probe_site site;
  if (!R->sess || !R->nf_from_probe ||
      probe_session_first_nonfinite(R->sess, &step, &layer, &site, NULL) !=
          PROBE_OK ||
      step < 0)
    return;
  for (size_t i = 0; i < R->n_layers; i++)
    if (R->ids[i] == layer) {
      R->nf_step = step;
      R->nf_layer = (int32_t)i;
      R->nf_site = site;
      return;
    }
}

/* Everything one probe_train call holds besides the model. */
typedef struct pt_train {
  pt_run R;
  const probe_train_config *c;
  const probe_train_opts *o;
  probe_train_result *out;
  char *err;
  size_t errlen;
  pt_data *data;
  pt_optim opt;
  pt_scaler scaler;
  double *losses;   /* the last `window` losses, a ring by step % window */
  int64_t window;
  int64_t skip_run; /* current run of skipped steps */
  double t0, t_loop, t_step;
  int reported;                   /* SETUP was reported: DONE will be */
  int digest;                     /* the weight digest is measured */
  probe_train_progress_info info; /* what the report hook last saw */
} pt_train;

/* What one step computed, stage by stage. */
typedef struct pt_step {
  int64_t step;
  float scale;      /* the loss scale the step used */
  double lr;
  double loss;      /* mean over micro-batches */
  int found_inf;    /* a non-finite gradient after unscaling */
  int skip;         /* optimizer step skipped (found_inf with scaling on) */
  double norm, coef; /* global gradient norm, clip coefficient */
} pt_step;

/* Calls the report hook (if any); nonzero: stop the run. */
static int report(pt_train *T, probe_train_phase phase) {
  if (!T->o->report) return 0;
  T->info.phase = phase;
  T->info.steps = T->c->steps;
  T->info.elapsed_s = now_seconds() - T->t0;
  return T->o->report(&T->info, T->o->user);
}

/* Stage 0: backend, data, memory check, model, optimizer, trace, scaler. */
static probe_status run_setup(pt_train *T) {
  const probe_train_config *c = T->c;
  pt_run *R = &T->R;
  char *err = T->err;
  size_t errlen = T->errlen;
  R->c = c;
  R->nf_step = -1;
  R->B = c->data.batch;
  R->M = c->micro_batches;
  R->comm = T->o->comm;
  R->world = probe_comm_size(R->comm);
  R->micro0 = (int64_t)probe_comm_rank(R->comm) * R->M;
  probe_status st =
      probe_layers_backend_init(&R->be, T->o->backend, NULL);
  if (st != PROBE_OK) {
    const char *why = probe_layers_backend_error(T->o->backend);
    return pt_fail(err, errlen, st, "%s backend: %s%s%s",
                   probe_backend_name(T->o->backend), probe_status_str(st),
                   why ? ": " : "", why ? why : "");
  }
  R->ops = R->be.ops;
  R->dev = R->ops->device_memory;
  /* Generator parameters are sized by the config alone, an HDF5 file's
   * datasets by the shapes it declares: checked before they are allocated
   * (a 2 KiB file can declare 2^62 values); all file data is checked again
   * with the model once loaded. */
  st = check_memory(c->data.kind == PT_DATA_HDF5 ? "the data file"
                                                 : "data generation",
                    pt_data_need_bytes(&c->data, c->loss), 0, T->o, err,
                    errlen);
  if (st != PROBE_OK) return st;
  st = pt_data_open(&T->data, &c->data, c->loss, c->seed, err, errlen);
  if (st != PROBE_OK) return st;
  /* the NaN of data.nan_step: the first micro-batch of rank data.nan_rank */
  pt_data_set_nan_micro(T->data, c->data.nan_rank * R->M);
  R->in_dim = pt_data_in_dim(T->data);
  R->out_dim = pt_data_out_dim(T->data);
  double host, backend, data = (double)pt_data_bytes(T->data);
  model_memory(c, R->in_dim, R->out_dim, R->dev, R->comm ? R->world : 0,
               &host, &backend);
  st = check_memory("this config", host + data, data, T->o, err, errlen);
  if (st != PROBE_OK) return st;
  T->info.host_bytes = (uint64_t)(host + data);
  T->info.device_bytes = (uint64_t)backend;
  T->info.loss = NAN;
  T->info.scale = NAN;
  T->reported = 1;
  if (report(T, PROBE_TRAIN_PHASE_SETUP)) {
    T->out->interrupted = 1;
    return pt_fail(err, errlen, PROBE_ERR_INTERRUPTED,
                   "trainer: stopped before the first step");
  }
  st = build(R, err, errlen);
  if (st != PROBE_OK) return st;
  if (pt_optim_init(&T->opt, &c->opt, R->n_params) != PROBE_OK)
    return pt_fail(err, errlen, PROBE_ERR_NOMEM, "trainer: out of memory");
  T->window = T->o->final_window > 0 ? T->o->final_window : 10;
  T->losses = malloc((size_t)T->window * sizeof(double));
  if (!T->losses)
    return pt_fail(err, errlen, PROBE_ERR_NOMEM, "trainer: out of memory");
  if (T->o->trace_path) {
    st = open_trace(R, T->o, err, errlen);
    if (st != PROBE_OK) return st;
  }
  /* Loss scaling applies to fp16 runs; fp32 and bf16 train unscaled. */
  pt_scaler_spec ss = c->scaler;
  if (c->precision != PROBE_DTYPE_F16) ss.enabled = 0;
  pt_scaler_init(&T->scaler, &ss);
  T->out->scaler_enabled = ss.enabled != 0;
  T->out->clip_max_norm = c->clip_max_norm > 0 ? c->clip_max_norm : 0.0;
  return PROBE_OK;
}

/* Stage 1: the FP32 masters cast to each module's precision, "as used";
 * the scaled-gradient accumulators zeroed. */
static probe_status step_cast_weights(pt_run *R) {
  probe_status st =
      to_backend(R, R->master_b, R->master, R->n_params * sizeof(float));
  for (int i = 0; i < R->n_mods && st == PROBE_OK; i++)
    if (R->mods[i].p_n)
      st = R->ops->round(R->be.ctx, R->wcast + R->mods[i].p_off,
                         R->master_b + R->mods[i].p_off, R->mods[i].p_n,
                         R->mods[i].prec);
  memset(R->grad_h, 0, R->n_params * sizeof(float));
  if (st == PROBE_OK && R->dev)
    st = to_backend(R, R->grad, R->grad_h, R->n_params * sizeof(float));
  return st;
}

/* Micro-batch mb of the step's data into its workspace (staged on the host
 * when the backend's memory is not). */
static probe_status load_batch(pt_run *R, pt_data *data, int64_t step,
                               int64_t mb) {
  pt_work *W = &R->work[mb];
  const int64_t g = R->micro0 + mb; /* the global micro-batch */
  if (!R->dev) return pt_data_batch(data, step, g, W->act[0], W->target, W->labels);
  probe_status st = pt_data_batch(data, step, g, R->x_h, R->y_h, R->lab_h);
  if (st == PROBE_OK)
    st = to_backend(R, W->act[0], R->x_h,
                    (size_t)(R->B * R->in_dim) * sizeof(float));
  if (st == PROBE_OK && R->c->loss == PT_LOSS_MSE)
    st = to_backend(R, W->target, R->y_h,
                    (size_t)(R->B * R->out_dim) * sizeof(float));
  if (st == PROBE_OK && R->c->loss == PT_LOSS_CE)
    st = to_backend(R, W->labels, R->lab_h, (size_t)R->B * sizeof(int));
  return st;
}

/* Stage 2: forward and scaled backward of every micro-batch; the scaled
 * gradients end up in grad_h on the host. */
static probe_status step_forward_backward(pt_train *T, pt_step *S) {
  pt_run *R = &T->R;
  /* d(weight * loss / M)/d(loss) times the scale, in FP32. */
  const float dloss = S->scale / (float)R->M * (float)T->c->loss_weight;
  probe_status st = PROBE_OK;
  S->loss = 0.0;
  for (int64_t mb = 0; mb < R->M && st == PROBE_OK; mb++) {
    pt_work *W = &R->work[mb];
    st = load_batch(R, T->data, S->step, mb);
    if (st == PROBE_OK) st = forward(R, W, mb == 0);
    if (st == PROBE_OK) st = backward(R, W, dloss, mb == R->M - 1);
    S->loss += (double)W->loss_h / (double)R->M;
  }
  if (st == PROBE_OK && R->dev)
    st = to_host(R, R->grad_h, R->grad, R->n_params * sizeof(float));
  return st;
}

/* Stage 2b (data-parallel runs): the scaled gradients through the
 * all-reduce, as DDP's bucket: pre-divided by N (dist.prediv), rounded to
 * the all-reduce dtype and recorded (GRAD_PRE_ALLREDUCE), summed over the
 * ranks in that dtype and recorded (GRAD_POST_ALLREDUCE); the mean (the sum
 * divided by N unless pre-divided) goes to ugrad for the unscale. The loss
 * becomes the global mean. Without a communicator ugrad gets grad_h. */
static probe_status step_allreduce(pt_train *T, pt_step *S) {
  pt_run *R = &T->R;
  const size_t n = R->n_params;
  if (!R->comm) {
    memcpy(R->ugrad, R->grad_h, n * sizeof(float));
    return PROBE_OK;
  }
  const pt_dist_spec *d = &T->c->dist;
  const float N = (float)R->world;
  for (size_t i = 0; i < n; i++)
    R->ar_pre[i] = d->prediv ? R->grad_h[i] / N : R->grad_h[i];
  if (d->dtype == PT_REDUCE_F16) pt_round_f16_array(R->ar_pre, n);
  probe_status st = PROBE_OK;
  for (int i = 0; i < R->n_mods && st == PROBE_OK; i++)
    if (R->mods[i].p_n)
      st = rec(R, R->mods[i].lid, PROBE_SITE_GRAD_PRE_ALLREDUCE,
               R->ar_pre + R->mods[i].p_off, R->mods[i].p_n);
  if (st != PROBE_OK) return st;
#ifdef AMPPROBE_HAVE_NCCL
  if (R->ar_dev) {
    st = to_backend(R, R->ar_dev, R->ar_pre, n * sizeof(float));
    if (st == PROBE_OK) st = pt_comm_nccl_allreduce_dev(R->comm, R->ar_dev, n);
    if (st == PROBE_OK) st = to_host(R, R->ar_post, R->ar_dev, n * sizeof(float));
  } else
#endif
  {
    memcpy(R->ar_post, R->ar_pre, n * sizeof(float));
    st = pt_comm_allreduce_grads(R->comm, R->ar_post, n, d->dtype);
  }
  if (st != PROBE_OK) return st;
  for (int i = 0; i < R->n_mods && st == PROBE_OK; i++)
    if (R->mods[i].p_n)
      st = rec(R, R->mods[i].lid, PROBE_SITE_GRAD_POST_ALLREDUCE,
               R->ar_post + R->mods[i].p_off, R->mods[i].p_n);
  if (st != PROBE_OK) return st;
  for (size_t i = 0; i < n; i++)
    R->ugrad[i] = d->prediv ? R->ar_post[i] : R->ar_post[i] / N;
  double loss = S->loss;
  st = probe_comm_allreduce_f64(R->comm, &loss, 1, 0);
  S->loss = loss / (double)R->world;
  return st;
}

/* Clips g (the global norm already in *norm) to max_norm; *coef gets the
 * factor applied (1 when none). */
static void clip_grads(float *const *gp, const size_t *gn, double max_norm,
                       double norm, double *coef) {
  *coef = 1.0;
  double k;
  if (isfinite(norm) && (k = max_norm / (norm + 1e-6)) < 1.0) {
    probe_grads_scale(gp, gn, 1, (float)k, NULL);
    *coef = k;
  }
}

/* Stage 3: unscale (g * (float)(1/scale), inverse in double, as GradScaler),
 * check for inf/NaN, clip by the global norm - after unscaling, or before
 * with the config's clip.before_unscale (the classic misordering). Works in
 * place on ugrad (the step's gradients, stage 2b); grad_h is left as
 * recorded. In a data-parallel run found_inf is all-reduced (MAX). */
static probe_status step_unscale_clip(pt_train *T, pt_step *S) {
  pt_run *R = &T->R;
  float *gp[1] = {R->ugrad};
  size_t gn[1] = {R->n_params};
  const float inv = (float)(1.0 / (double)S->scale);
  const double max_norm = T->c->clip_max_norm;
  S->found_inf = 0;
  S->norm = 0.0;
  S->coef = 1.0;
  if (max_norm > 0 && T->c->clip_before_unscale) {
    probe_grads_l2norm(&S->norm, gp, gn, 1); /* of the SCALED gradients */
    clip_grads(gp, gn, max_norm, S->norm, &S->coef);
    probe_grads_scale(gp, gn, 1, inv, &S->found_inf);
  } else {
    probe_grads_scale(gp, gn, 1, inv, &S->found_inf);
    probe_grads_l2norm(&S->norm, gp, gn, 1);
    if (max_norm > 0) clip_grads(gp, gn, max_norm, S->norm, &S->coef);
  }
  probe_status st = PROBE_OK;
  if (R->comm) {
    double fi = S->found_inf ? 1.0 : 0.0;
    st = probe_comm_allreduce_f64(R->comm, &fi, 1, 1);
    S->found_inf = fi > 0;
  }
  S->skip = T->scaler.spec.enabled && S->found_inf;
  return st;
}

/* Stage 4: the optimizer step (skipped on overflow), then the new masters
 * recorded. */
static probe_status step_optimizer(pt_train *T, pt_step *S) {
  pt_run *R = &T->R;
  if (!S->skip) pt_optim_step(&T->opt, R->master, R->ugrad, S->lr);
  probe_status st = PROBE_OK;
  for (int i = 0; i < R->n_mods && st == PROBE_OK; i++)
    if (R->mods[i].p_n)
      st = rec(R, R->mods[i].lid, PROBE_SITE_MASTER_WEIGHT,
               R->master + R->mods[i].p_off, R->mods[i].p_n);
  return st;
}

/* Stage 5: the loss scaler's update; a transition goes to the trace. */
static probe_status step_scaler_update(pt_train *T, pt_step *S) {
  probe_scaler_event ev;
  memset(&ev, 0, sizeof ev);
  if (!pt_scaler_update(&T->scaler, S->found_inf, S->step, &ev))
    return PROBE_OK;
  if (ev.kind == PROBE_SCALER_BACKOFF || ev.kind == PROBE_SCALER_MIN_CLAMP)
    T->out->backoffs++;
  if (ev.kind == PROBE_SCALER_GROWTH) T->out->growths++;
  return T->R.sess ? probe_scaler_transition(T->R.sess, &ev) : PROBE_OK;
}

/* Stage 6: the step's scalars into the trace, and the step closed. */
static probe_status step_record(pt_train *T, const pt_step *S) {
  if (!T->R.sess) return PROBE_OK;
  const double max_norm = T->c->clip_max_norm;
  probe_step_scalars sc;
  memset(&sc, 0, sizeof sc);
  sc.step = S->step;
  sc.loss = S->loss;
  sc.loss_scale = S->scale;
  sc.growth_tracker = T->scaler.growth_tracker;
  sc.found_inf = S->found_inf;
  sc.skipped = S->skip;
  sc.lr = S->lr;
  sc.grad_norm = S->norm;
  sc.clip_threshold = max_norm > 0 ? max_norm : 0.0;
  sc.clip_coef = S->coef;
  sc.wall_time = now_seconds() - T->t0;
  /* the FP32 masters after the step, in parameter order: equal on every
   * rank of a data-parallel job (probe_train_opts.weight_digest) */
  if (T->digest)
    sc.weight_digest = probe_digest64(T->R.master,
                                      T->R.n_params * sizeof(float),
                                      PROBE_DIGEST64_INIT);
  else
    sc.unmeasured |= PROBE_SCALAR_WEIGHT_DIGEST;
  probe_status st = probe_step_set_scalars(T->R.sess, &sc);
  if (st == PROBE_OK) st = probe_step_end(T->R.sess);
  return st;
}

/* Stage 7: the result's running figures. */
static void step_bookkeeping(pt_train *T, const pt_step *S) {
  probe_train_result *out = T->out;
  const double max_norm = T->c->clip_max_norm;
  T->losses[S->step % T->window] = S->loss;
  if (S->step == 0) out->first_loss = S->loss;
  if (S->scale < out->min_scale) out->min_scale = S->scale;
  if (S->scale > out->max_scale) out->max_scale = S->scale;
  if (S->skip) {
    out->skipped_steps++;
    if (++T->skip_run > out->longest_skip_run)
      out->longest_skip_run = T->skip_run;
  } else {
    T->skip_run = 0;
  }
  if (max_norm > 0 && isfinite(S->norm)) {
    out->clip_norms_seen++;
    if (S->norm / max_norm > out->max_clip_ratio)
      out->max_clip_ratio = S->norm / max_norm;
  }
  if (!isfinite(S->loss) && out->first_nonfinite_loss_step < 0)
    out->first_nonfinite_loss_step = S->step;
}

/* One whole step, stage by stage. */
static probe_status run_step(pt_train *T, int64_t step) {
  pt_run *R = &T->R;
  char *err = T->err;
  size_t errlen = T->errlen;
  pt_step S;
  memset(&S, 0, sizeof S);
  S.step = step;
  S.scale = T->scaler.scale;
  S.lr = pt_sched_lr(&T->c->sched, T->c->opt.lr, step, T->c->steps);
  R->step = step;
  if (T->o->fault_kill && T->o->fault_kill_step == step)
    raise(SIGKILL); /* test aid (AMPPROBE_FAULT_KILL_*): a rank dies here */
  probe_status st;
  if (R->sess && (st = probe_step_begin(R->sess, step)) != PROBE_OK)
    return pt_fail(err, errlen, st, "step %lld: trace: %s", (long long)step,
                   probe_session_last_error(R->sess));
  st = step_cast_weights(R);
  if (st == PROBE_OK) st = step_forward_backward(T, &S);
  if (st == PROBE_OK) st = step_allreduce(T, &S);
  if (st == PROBE_OK) st = step_unscale_clip(T, &S);
  if (st != PROBE_OK)
    return pt_fail(err, errlen, st, "step %lld: %s%s%s", (long long)step,
                   probe_status_str(st), R->sess ? ": " : "",
                   R->sess ? probe_session_last_error(R->sess) : "");
  st = step_optimizer(T, &S);
  if (st == PROBE_OK) st = step_scaler_update(T, &S);
  if (st == PROBE_OK) st = step_record(T, &S);
  if (st != PROBE_OK)
    return pt_fail(err, errlen, st, "step %lld: trace: %s", (long long)step,
                   R->sess ? probe_session_last_error(R->sess)
                           : probe_status_str(st));
  step_bookkeeping(T, &S);
  T->info.step = step + 1;
  T->info.loss = S.loss;
  T->info.scale = S.scale;
  return PROBE_OK;
}

/* 1 when the run should end after this step: the progress or report hook
 * asked, or stop_on_nonfinite's steps after the first non-finite loss. */
static int should_stop(pt_train *T, int64_t step) {
  const probe_train_opts *o = T->o;
  const probe_train_result *out = T->out;
  double now = now_seconds();
  T->info.step_s = now - T->t_step;
  T->t_step = now;
  if (o->progress && o->progress(step, T->info.loss, T->info.scale, o->user))
    return 1;
  if (report(T, PROBE_TRAIN_PHASE_STEP)) return 1;
  return o->stop_on_nonfinite >= 0 && out->first_nonfinite_loss_step >= 0 &&
         step >= out->first_nonfinite_loss_step + o->stop_on_nonfinite;
}

/* Stage 8: final figures, the first non-finite tensor, the trace closed. */
static probe_status run_finish(pt_train *T, int64_t steps_run,
                               probe_status st) {
  pt_run *R = &T->R;
  probe_train_result *out = T->out;
  out->loop_seconds = now_seconds() - T->t_loop;
  out->steps_run = steps_run;
  if (out->steps_run > 0) {
    int64_t w = T->window < out->steps_run ? T->window : out->steps_run;
    double s = 0.0;
    for (int64_t k = out->steps_run - w; k < out->steps_run; k++)
      s += T->losses[k % T->window];
    out->final_loss = s / (double)w;
    out->last_loss = T->losses[(out->steps_run - 1) % T->window];
  } else {
    out->min_scale = out->max_scale = T->scaler.scale;
  }
  out->final_scale = T->scaler.scale;
  nf_from_session(R);
  if (R->nf_step >= 0) {
    out->first_nonfinite_step = R->nf_step;
    snprintf(out->first_nonfinite_layer, PROBE_NAME_MAX, "%s",
             R->layers[R->nf_layer].name);
    out->first_nonfinite_site = R->nf_site;
  }
  out->diverged =
      out->first_nonfinite_loss_step >= 0 || !isfinite(out->final_loss);
  if (out->steps_run == 0) out->diverged = 0;
  if (R->sess && out->stopped_by_flag) {
    /* stopped before its last step: the trace is closed, the job was not
     * finished (the post-mortem says so; the close leaves complete 0) */
    char why[64];
    int sig = T->o->stop_signal ? (int)*T->o->stop_signal : 0;
    int mine = T->o->stop_flag && *T->o->stop_flag;
    if (sig == SIGINT) snprintf(why, sizeof why, "signal SIGINT");
    else if (sig == SIGTERM) snprintf(why, sizeof why, "signal SIGTERM");
    else if (sig == SIGHUP) snprintf(why, sizeof why, "signal SIGHUP");
    else if (sig > 0) snprintf(why, sizeof why, "signal %d", sig);
    else snprintf(why, sizeof why, mine ? "the stop flag"
                                        : "another rank's stop");
    probe_session_mark_aborted(R->sess, why);
  }
  if (R->sess) {
    probe_status cst = probe_session_close(R->sess);
    R->sess = NULL;
    if (st == PROBE_OK && cst != PROBE_OK) {
      st = cst;
      pt_fail(T->err, T->errlen, st, "%s: closing the trace failed",
              T->o->trace_path);
    }
  }
  report(T, PROBE_TRAIN_PHASE_DONE);
  return st;
}

/* The stop flag (SIGINT), agreed by every rank of a data-parallel job so
 * that they all end at the same step (a rank alone would leave the others
 * waiting in the all-reduce). */
static int stop_requested(pt_train *T) {
  double v = T->o->stop_flag && *T->o->stop_flag ? 1.0 : 0.0;
  if (T->R.comm && probe_comm_allreduce_f64(T->R.comm, &v, 1, 1) != PROBE_OK)
    v = 1.0;
  return v > 0;
}

static void run_free_all(pt_train *T) {
  if (T->R.sess) probe_session_close(T->R.sess);
  free(T->losses);
  pt_optim_free(&T->opt);
  pt_data_close(T->data);
  run_free(&T->R);
}

probe_status probe_train(const probe_train_config *c,
                         const probe_train_opts *opts, probe_train_result *out,
                         char *err, size_t errlen) {
  if (!c || !out)
    return pt_fail(err, errlen, PROBE_ERR_INVALID_ARG, "train: no config");
  probe_train_opts defaults;
  if (!opts) {
    probe_train_opts_init(&defaults);
    opts = &defaults;
  }
  result_init(out);
  probe_status st = pt_config_validate(c, err, errlen);
  if (st != PROBE_OK) return st;
  openblas_set_num_threads(1); /* bit-identical GEMMs run to run */

  pt_train *T = calloc(1, sizeof *T);
  if (!T) return pt_fail(err, errlen, PROBE_ERR_NOMEM, "trainer: out of memory");
  T->c = c;
  T->o = opts;
  T->digest = opts->weight_digest < 0 ? opts->comm != NULL : opts->weight_digest;
  T->out = out;
  T->err = err;
  T->errlen = errlen;
  T->t0 = now_seconds();
  st = run_setup(T);
  if (st != PROBE_OK) {
    if (st == PROBE_ERR_INTERRUPTED) st = PROBE_OK; /* stopped by the hook */
    if (T->reported) report(T, PROBE_TRAIN_PHASE_DONE);
    out->wall_seconds = now_seconds() - T->t0;
    run_free_all(T);
    free(T);
    return st;
  }
  T->t_loop = T->t_step = now_seconds();
  int64_t step = 0;
  for (; step < c->steps; step++) {
    if (stop_requested(T)) {
      out->interrupted = 1;
      out->stopped_by_flag = 1;
      break;
    }
    if ((st = run_step(T, step)) != PROBE_OK) break;
    if (should_stop(T, step)) {
      out->interrupted = 1;
      step++;
      break;
    }
  }
  st = run_finish(T, step < c->steps ? step : c->steps, st);
  out->wall_seconds = now_seconds() - T->t0;
  run_free_all(T);
  free(T);
  return st;
}

/* ---- test hook: one forward and backward ---------------------------------- */

probe_status pt_debug_grad(const probe_train_config *c, pt_debug_out *o,
                           char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  probe_status st = pt_config_validate(c, err, errlen);
  if (st != PROBE_OK) return st;
  openblas_set_num_threads(1);
  pt_run R;
  memset(&R, 0, sizeof R);
  R.c = c;
  R.nf_step = -1;
  R.B = c->data.batch;
  R.M = 1;
  st = probe_layers_backend_init(&R.be, PROBE_BACKEND_CPU, NULL);
  if (st != PROBE_OK) return st;
  R.ops = R.be.ops;
  pt_data *data = NULL;
  st = pt_data_open(&data, &c->data, c->loss, c->seed, err, errlen);
  if (st != PROBE_OK) {
    run_free(&R);
    return st;
  }
  R.in_dim = pt_data_in_dim(data);
  R.out_dim = pt_data_out_dim(data);
  st = build(&R, err, errlen);
  pt_work *W = R.work;
  if (st == PROBE_OK)
    for (int i = 0; i < R.n_mods && st == PROBE_OK; i++)
      if (R.mods[i].p_n)
        st = R.ops->round(R.be.ctx, R.wcast + R.mods[i].p_off,
                          R.master + R.mods[i].p_off, R.mods[i].p_n,
                          R.mods[i].prec);
  if (st == PROBE_OK)
    st = pt_data_batch(data, 0, 0, W->act[0], W->target, W->labels);
  if (st == PROBE_OK) st = forward(&R, W, 1);
  if (st == PROBE_OK) st = backward(&R, W, (float)c->loss_weight, 1);
  if (st == PROBE_OK) {
    size_t np = R.n_params, nx = (size_t)(R.B * R.in_dim),
           ny = (size_t)(R.B * R.out_dim);
    o->params = malloc((np ? np : 1) * sizeof(float));
    o->grads = malloc((np ? np : 1) * sizeof(float));
    o->x = malloc(nx * sizeof(float));
    o->y = malloc(ny * sizeof(float));
    o->labels = malloc((size_t)R.B * sizeof(int));
    if (!o->params || !o->grads || !o->x || !o->y || !o->labels) {
      pt_debug_free(o);
      st = PROBE_ERR_NOMEM;
    } else {
      memcpy(o->params, R.master, np * sizeof(float));
      memcpy(o->grads, R.grad, np * sizeof(float));
      memcpy(o->x, W->act[0], nx * sizeof(float));
      memcpy(o->y, W->target, ny * sizeof(float));
      memcpy(o->labels, W->labels, (size_t)R.B * sizeof(int));
      o->n_params = np;
      o->batch = R.B;
      o->in_dim = R.in_dim;
      o->out_dim = R.out_dim;
      o->loss = W->loss_h;
    }
  }
  pt_data_close(data);
  run_free(&R);
  return st;
}

void pt_debug_free(pt_debug_out *o) {
  free(o->params);
  free(o->grads);
  free(o->x);
  free(o->y);
  free(o->labels);
  memset(o, 0, sizeof *o);
}
