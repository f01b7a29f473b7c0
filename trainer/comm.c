/*
 * trainer/comm.c - the trainer's communicator for data-parallel runs: one
 * small table of operations (pt_comm_ops), chosen once when the communicator
 * is opened:
 *   single  one process (world 1): every reduction is the identity;
 *   mpi     Open MPI (builds with AMPPROBE_HAVE_MPI): processes started by
 *           mpirun or srun, CPU all-reduce;
 *   nccl    (builds with AMPPROBE_HAVE_NCCL, trainer/comm_nccl.c) the same
 *           MPI processes, with gradient buffers on the GPU all-reduced by
 *           NCCL; MPI does the rest (bootstrap, scalars).
 *
 * MPI lives here and in the CLI only, never in libampprobe.
 *
 * The gradient all-reduce (pt_comm_allreduce_grads) is a sum in a fixed
 * order (rank 0, 1, ..., N-1) computed identically on every rank, so that
 * every rank gets the same bits and a job of N ranks x M micro-batches sums
 * in the order one process with N*M micro-batches accumulates. On MPI it is
 * an all-gather of each chunk followed by the local sum (memory N x chunk).
 * In FP16 the inputs are binary16 values and each partial sum is rounded to
 * binary16 (pt_sum_f16), as NCCL's half-precision reduction does, so a sum
 * of finite halves can overflow to inf.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampprobe/numerics.h"
#include "trainer-impl.h"

#ifdef AMPPROBE_HAVE_MPI
#include <mpi.h>
#endif

/* ---- FP16 sum emulation -------------------------------------------------- */

void pt_sum_f16(float *acc, const float *x, size_t n) {
  /* acc and x hold binary16 values; their FP32 sum is exact or, when it is
   * not (exponents more than 13 apart), far from a binary16 tie, so one
   * rounding of the FP32 sum to binary16 is the correctly rounded half sum. */
  for (size_t i = 0; i < n; i++) acc[i] = probe_round_f16(acc[i] + x[i]);
}

void pt_round_f16_array(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = probe_round_f16(x[i]);
}

/* Sum of `parts` contributions of n elements each, laid out one after the
 * other in src, in rank order, into dst, in the reduction dtype. */
void pt_sum_parts(float *dst, const float *src, size_t n, int parts,
                  pt_reduce_dtype dt) {
  memcpy(dst, src, n * sizeof(float));
  for (int r = 1; r < parts; r++) {
    const float *x = src + (size_t)r * n;
    if (dt == PT_REDUCE_F16) {
      pt_sum_f16(dst, x, n);
    } else {
      for (size_t i = 0; i < n; i++) dst[i] += x[i];
    }
  }
}

const char *pt_reduce_dtype_name(pt_reduce_dtype dt) {
  return dt == PT_REDUCE_F16 ? "fp16" : "fp32";
}

/* ---- single process -------------------------------------------------------- */

static probe_status single_sum(probe_comm *c, float *buf, size_t n,
                               pt_reduce_dtype dt) {
  (void)c;
  (void)buf;
  (void)n;
  (void)dt; /* one contribution: the sum is itself */
  return PROBE_OK;
}

static probe_status single_scalars(probe_comm *c, double *v, size_t n,
                                   int max) {
  (void)c;
  (void)v;
  (void)n;
  (void)max;
  return PROBE_OK;
}

static probe_status single_bcast(probe_comm *c, void *buf, size_t n) {
  (void)c;
  (void)buf;
  (void)n;
  return PROBE_OK;
}

static void single_abort(probe_comm *c, int code) {
  (void)c;
  (void)code;
}

static void single_close(probe_comm *c) { (void)c; }

static const pt_comm_ops single_ops = {
    .name = "single",
    .allreduce_sum = single_sum,
    .allreduce_scalars = single_scalars,
    .bcast_root0 = single_bcast,
    .abort = single_abort,
    .close = single_close,
};

/* ---- MPI -------------------------------------------------------------------- */

#ifdef AMPPROBE_HAVE_MPI
static probe_status mpi_st(int rc) {
  return rc == MPI_SUCCESS ? PROBE_OK : PROBE_ERR_IO;
}

static probe_status mpi_sum(probe_comm *c, float *buf, size_t n,
                            pt_reduce_dtype dt) {
  if (c->size == 1) return PROBE_OK;
  size_t chunk = n < PT_COMM_CHUNK ? n : PT_COMM_CHUNK;
  if (chunk == 0) return PROBE_OK;
  if (c->gather_cap < chunk * (size_t)c->size) {
    float *g = realloc(c->gather, chunk * (size_t)c->size * sizeof(float));
    if (!g) return PROBE_ERR_NOMEM;
    c->gather = g;
    c->gather_cap = chunk * (size_t)c->size;
  }
  for (size_t off = 0; off < n; off += chunk) {
    size_t k = n - off < chunk ? n - off : chunk;
    int rc = MPI_Allgather(buf + off, (int)k, MPI_FLOAT, c->gather, (int)k,
                           MPI_FLOAT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return PROBE_ERR_IO;
    pt_sum_parts(buf + off, c->gather, k, c->size, dt);
  }
  return PROBE_OK;
}

static probe_status mpi_scalars(probe_comm *c, double *v, size_t n, int max) {
  if (c->size == 1 || n == 0) return PROBE_OK;
  if (max)
    return mpi_st(MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_DOUBLE, MPI_MAX,
                                MPI_COMM_WORLD));
  /* a sum in rank order, the same bits on every rank */
  double *g = malloc(n * (size_t)c->size * sizeof(double));
  if (!g) return PROBE_ERR_NOMEM;
  int rc = MPI_Allgather(v, (int)n, MPI_DOUBLE, g, (int)n, MPI_DOUBLE,
                         MPI_COMM_WORLD);
  if (rc == MPI_SUCCESS)
    for (size_t i = 0; i < n; i++) {
      double s = g[i];
      for (int r = 1; r < c->size; r++) s += g[(size_t)r * n + i];
      v[i] = s;
    }
  free(g);
  return mpi_st(rc);
}

static probe_status mpi_bcast(probe_comm *c, void *buf, size_t n) {
  if (c->size == 1) return PROBE_OK;
  return mpi_st(MPI_Bcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD));
}

static void mpi_abort(probe_comm *c, int code) {
  (void)c;
  MPI_Abort(MPI_COMM_WORLD, code);
}

static void mpi_close(probe_comm *c) {
  (void)c;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

const pt_comm_ops pt_comm_mpi_ops = {
    .name = "mpi",
    .allreduce_sum = mpi_sum,
    .allreduce_scalars = mpi_scalars,
    .bcast_root0 = mpi_bcast,
    .abort = mpi_abort,
    .close = mpi_close,
};

static probe_status mpi_open(probe_comm *c, char *err, size_t errlen) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init(NULL, NULL) != MPI_SUCCESS)
    return pt_fail(err, errlen, PROBE_ERR_IO, "MPI_Init failed");
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size);
  c->ops = &pt_comm_mpi_ops;
  c->kind = PROBE_COMM_MPI;
  return PROBE_OK;
}
#endif

/* ---- public ---------------------------------------------------------------- */

int probe_comm_launched(void) {
  static const char *const vars[] = {
      "OMPI_COMM_WORLD_SIZE", /* Open MPI's mpirun */
      "PMIX_RANK",            /* PMIx launchers (srun --mpi=pmix, prterun) */
      "PMI_RANK", "PMI_SIZE", /* PMI-1/2 (srun --mpi=pmi2, MPICH hydra) */
  };
  const char *off = getenv("AMPPROBE_DIST");
  if (off && !strcmp(off, "0")) return 0; /* forced: one process */
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return 1;
  }
  /* a job step of several tasks started by srun (sbatch's batch shell and
   * a one-task step are not a parallel launch) */
  const char *n = getenv("SLURM_STEP_NUM_TASKS");
  return n && atoi(n) > 1;
}

int probe_comm_mpi_available(void) {
#ifdef AMPPROBE_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

int probe_comm_nccl_available(void) {
#ifdef AMPPROBE_HAVE_NCCL
  return 1;
#else
  return 0;
#endif
}

probe_status probe_comm_open(probe_comm **out, probe_comm_kind kind,
                             char *err, size_t errlen) {
  if (!out) return PROBE_ERR_INVALID_ARG;
  *out = NULL;
  probe_comm *c = calloc(1, sizeof *c);
  if (!c) return pt_fail(err, errlen, PROBE_ERR_NOMEM, "comm: out of memory");
  c->rank = 0;
  c->size = 1;
  c->ops = &single_ops;
  c->kind = PROBE_COMM_SINGLE;
  probe_status st = PROBE_OK;
  if (kind == PROBE_COMM_MPI || kind == PROBE_COMM_NCCL) {
#ifdef AMPPROBE_HAVE_MPI
    st = mpi_open(c, err, errlen);
#ifdef AMPPROBE_HAVE_NCCL
    if (st == PROBE_OK && kind == PROBE_COMM_NCCL)
      st = pt_comm_nccl_open(c, err, errlen);
#else
    if (st == PROBE_OK && kind == PROBE_COMM_NCCL)
      st = pt_fail(err, errlen, PROBE_ERR_UNSUPPORTED,
                   "comm: this build has no NCCL (AMPPROBE_NCCL is off)");
#endif
#else
    st = pt_fail(err, errlen, PROBE_ERR_UNSUPPORTED,
                 "comm: this build has no MPI (configure found no MPI; "
                 "install libopenmpi-dev and reconfigure)");
#endif
  }
  if (st != PROBE_OK) {
    free(c);
    return st;
  }
  *out = c;
  return PROBE_OK;
}

void probe_comm_close(probe_comm *c) {
  if (!c) return;
  c->ops->close(c);
  free(c->gather);
  free(c);
}

int probe_comm_rank(const probe_comm *c) { return c ? c->rank : 0; }
int probe_comm_size(const probe_comm *c) { return c ? c->size : 1; }
probe_comm_kind probe_comm_get_kind(const probe_comm *c) {
  return c ? c->kind : PROBE_COMM_SINGLE;
}
const char *probe_comm_name(const probe_comm *c) {
  return c ? c->ops->name : single_ops.name;
}

probe_status probe_comm_bcast(probe_comm *c, void *buf, size_t n) {
  if (!c || (n && !buf)) return PROBE_ERR_INVALID_ARG;
  return c->ops->bcast_root0(c, buf, n);
}

probe_status probe_comm_allreduce_f64(probe_comm *c, double *v, size_t n,
                                      int max) {
  if (!c || (n && !v)) return PROBE_ERR_INVALID_ARG;
  return c->ops->allreduce_scalars(c, v, n, max);
}

void probe_comm_abort(probe_comm *c, int code) {
  if (c) c->ops->abort(c, code);
}

probe_status pt_comm_allreduce_grads(probe_comm *c, float *buf, size_t n,
                                     pt_reduce_dtype dt) {
  if (!c) return PROBE_OK;
  return c->ops->allreduce_sum(c, buf, n, dt);
}
