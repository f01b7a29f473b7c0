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
 * Every tensor goes through libprobe in execution order; buffers recorded in
 * a step stay untouched until probe_step_end (one workspace per micro-batch,
 * scaled gradients kept apart from the unscaled ones).
 *
 * Backends: the CPU layer kernels, or (builds with CUDA, opts->backend
 * PROBE_BACKEND_CUDA) the CUDA ones with the same arguments on device
 * buffers; the K() macro picks one. On CUDA the forward and backward run on
 * the device and the AMP step (unscale, check, clip, optimizer, scaler) runs
 * on the host on a copy of the gradients, so both backends share it.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ampprobe/layers.h"
#include "trainer-impl.h"

#ifdef AMPPROBE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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
  PUSH("input", PROBE_KIND_INPUT, PROBE_PREC_FP32);
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
  probe_precision prec;
  int32_t lid;        /* index in the layer list */
  int64_t in_w, out_w; /* row widths of input and output */
  size_t p_off, p_n;   /* parameter block in the master array */
  float *run_mean, *run_var; /* bn (C) */
  /* attention scratch (backward), not recorded */
  float *dqkv, *datty, *dprobs, *dscores;
} pt_mod;

/* One micro-batch's tensors. act[i] is the input of module i, act[L] the
 * model output; dact mirrors it. */
typedef struct pt_work {
  float *act[PT_MAX_MODULES + 1];
  float *dact[PT_MAX_MODULES + 1];
  float *s1[PT_MAX_MODULES], *s2[PT_MAX_MODULES]; /* saved: mean/var/... */
  float *s3[PT_MAX_MODULES], *s4[PT_MAX_MODULES]; /* attention probs, atty */
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
  float *master;   /* (n_params) host FP32 masters */
  float *master_b; /* backend copy of the masters (== master on the CPU) */
  float *wcast;    /* backend: masters rounded to each module's precision */
  float *grad;     /* backend: scaled gradients, accumulated */
  float *grad_h;   /* host copy of grad (== grad on the CPU) */
  float *ugrad;    /* host: unscaled, clipped gradients */
  float *x_h, *y_h; /* host staging of a batch */
  int *lab_h;
  int64_t M;
  pt_work *work;
  probe_cuda_layers *cuda; /* NULL: CPU backend */
  float *scan;      /* host scratch for the non-finite scan on CUDA */
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

#ifdef AMPPROBE_HAVE_CUDA
static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return NULL;
  if (cudaMemset(p, 0, bytes) != cudaSuccess) {
    cudaFree(p);
    return NULL;
  }
  return p;
}
static void dev_free(void *p) { cudaFree(p); }
/* Synchronous copy in either direction (UVA infers it). */
static probe_status dev_copy(pt_run *R, void *dst, const void *src,
                             size_t bytes) {
  if (probe_cuda_layers_sync(R->cuda) != PROBE_OK) return PROBE_ERR_CUDA;
  return cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) == cudaSuccess
             ? PROBE_OK
             : PROBE_ERR_CUDA;
}
#else
static void *dev_alloc(size_t bytes) {
  (void)bytes;
  return NULL;
}
static void dev_free(void *p) { (void)p; }
static probe_status dev_copy(pt_run *R, void *dst, const void *src,
                             size_t bytes) {
  (void)R;
  (void)dst;
  (void)src;
  (void)bytes;
  return PROBE_ERR_UNSUPPORTED;
}
#endif

/* n floats (or ints) of zeroed memory; on the backend (device) when dev and
 * the run is on CUDA, else on the host. Freed by run_free. */
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
  dev = dev && R->cuda;
  size_t bytes = (nfloats ? nfloats : 1) * sizeof(float);
  void *p = dev ? dev_alloc(bytes) : calloc(1, bytes);
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
  if (!R->cuda) {
    if (dst != src) memcpy(dst, src, bytes);
    return PROBE_OK;
  }
  return dev_copy(R, dst, src, bytes);
}
#define to_host to_backend

static void run_free(pt_run *R) {
  for (size_t i = 0; i < R->n_allocs; i++) {
    if (R->alloc_dev[i])
      dev_free(R->allocs[i]);
    else
      free(R->allocs[i]);
  }
  free(R->allocs);
  free(R->alloc_dev);
  free(R->work);
  free(R->scan);
  if (R->cuda) probe_cuda_layers_destroy(R->cuda);
}

/* A layer kernel on the run's backend: probe_X(...) or probe_cuda_X(ctx, ...). */
#define K(name, ...)                                                           \
  (R->cuda ? probe_cuda_##name(R->cuda, __VA_ARGS__) : probe_##name(__VA_ARGS__))

/* ---- recording -------------------------------------------------------------- */

static probe_status rec(pt_run *R, int32_t lid, probe_site site,
                        const float *data, size_t n) {
  if (R->nf_step < 0 && !R->nf_from_probe) {
    const float *h = data;
    if (R->cuda) {
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
   * the legacy default stream (probe_cuda_layers_create(.., NULL)) and
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

static probe_status probe_layers_round_any(pt_run *R, float *out,
                                           const float *in, size_t n,
                                           probe_precision prec) {
  return R->cuda ? probe_cuda_layers_round(R->cuda, out, in, n, prec)
                 : probe_layers_round(out, in, n, prec);
}

/* ---- assembly -------------------------------------------------------------- */

static probe_status build(pt_run *R, char *err, size_t errlen) {
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
  R->master = halloc(R, off);
  R->master_b = R->cuda ? ralloc(R, off) : R->master;
  R->wcast = ralloc(R, off);
  R->grad = ralloc(R, off);
  R->grad_h = R->cuda ? halloc(R, off) : R->grad;
  R->ugrad = halloc(R, off);
  R->x_h = halloc(R, (size_t)(R->B * R->in_dim));
  R->y_h = halloc(R, (size_t)(R->B * R->out_dim));
  R->lab_h = halloc(R, (size_t)R->B);
  if (!R->master || !R->master_b || !R->wcast || !R->grad || !R->grad_h ||
      !R->ugrad || !R->x_h || !R->y_h || !R->lab_h)
    return pt_fail(err, errlen, PROBE_ERR_NOMEM, "trainer: out of memory");

  /* Initialisation as PyTorch's defaults, from the seed. */
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

  /* Workspaces, one per micro-batch. */
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
        ok &= (W->s1[i] = ralloc(R, B)) != NULL;
        ok &= (W->s2[i] = ralloc(R, B)) != NULL;
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

/* ---- forward / backward of one micro-batch -------------------------------- */

static probe_status forward(pt_run *R, pt_work *W, int first_micro) {
  const int B = (int)R->B;
  TRY(rec(R, R->lid_input, PROBE_SITE_FWD_OUT, W->act[0],
          (size_t)(R->B * R->in_dim)));
  for (int i = 0; i < R->n_mods; i++) {
    pt_mod *m = &R->mods[i];
    const pt_module_spec *s = m->spec;
    float *in = W->act[i], *out = W->act[i + 1];
    const float *p = R->wcast + m->p_off;
    const int C = (int)m->in_w;
    const size_t n_in = (size_t)B * (size_t)C;
    TRY(rec(R, m->lid, PROBE_SITE_FWD_IN, in, n_in));
    if (m->p_n && first_micro) TRY(rec(R, m->lid, PROBE_SITE_WEIGHT, p, m->p_n));
    switch (s->type) {
    case PT_MOD_LINEAR:
      TRY(K(linear_forward, out, in, p, s->bias ? p + s->out * C : NULL, B,
                               C, (int)s->out, m->prec));
      break;
    case PT_MOD_BN:
      TRY(K(bn_forward, out, W->s1[i], W->s2[i], m->run_mean, m->run_var,
                           in, p, p + C, (float)s->momentum, (float)s->eps, B,
                           C, m->prec));
      TRY(rec(R, m->lid, PROBE_SITE_FWD_SAVED, W->s2[i], (size_t)C)); /* var */
      break;
    case PT_MOD_LAYERNORM:
      TRY(K(layernorm_forward, out, W->s1[i], W->s2[i], in, p, p + C,
                                  (float)s->eps, B, C, m->prec));
      TRY(rec(R, m->lid, PROBE_SITE_FWD_SAVED, W->s2[i], (size_t)B)); /* rstd */
      break;
    case PT_MOD_REVIN:
      TRY(K(revin_norm_forward, out, W->s1[i], W->s2[i], in,
                                   s->affine ? p : NULL,
                                   s->affine ? p + 1 : NULL, (float)s->eps, B,
                                   C, 1, m->prec));
      TRY(rec(R, m->lid, PROBE_SITE_FWD_SAVED, W->s2[i], (size_t)B)); /* stdev */
      break;
    case PT_MOD_RELU:
      TRY(K(relu_forward, out, in, n_in, m->prec));
      break;
    case PT_MOD_GELU:
      TRY(K(gelu_forward, out, in, n_in, m->prec));
      break;
    case PT_MOD_SOFTMAX:
      TRY(K(softmax_forward, out, in, B, C, m->prec));
      break;
    case PT_MOD_ATTENTION: {
      int T = (int)s->seq, Ca = C / T;
      const float *wqkv = p, *bqkv = p + 3 * Ca * Ca, *wo = bqkv + 3 * Ca,
                  *bo = wo + Ca * Ca;
      TRY(K(attention_forward, out, W->s1[i], W->s2[i], W->s3[i], W->s4[i],
                                  in, wqkv, bqkv, wo, bo, 0, B, T, Ca,
                                  m->prec));
      TRY(rec(R, m->lid, PROBE_SITE_FWD_SAVED, W->s2[i],
              (size_t)B * (size_t)T * (size_t)T)); /* scores */
      break;
    }
    default: return PROBE_ERR_STATE;
    }
    TRY(rec(R, m->lid, PROBE_SITE_FWD_OUT, out, (size_t)B * (size_t)m->out_w));
  }
  const int L = R->n_mods;
  const size_t n_out = (size_t)(R->B * R->out_dim);
  if (R->lid_denorm >= 0) {
    pt_mod *m = &R->mods[R->revin];
    const float *p = R->wcast + m->p_off;
    int aff = m->spec->affine;
    TRY(rec(R, R->lid_denorm, PROBE_SITE_FWD_IN, W->act[L], n_out));
    TRY(K(revin_denorm_forward, W->pred, W->act[L], W->s1[R->revin],
                                   W->s2[R->revin], aff ? p : NULL,
                                   aff ? p + 1 : NULL, (float)m->spec->eps, B,
                                   (int)R->out_dim, 1, m->prec));
    TRY(rec(R, R->lid_denorm, PROBE_SITE_FWD_OUT, W->pred, n_out));
  }
  probe_precision lp = R->layers[R->lid_loss].precision;
  TRY(rec(R, R->lid_loss, PROBE_SITE_FWD_IN, W->pred, n_out));
  if (R->c->loss == PT_LOSS_MSE)
    TRY(K(mse_forward, W->loss, W->pred, W->target, n_out, lp));
  else
    TRY(K(crossentropy_forward, W->loss, NULL, W->pred, W->labels, B,
                                   (int)R->out_dim, lp));
  TRY(to_host(R, &W->loss_h, W->loss, sizeof(float)));
  if (R->c->loss_weight != 1.0) {
    W->loss_h *= (float)R->c->loss_weight;
    TRY(to_backend(R, W->loss, &W->loss_h, sizeof(float)));
  }
  TRY(rec(R, R->lid_loss, PROBE_SITE_FWD_OUT, W->loss, 1));
  return PROBE_OK;
}

static probe_status backward(pt_run *R, pt_work *W, float dloss,
                             int last_micro) {
  const int B = (int)R->B, L = R->n_mods;
  const size_t n_out = (size_t)(R->B * R->out_dim);
  probe_precision lp = R->layers[R->lid_loss].precision;
  W->dloss = dloss; /* host value: libprobe takes host or device memory */
  TRY(rec(R, R->lid_loss, PROBE_SITE_GRAD_OUT, &W->dloss, 1));
  if (R->c->loss == PT_LOSS_MSE)
    TRY(K(mse_backward, W->dpred, W->pred, W->target, dloss, n_out, lp));
  else
    TRY(K(crossentropy_backward, W->dpred, W->pred, W->labels, dloss, B,
                                    (int)R->out_dim, lp));
  TRY(rec(R, R->lid_loss, PROBE_SITE_GRAD_IN, W->dpred, n_out));
  if (R->lid_denorm >= 0) {
    pt_mod *m = &R->mods[R->revin];
    const float *p = R->wcast + m->p_off;
    float *g = R->grad + m->p_off;
    int aff = m->spec->affine;
    TRY(rec(R, R->lid_denorm, PROBE_SITE_GRAD_OUT, W->dpred, n_out));
    TRY(K(revin_denorm_backward, W->dact[L], aff ? g : NULL,
                                    aff ? g + 1 : NULL, W->dpred, W->act[L],
                                    W->s2[R->revin], aff ? p : NULL,
                                    aff ? p + 1 : NULL, (float)m->spec->eps, B,
                                    (int)R->out_dim, 1, m->prec));
    TRY(rec(R, R->lid_denorm, PROBE_SITE_GRAD_IN, W->dact[L], n_out));
  }
  for (int i = L - 1; i >= 0; i--) {
    pt_mod *m = &R->mods[i];
    const pt_module_spec *s = m->spec;
    const float *p = R->wcast + m->p_off;
    float *g = R->grad + m->p_off;
    float *in = W->act[i], *out = W->act[i + 1];
    float *din = W->dact[i], *dout = W->dact[i + 1];
    const int C = (int)m->in_w;
    const size_t n_in = (size_t)B * (size_t)C;
    TRY(rec(R, m->lid, PROBE_SITE_GRAD_OUT, dout, (size_t)B * (size_t)m->out_w));
    switch (s->type) {
    case PT_MOD_LINEAR:
      TRY(K(linear_backward, din, g, s->bias ? g + s->out * C : NULL, dout,
                                in, p, B, C, (int)s->out, m->prec));
      break;
    case PT_MOD_BN:
      TRY(K(bn_backward, din, g, g + C, dout, in, W->s1[i], W->s2[i], p,
                            (float)s->eps, B, C, m->prec));
      break;
    case PT_MOD_LAYERNORM:
      TRY(K(layernorm_backward, din, g, g + C, dout, in, W->s1[i], W->s2[i],
                                   p, B, C, m->prec));
      break;
    case PT_MOD_REVIN:
      TRY(K(revin_norm_backward, din, s->affine ? g : NULL,
                                    s->affine ? g + 1 : NULL, dout, in,
                                    W->s1[i], W->s2[i], s->affine ? p : NULL,
                                    B, C, 1, m->prec));
      break;
    case PT_MOD_RELU:
      TRY(K(relu_backward, din, dout, in, n_in, m->prec));
      break;
    case PT_MOD_GELU:
      TRY(K(gelu_backward, din, dout, in, n_in, m->prec));
      break;
    case PT_MOD_SOFTMAX:
      TRY(K(softmax_backward, din, dout, out, B, C, m->prec));
      break;
    case PT_MOD_ATTENTION: {
      int T = (int)s->seq, Ca = C / T;
      const float *wqkv = p, *wo = p + 3 * Ca * Ca + 3 * Ca;
      float *gwqkv = g, *gbqkv = g + 3 * Ca * Ca, *gwo = gbqkv + 3 * Ca,
            *gbo = gwo + Ca * Ca;
      TRY(K(attention_backward, din, gwqkv, gbqkv, gwo, gbo, m->dqkv,
                                   m->datty, m->dprobs, m->dscores, dout, in,
                                   W->s1[i], W->s3[i], W->s4[i], wqkv, wo, B,
                                   T, Ca, m->prec));
      break;
    }
    default: return PROBE_ERR_STATE;
    }
    if (m->p_n && last_micro) TRY(rec(R, m->lid, PROBE_SITE_WEIGHT_GRAD, g, m->p_n));
    TRY(rec(R, m->lid, PROBE_SITE_GRAD_IN, din, n_in));
  }
  return PROBE_OK;
}

/* ---- the run ------------------------------------------------------------- */

void probe_train_opts_init(probe_train_opts *o) {
  memset(o, 0, sizeof *o);
  o->mode = PROBE_MODE_SCALARS;
  o->stop_on_nonfinite = -1;
  o->final_window = 10;
}

int probe_train_backend_available(probe_backend b) {
  if (b == PROBE_BACKEND_CPU) return 1;
  if (b != PROBE_BACKEND_CUDA) return 0;
  probe_cuda_layers *ctx = NULL;
  if (probe_cuda_layers_create(&ctx, NULL) != PROBE_OK) return 0;
  probe_cuda_layers_destroy(ctx);
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

  const double t0 = now_seconds();
  pt_run R;
  memset(&R, 0, sizeof R);
  R.c = c;
  R.nf_step = -1;
  R.B = c->data.batch;
  R.M = c->micro_batches;
  if (opts->backend == PROBE_BACKEND_CUDA) {
    st = probe_cuda_layers_create(&R.cuda, NULL);
    if (st != PROBE_OK)
      return pt_fail(err, errlen, st, "CUDA backend: %s%s",
                     probe_status_str(st),
                     st == PROBE_ERR_UNSUPPORTED ? " (built without CUDA)" : "");
  } else if (opts->backend != PROBE_BACKEND_CPU) {
    return pt_fail(err, errlen, PROBE_ERR_INVALID_ARG, "unknown backend %d",
                   (int)opts->backend);
  }
  pt_data *data = NULL;
  st = pt_data_open(&data, &c->data, c->loss, c->seed, err, errlen);
  if (st != PROBE_OK) {
    run_free(&R);
    return st;
  }
  R.in_dim = pt_data_in_dim(data);
  R.out_dim = pt_data_out_dim(data);
  pt_optim opt;
  memset(&opt, 0, sizeof opt);
  double *losses = NULL;
  st = build(&R, err, errlen);
  if (st == PROBE_OK) {
    st = pt_optim_init(&opt, &c->opt, R.n_params);
    if (st != PROBE_OK) pt_fail(err, errlen, st, "trainer: out of memory");
  }
  const int64_t steps = c->steps;
  /* The last `window` losses, a ring indexed by step % window. */
  const int64_t window = opts->final_window > 0 ? opts->final_window : 10;
  if (st == PROBE_OK && !(losses = malloc((size_t)window * sizeof(double))))
    st = pt_fail(err, errlen, PROBE_ERR_NOMEM, "trainer: out of memory");
  if (st == PROBE_OK && opts->trace_path) st = open_trace(&R, opts, err, errlen);

  /* Loss scaling applies to fp16 runs; fp32 and bf16 train unscaled. */
  pt_scaler_spec ss = c->scaler;
  if (c->precision != PROBE_PREC_FP16) ss.enabled = 0;
  pt_scaler scaler;
  pt_scaler_init(&scaler, &ss);
  out->scaler_enabled = ss.enabled != 0;
  out->clip_max_norm = c->clip_max_norm > 0 ? c->clip_max_norm : 0.0;

  int64_t skip_run = 0, step = 0;
  float *gp[1] = {NULL};
  size_t gn[1] = {R.n_params};
  const double t_loop = now_seconds();
  for (step = 0; st == PROBE_OK && step < steps; step++) {
    if (opts->stop_flag && *opts->stop_flag) {
      out->interrupted = 1;
      break;
    }
    R.step = step;
    if (R.sess && (st = probe_step_begin(R.sess, step)) != PROBE_OK) {
      pt_fail(err, errlen, st, "step %lld: trace: %s", (long long)step,
              probe_session_last_error(R.sess));
      break;
    }
    const float scale = scaler.scale;
    const double lr = pt_sched_lr(&c->sched, c->opt.lr, step, steps);
    /* Cast the FP32 masters to each module's precision, "as used". */
    pt_run *const Rp = &R;
    st = to_backend(Rp, R.master_b, R.master, R.n_params * sizeof(float));
    for (int i = 0; i < R.n_mods && st == PROBE_OK; i++)
      if (R.mods[i].p_n)
        st = probe_layers_round_any(Rp, R.wcast + R.mods[i].p_off,
                                    R.master_b + R.mods[i].p_off,
                                    R.mods[i].p_n, R.mods[i].prec);
    memset(R.grad_h, 0, R.n_params * sizeof(float));
    if (st == PROBE_OK && R.cuda)
      st = to_backend(Rp, R.grad, R.grad_h, R.n_params * sizeof(float));
    double loss = 0.0;
    /* d(weight * loss / M)/d(loss) times the scale, in FP32. */
    const float dloss = scale / (float)R.M * (float)c->loss_weight;
    for (int64_t mb = 0; mb < R.M && st == PROBE_OK; mb++) {
      pt_work *W = &R.work[mb];
      if (!R.cuda) {
        st = pt_data_batch(data, step, mb, W->act[0], W->target, W->labels);
      } else {
        st = pt_data_batch(data, step, mb, R.x_h, R.y_h, R.lab_h);
        if (st == PROBE_OK)
          st = to_backend(Rp, W->act[0], R.x_h,
                          (size_t)(R.B * R.in_dim) * sizeof(float));
        if (st == PROBE_OK && c->loss == PT_LOSS_MSE)
          st = to_backend(Rp, W->target, R.y_h,
                          (size_t)(R.B * R.out_dim) * sizeof(float));
        if (st == PROBE_OK && c->loss == PT_LOSS_CE)
          st = to_backend(Rp, W->labels, R.lab_h, (size_t)R.B * sizeof(int));
      }
      if (st == PROBE_OK) st = forward(&R, W, mb == 0);
      if (st == PROBE_OK) st = backward(&R, W, dloss, mb == R.M - 1);
      loss += (double)W->loss_h / (double)R.M;
    }
    if (st == PROBE_OK && R.cuda)
      st = to_host(Rp, R.grad_h, R.grad, R.n_params * sizeof(float));
    if (st != PROBE_OK) {
      pt_fail(err, errlen, st, "step %lld: %s%s%s", (long long)step,
              probe_status_str(st), R.sess ? ": " : "",
              R.sess ? probe_session_last_error(R.sess) : "");
      break;
    }

    /* Unscale, check, clip. */
    memcpy(R.ugrad, R.grad_h, R.n_params * sizeof(float));
    gp[0] = R.ugrad;
    const float inv = (float)(1.0 / (double)scale);
    int found_inf = 0;
    double norm = 0.0, coef = 1.0;
    const double max_norm = c->clip_max_norm;
    if (max_norm > 0 && c->clip_before_unscale) {
      probe_grads_l2norm(&norm, gp, gn, 1); /* of the SCALED gradients */
      if (isfinite(norm) && (coef = max_norm / (norm + 1e-6)) < 1.0)
        probe_grads_scale(gp, gn, 1, (float)coef, NULL);
      else
        coef = 1.0;
      probe_grads_scale(gp, gn, 1, inv, &found_inf);
    } else {
      probe_grads_scale(gp, gn, 1, inv, &found_inf);
      if (max_norm > 0) {
        probe_grads_l2norm(&norm, gp, gn, 1);
        if (isfinite(norm) && (coef = max_norm / (norm + 1e-6)) < 1.0)
          probe_grads_scale(gp, gn, 1, (float)coef, NULL);
        else
          coef = 1.0;
      }
    }
    if (max_norm <= 0) probe_grads_l2norm(&norm, gp, gn, 1);
    const int skip = scaler.spec.enabled && found_inf;
    if (!skip) pt_optim_step(&opt, R.master, R.ugrad, lr);
    for (int i = 0; i < R.n_mods && st == PROBE_OK; i++)
      if (R.mods[i].p_n)
        st = rec(&R, R.mods[i].lid, PROBE_SITE_MASTER_WEIGHT,
                 R.master + R.mods[i].p_off, R.mods[i].p_n);
    probe_scaler_event ev;
    memset(&ev, 0, sizeof ev);
    if (pt_scaler_update(&scaler, found_inf, step, &ev)) {
      if (ev.kind == PROBE_SCALER_BACKOFF || ev.kind == PROBE_SCALER_MIN_CLAMP)
        out->backoffs++;
      if (ev.kind == PROBE_SCALER_GROWTH) out->growths++;
      if (R.sess && st == PROBE_OK) st = probe_scaler_transition(R.sess, &ev);
    }
    if (R.sess && st == PROBE_OK) {
      probe_step_scalars sc;
      memset(&sc, 0, sizeof sc);
      sc.step = step;
      sc.loss = loss;
      sc.loss_scale = scale;
      sc.growth_tracker = scaler.growth_tracker;
      sc.found_inf = found_inf;
      sc.skipped = skip;
      sc.lr = lr;
      sc.grad_norm = norm;
      sc.clip_threshold = max_norm > 0 ? max_norm : 0.0;
      sc.clip_coef = coef;
      sc.wall_time = now_seconds() - t0;
      st = probe_step_set_scalars(R.sess, &sc);
      if (st == PROBE_OK) st = probe_step_end(R.sess);
    }
    if (st != PROBE_OK) {
      pt_fail(err, errlen, st, "step %lld: trace: %s", (long long)step,
              R.sess ? probe_session_last_error(R.sess) : probe_status_str(st));
      break;
    }

    /* Bookkeeping for the result. */
    losses[step % window] = loss;
    if (step == 0) out->first_loss = loss;
    if (scale < out->min_scale) out->min_scale = scale;
    if (scale > out->max_scale) out->max_scale = scale;
    if (skip) {
      out->skipped_steps++;
      if (++skip_run > out->longest_skip_run) out->longest_skip_run = skip_run;
    } else {
      skip_run = 0;
    }
    if (max_norm > 0 && isfinite(norm)) {
      out->clip_norms_seen++;
      if (norm / max_norm > out->max_clip_ratio)
        out->max_clip_ratio = norm / max_norm;
    }
    if (!isfinite(loss) && out->first_nonfinite_loss_step < 0)
      out->first_nonfinite_loss_step = step;
    if (opts->progress && opts->progress(step, loss, scale, opts->user)) {
      out->interrupted = 1;
      step++;
      break;
    }
    if (opts->stop_on_nonfinite >= 0 && out->first_nonfinite_loss_step >= 0 &&
        step >= out->first_nonfinite_loss_step + opts->stop_on_nonfinite) {
      out->interrupted = 1;
      step++;
      break;
    }
  }
  out->loop_seconds = now_seconds() - t_loop;
  out->steps_run = step < steps ? step : steps; /* steps completed */
  if (out->steps_run > 0) {
    int64_t w = window < out->steps_run ? window : out->steps_run;
    double s = 0.0;
    for (int64_t k = out->steps_run - w; k < out->steps_run; k++)
      s += losses[k % window];
    out->final_loss = s / (double)w;
    out->last_loss = losses[(out->steps_run - 1) % window];
  } else {
    out->min_scale = out->max_scale = scaler.scale;
  }
  out->final_scale = scaler.scale;
  nf_from_session(&R);
  if (R.nf_step >= 0) {
    out->first_nonfinite_step = R.nf_step;
    snprintf(out->first_nonfinite_layer, PROBE_NAME_MAX, "%s",
             R.layers[R.nf_layer].name);
    out->first_nonfinite_site = R.nf_site;
  }
  out->diverged = out->first_nonfinite_loss_step >= 0 || !isfinite(out->final_loss);
  if (out->steps_run == 0) out->diverged = 0;
  if (R.sess) {
    probe_status cst = probe_session_close(R.sess);
    if (st == PROBE_OK && cst != PROBE_OK) {
      st = cst;
      pt_fail(err, errlen, st, "%s: closing the trace failed",
              opts->trace_path);
    }
  }
  out->wall_seconds = now_seconds() - t0;
  free(losses);
  pt_optim_free(&opt);
  pt_data_close(data);
  run_free(&R);
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
  pt_data *data = NULL;
  st = pt_data_open(&data, &c->data, c->loss, c->seed, err, errlen);
  if (st != PROBE_OK) return st;
  R.in_dim = pt_data_in_dim(data);
  R.out_dim = pt_data_out_dim(data);
  st = build(&R, err, errlen);
  pt_work *W = R.work;
  if (st == PROBE_OK)
    for (int i = 0; i < R.n_mods && st == PROBE_OK; i++)
      if (R.mods[i].p_n)
        st = probe_layers_round(R.wcast + R.mods[i].p_off,
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
