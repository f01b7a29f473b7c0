/*
 * trainer/trainer-impl.h - private declarations shared by the trainer's
 * sources: the parsed config, the PRNG, data sources, the loss scaler, the
 * optimizers and the learning-rate schedule.
 *
 * Conventions: sizes are int64_t or size_t; tensors are flat float arrays,
 * shapes in comments as (B, F); every function returning probe_status writes
 * a one-line message into (err, errlen) on failure.
 */
#ifndef AMPPROBE_TRAINER_IMPL_H
#define AMPPROBE_TRAINER_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ampprobe/trainer.h"

#define PT_MAX_MODULES 32
#define PT_MAX_FP32 32
#define PT_PATH_MAX 512
#define PT_CONFIG_MAX_BYTES (16 << 20) /* a config file larger is refused */

/* ---- the config ----------------------------------------------------------- */

typedef enum pt_module_type {
  PT_MOD_LINEAR = 0,
  PT_MOD_BN,
  PT_MOD_LAYERNORM,
  PT_MOD_REVIN,
  PT_MOD_RELU,
  PT_MOD_GELU,
  PT_MOD_SOFTMAX,
  PT_MOD_ATTENTION,
  PT_MOD_COUNT
} pt_module_type;

const char *pt_module_type_name(pt_module_type t);
probe_kind pt_module_kind(pt_module_type t);

typedef struct pt_module_spec {
  pt_module_type type;
  char name[PROBE_NAME_MAX];
  int64_t out;     /* linear: output features */
  int bias;        /* linear: with bias (1) */
  double eps;      /* bn, layernorm, revin */
  double momentum; /* bn: running-statistics momentum (0.1) */
  int affine;      /* revin: learnable affine (1) */
  int denorm;      /* revin: denormalise the model output (1 for mse) */
  int64_t seq;     /* attention: sequence length T; input is (B, T*C) */
  double init_gain; /* linear: init range multiplier (1: PyTorch default) */
} pt_module_spec;

typedef enum pt_data_kind {
  PT_DATA_TIMESERIES = 0,
  PT_DATA_CLUSTERS,
  PT_DATA_REGRESSION,
  PT_DATA_CSV,
  PT_DATA_HDF5,
} pt_data_kind;

typedef struct pt_data_spec {
  pt_data_kind kind;
  int64_t batch;    /* samples per micro-batch */
  int64_t nan_step; /* step whose input batch holds NaN; -1 none */
  int64_t nan_rank; /* the rank whose shard holds it (its first micro-batch) */
  /* timeseries */
  int64_t window, horizon; /* T past values -> H next values */
  int classify;     /* timeseries task: 0 forecast, 1 classify */
  double level, level_spread, shift_prob, shift_scale, noise, amplitude;
  /* clusters / regression / classify */
  int64_t features, classes, outputs;
  double separation, spread, feature_scale, target_scale;
  /* csv / hdf5 */
  char path[PT_PATH_MAX];
  char x_dataset[128], y_dataset[128];
  int64_t targets; /* csv: trailing columns that are targets */
} pt_data_spec;

typedef enum pt_loss_type { PT_LOSS_MSE = 0, PT_LOSS_CE = 1 } pt_loss_type;
typedef enum pt_opt_type { PT_OPT_SGD = 0, PT_OPT_ADAM, PT_OPT_ADAMW } pt_opt_type;
typedef enum pt_sched_type { PT_SCHED_CONSTANT = 0, PT_SCHED_COSINE, PT_SCHED_STEP } pt_sched_type;

typedef struct pt_opt_spec {
  pt_opt_type type;
  double lr, momentum, beta1, beta2, eps, weight_decay;
} pt_opt_spec;

typedef struct pt_sched_spec {
  pt_sched_type type;
  int64_t warmup;     /* linear warmup steps (all types) */
  double min_lr;      /* cosine floor */
  int64_t step_size;  /* step: decay every step_size steps */
  double gamma;       /* step: factor */
} pt_sched_spec;

typedef struct pt_scaler_spec {
  int enabled;
  double init, growth, backoff;
  int64_t interval;
  int hysteresis;
  double min_scale; /* 0 = none */
} pt_scaler_spec;

/* The gradient all-reduce's dtype. */
typedef enum pt_reduce_dtype {
  PT_REDUCE_F32 = 0,
  PT_REDUCE_F16 = 1, /* inputs rounded to binary16, each partial sum too */
} pt_reduce_dtype;

typedef struct pt_dist_spec {
  pt_reduce_dtype dtype; /* fp32 */
  int prediv;            /* divide by N before the all-reduce (0) */
} pt_dist_spec;

struct probe_train_config {
  char name[PROBE_NAME_MAX];
  char description[512];
  uint64_t seed;
  int64_t steps;
  probe_dtype precision;
  int n_fp32;
  char fp32[PT_MAX_FP32][PROBE_NAME_MAX]; /* kinds or globs */
  int loss_fp32;      /* the loss module runs in FP32 (1, as autocast) */
  double loss_weight; /* the loss is multiplied by this (1) */
  int64_t micro_batches;
  int n_modules;
  pt_module_spec modules[PT_MAX_MODULES];
  pt_loss_type loss;
  pt_data_spec data;
  pt_opt_spec opt;
  pt_sched_spec sched;
  pt_scaler_spec scaler;
  double clip_max_norm; /* 0 = off */
  int clip_before_unscale;
  pt_dist_spec dist;
};

/* Defaults used for absent keys. */
void pt_config_defaults(probe_train_config *c);
/* Checks a parsed config's consistency (shapes, loss/last module). */
probe_status pt_config_validate(const probe_train_config *c, char *err,
                                size_t errlen);
/* Precision a named layer of the given kind runs in under c's policy. */
probe_dtype pt_policy_precision(const probe_train_config *c,
                                    const char *name, probe_kind kind);

/* Opens path for reading when it is a regular file; a FIFO, device
 * (/dev/zero), directory or socket is refused at once with a one-line
 * message ("<what> <path>: a FIFO; only regular files are read"), so that
 * nothing blocks or reads forever. NULL on error with *st set. */
FILE *pt_open_regular(const char *path, const char *what, probe_status *st,
                      char *err, size_t errlen);

/* Formats into err (if any) and returns st. */
probe_status pt_fail(char *err, size_t errlen, probe_status st,
                     const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- PRNG: splitmix64 seeding a xoshiro256** ------------------------------ */

typedef struct pt_rng {
  uint64_t s[4];
  int have_spare;
  double spare;
} pt_rng;

void pt_rng_seed(pt_rng *r, uint64_t seed);
uint64_t pt_rng_u64(pt_rng *r);
double pt_rng_uniform(pt_rng *r); /* [0, 1) with 53 bits */
double pt_rng_normal(pt_rng *r);  /* Box-Muller, N(0, 1) */
/* Hash of (seed, stream) for independent deterministic streams. */
uint64_t pt_seed_mix(uint64_t seed, uint64_t stream);

/* ---- data ----------------------------------------------------------------- */

typedef struct pt_data pt_data;

/* Opens the data source: draws generator parameters from the seed, or loads
 * the CSV/HDF5 file. in_dim/out_dim: features per sample and targets per
 * sample (1 class label for classification). */
probe_status pt_data_open(pt_data **out, const pt_data_spec *spec,
                          pt_loss_type loss, uint64_t seed, char *err,
                          size_t errlen);
void pt_data_close(pt_data *d);
int64_t pt_data_in_dim(const pt_data *d);
int64_t pt_data_out_dim(const pt_data *d); /* targets; classes for CE */
/* Bytes pt_data_open will allocate for a generator's parameters, from the
 * spec alone, or for an HDF5 file's datasets, from the shapes it declares
 * (0 for a CSV file, whose size is known once loaded, or a file that cannot
 * be read: the load says why). */
double pt_data_need_bytes(const pt_data_spec *spec, pt_loss_type loss);
/* Bytes the opened source holds (generator parameters or file data). */
size_t pt_data_bytes(const pt_data *d);
/* Fills micro-batch `micro` of `step`: x (B, in_dim), y (B, out_dim) floats
 * or labels (B) for classification. Deterministic in (seed, step, micro). */
probe_status pt_data_batch(pt_data *d, int64_t step, int64_t micro, float *x,
                           float *y, int32_t *labels);
/* The global micro-batch index whose input gets data.nan_step's NaN
 * (-1: none); pt_data_batch's micro is the global index. */
void pt_data_set_nan_micro(pt_data *d, int64_t micro);
/* ---- communicator (trainer/comm.c) --------------------------------------- */

/* Elements per all-gather round of the MPI all-reduce: its buffer holds
 * world x this many floats. */
#define PT_COMM_CHUNK ((size_t)1 << 16)

typedef struct pt_comm_ops {
  const char *name;
  /* buf (n) := the sum over ranks in rank order, in dtype dt (host memory) */
  probe_status (*allreduce_sum)(probe_comm *c, float *buf, size_t n,
                                pt_reduce_dtype dt);
  probe_status (*allreduce_scalars)(probe_comm *c, double *v, size_t n,
                                    int max);
  probe_status (*bcast_root0)(probe_comm *c, void *buf, size_t n);
  void (*abort)(probe_comm *c, int code);
  void (*close)(probe_comm *c);
} pt_comm_ops;

struct probe_comm {
  const pt_comm_ops *ops;
  probe_comm_kind kind;
  int rank, size;
  float *gather; /* MPI: the all-gather buffer (size x chunk) */
  size_t gather_cap;
  void *nccl;    /* NCCL: its state (trainer/comm_nccl.c) */
};

/* The gradient all-reduce of host memory (a no-op without a communicator). */
probe_status pt_comm_allreduce_grads(probe_comm *c, float *buf, size_t n,
                                     pt_reduce_dtype dt);
/* acc[i] = binary16(acc[i] + x[i]): one FP16 partial sum, as NCCL's half
 * reduction (acc and x hold binary16 values). */
void pt_sum_f16(float *acc, const float *x, size_t n);
/* x[i] = binary16(x[i]) (round to nearest even; inf above 65504). */
void pt_round_f16_array(float *x, size_t n);
/* dst (n) = the sum of `parts` blocks of n in src, in order, in dtype dt. */
void pt_sum_parts(float *dst, const float *src, size_t n, int parts,
                  pt_reduce_dtype dt);
const char *pt_reduce_dtype_name(pt_reduce_dtype dt);
#ifdef AMPPROBE_HAVE_MPI
extern const pt_comm_ops pt_comm_mpi_ops; /* comm.c; comm_nccl.c builds on it */
#endif
#ifdef AMPPROBE_HAVE_NCCL
/* NCCL on top of an opened MPI communicator (trainer/comm_nccl.c). */
probe_status pt_comm_nccl_open(probe_comm *c, char *err, size_t errlen);
/* buf (n floats, device memory) := the FP32 sum over ranks, by NCCL. */
probe_status pt_comm_nccl_allreduce_dev(probe_comm *c, float *buf, size_t n);
#endif

/* ---- loss scaler (GradScaler rules + Megatron hysteresis / min scale) ---- */

typedef struct pt_scaler {
  pt_scaler_spec spec;
  float scale;          /* FP32, as torch keeps it */
  int32_t growth_tracker;
  int hysteresis_tracker;
} pt_scaler;

void pt_scaler_init(pt_scaler *s, const pt_scaler_spec *spec);
/* Applies one step's outcome. Returns 1 and fills *ev when a transition
 * event (backoff, growth, hysteresis, min clamp) happened, else 0. */
int pt_scaler_update(pt_scaler *s, int found_inf, int64_t step,
                     probe_scaler_event *ev);

/* ---- optimizers and schedule ---------------------------------------------- */

typedef struct pt_optim {
  pt_opt_spec spec;
  size_t n;
  float *m;  /* (n) momentum / first moment */
  float *v;  /* (n) second moment (Adam) */
  int64_t t; /* optimizer steps taken (skipped steps do not count) */
} pt_optim;

probe_status pt_optim_init(pt_optim *o, const pt_opt_spec *spec, size_t n);
void pt_optim_free(pt_optim *o);
/* w (n) -= update(g (n)); FP32 state, as torch.optim on FP32 params. */
void pt_optim_step(pt_optim *o, float *w, const float *g, double lr);
double pt_sched_lr(const pt_sched_spec *s, double base_lr, int64_t step,
                   int64_t total);

/* ---- test hook ------------------------------------------------------------ */

/* What one forward and backward of a config's model on its step-0 batch
 * gives (CPU backend, the config's policy, no optimizer step, the backward
 * seeded with loss_weight, i.e. loss scale 1): the initial master weights and
 * their gradients in the trainer's layout (per module in order: linear W
 * (out, in) then b; bn/layernorm gamma then beta; revin gamma, beta;
 * attention Wqkv (3C, C), bqkv, Wo (C, C), bo), the batch and the loss.
 * Used by the PyTorch comparison test. */
typedef struct pt_debug_out {
  float *params, *grads; /* (n_params) */
  float *x;              /* (batch, in_dim) */
  float *y;              /* (batch, out_dim) regression targets */
  int *labels;           /* (batch) class labels */
  size_t n_params;
  int64_t batch, in_dim, out_dim;
  float loss;
} pt_debug_out;

probe_status pt_debug_grad(const probe_train_config *c, pt_debug_out *o,
                           char *err, size_t errlen);
void pt_debug_free(pt_debug_out *o);

#endif /* AMPPROBE_TRAINER_IMPL_H */
