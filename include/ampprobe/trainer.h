/*
 * ampprobe/trainer.h - the reference AMP trainer: configs, the scenario zoo
 * and a training run instrumented by libprobe.
 *
 * A run is described by a JSON config (docs/config.md): the module stack,
 * the data source, optimizer, learning-rate schedule, precision policy, loss
 * scaler and clipping. Configs come from a file or from the built-in
 * scenarios (trainer/scenarios/NAME.json, compiled into the library), are
 * adjusted with probe_config_set ("precision" = "fp16", "fp32" = "bn,revin",
 * "scaler.init" = "1024", ...) and then run with probe_train. The AMP
 * semantics are in docs/precision.md.
 *
 * Functions that can fail return a probe_status; on error a one-line message
 * goes to the caller's buffer (err, errlen; err may be NULL).
 */
#ifndef AMPPROBE_TRAINER_H
#define AMPPROBE_TRAINER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "ampprobe/layers.h"
#include "ampprobe/probe.h"
#include "ampprobe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configs ------------------------------------------------------------- */

typedef struct probe_train_config probe_train_config;

/* The name of the scenario used when none is given ("healthy"). */
#define PROBE_DEFAULT_SCENARIO "healthy"

/* Built-in scenarios, in name order. probe_scenario_name returns NULL past
 * the end; probe_scenario_json returns the embedded config text or NULL. */
size_t probe_scenario_count(void);
const char *probe_scenario_name(size_t i);
const char *probe_scenario_json(const char *name);
/* The scenario's "description" (one sentence), or "" when it has none. */
const char *probe_scenario_description(const char *name);

/* Parse a config from JSON text, a file, or a built-in scenario name.
 * Unknown keys, wrong types and impossible values are errors
 * (PROBE_ERR_CONFIG) whose message names the key ("model[2].out: expected an
 * integer", "stepz: unknown key"); file errors are prefixed with the path. */
probe_status probe_config_from_json(probe_train_config **out, const char *text,
                                    char *err, size_t errlen);
probe_status probe_config_load_file(probe_train_config **out, const char *path,
                                    char *err, size_t errlen);
probe_status probe_config_load_scenario(probe_train_config **out,
                                        const char *name, char *err,
                                        size_t errlen);
/* A deep copy (bisect runs many variants of one config). */
probe_status probe_config_clone(probe_train_config **out,
                                const probe_train_config *c);
void probe_config_free(probe_train_config *c);

/* Overrides one setting, value given as text the way a user types it.
 * Keys (docs/config.md lists them with their JSON counterparts):
 *   precision              fp16 | bf16 | fp32
 *   fp32                   "bn,softmax,revin": kinds or layer-name globs
 *                          forced to FP32 (replaces the config's list; ""
 *                          clears it)
 *   steps, seed, micro_batches, lr
 *   scaler.enabled         0 | 1 (0 = no loss scaling)
 *   scaler.init, scaler.growth, scaler.backoff, scaler.interval,
 *   scaler.hysteresis, scaler.min_scale
 *   clip.max_norm          0 = off
 *   clip.before_unscale    0 | 1 (the classic misordering)
 *   data.nan_step          step whose input batch holds NaN, -1 = none */
probe_status probe_config_set(probe_train_config *c, const char *key,
                              const char *value, char *err, size_t errlen);

/* The effective config as JSON (what probe_train stores in the trace).
 * Returns a malloc'd string the caller frees, or NULL when out of memory.
 * Parsing it back gives the same config. */
char *probe_config_to_json(const probe_train_config *c);

/* The scenario/config name ("healthy", or the file's "name"). */
const char *probe_config_name(const probe_train_config *c);
int64_t probe_config_steps(const probe_train_config *c);
/* The rank whose shard gets data.nan_step's NaN (data.nan_rank), or -1 when
 * the config injects none. */
int64_t probe_config_nan_rank(const probe_train_config *c);
/* Human-readable precision policy, e.g. "fp16; fp32: revin,softmax; loss fp32". */
probe_status probe_config_policy_str(const probe_train_config *c, char *buf,
                                     size_t len);

/* ---- the model's layers --------------------------------------------------- */

/* One layer instance of the model, as it is registered with libprobe. The
 * first entry is always "input" (PROBE_KIND_INPUT). precision is the one the
 * layer runs in under the config's current policy. */
typedef struct probe_layer_desc {
  char name[PROBE_NAME_MAX];
  probe_kind kind;
  probe_dtype precision;
} probe_layer_desc;

/* Fills up to max entries; *n gets the total number of layers. */
probe_status probe_config_layers(const probe_train_config *c,
                                 probe_layer_desc *out, size_t max, size_t *n);

/* 1 when one fp32-list entry selects the layer, else 0. The rule
 * probe_train applies. An entry is a kind name such as "bn" (every layer
 * of that kind, and also a glob), a glob such as "enc.*" on the layer
 * name, or PROBE_POLICY_LITERAL followed by a name ("=enc.bn2"): the one
 * layer named exactly that, never a kind nor a glob (a layer named "bn",
 * or "enc[0]", is itself; bisect names layers this way). */
int probe_policy_match(const char *entry, const char *layer_name,
                       probe_kind kind);
#define PROBE_POLICY_LITERAL '='

/* ---- data-parallel runs: the communicator ---------------------------------- */

/* The processes of a data-parallel job (docs/cli.md, "run under mpirun").
 * Kinds: SINGLE (one process, world 1: every reduction is the identity),
 * MPI (Open MPI: processes started by mpirun or srun; builds with
 * AMPPROBE_HAVE_MPI), NCCL (MPI processes whose device gradient buffers are
 * all-reduced by NCCL; builds with AMPPROBE_HAVE_NCCL, needs a GPU). Opened
 * once per process, before probe_train, and closed after (MPI_Finalize).
 * MPI is in the trainer only: libampprobe never links it. */
typedef struct probe_comm probe_comm;

typedef enum probe_comm_kind {
  PROBE_COMM_SINGLE = 0,
  PROBE_COMM_MPI = 1,
  PROBE_COMM_NCCL = 2,
} probe_comm_kind;

/* 1 when the environment says this process was started by a parallel
 * launcher: mpirun (OMPI_COMM_WORLD_SIZE), a PMIx or PMI launcher
 * (PMIX_RANK, PMI_RANK, PMI_SIZE) or srun (SLURM_STEP_NUM_TASKS > 1);
 * 0 whatever they say when AMPPROBE_DIST=0. */
int probe_comm_launched(void);
/* 1 when this build has MPI / NCCL. */
int probe_comm_mpi_available(void);
int probe_comm_nccl_available(void);

/* Opens a communicator of the kind (MPI_Init for MPI and NCCL).
 * PROBE_ERR_UNSUPPORTED when the build lacks it, PROBE_ERR_NO_DEVICE for NCCL
 * without a GPU. */
probe_status probe_comm_open(probe_comm **out, probe_comm_kind kind,
                             char *err, size_t errlen);
void probe_comm_close(probe_comm *c); /* MPI_Finalize; NULL is fine */
int probe_comm_rank(const probe_comm *c); /* 0 for NULL */
int probe_comm_size(const probe_comm *c); /* 1 for NULL */
probe_comm_kind probe_comm_get_kind(const probe_comm *c);
const char *probe_comm_name(const probe_comm *c); /* "single", "mpi", "nccl" */
/* Rank 0's n bytes to every rank. */
probe_status probe_comm_bcast(probe_comm *c, void *buf, size_t n);
/* v (n) summed (in rank order: the same bits everywhere) or, with max, the
 * maximum over ranks, in place on every rank. */
probe_status probe_comm_allreduce_f64(probe_comm *c, double *v, size_t n,
                                      int max);
/* Ends the whole job (MPI_Abort); nothing for a single process. */
void probe_comm_abort(probe_comm *c, int code);

/* ---- a training run ------------------------------------------------------ */

/* Where the layers run: probe_backend (ampprobe/layers.h), PROBE_BACKEND_CPU
 * (OpenBLAS single-threaded) or PROBE_BACKEND_CUDA. The AMP step (unscale,
 * clip, optimizer, scaler) is the same host code for both. */

/* 1 when this build and machine can run the backend. */
int probe_train_backend_available(probe_backend b);

/* Called after every step; a nonzero return stops the run (interrupted). */
typedef int (*probe_train_progress_fn)(int64_t step, double loss, double scale,
                                       void *user);

/* Progress of a run for logs and progress lines (the caller decides how
 * often to print). The report hook is called:
 *   SETUP  once, after the memory need was computed and accepted, before the
 *          model is allocated (host_bytes / device_bytes are known; step 0);
 *   STEP   after every step (step = steps completed, loss and scale of that
 *          step, step_s its wall time);
 *   DONE   once at the end of a run that reported SETUP (also after an
 *          error or interruption).
 * A nonzero return from SETUP or STEP stops the run (interrupted). */
typedef enum probe_train_phase {
  PROBE_TRAIN_PHASE_SETUP = 0,
  PROBE_TRAIN_PHASE_STEP = 1,
  PROBE_TRAIN_PHASE_DONE = 2,
} probe_train_phase;

typedef struct probe_train_progress_info {
  probe_train_phase phase;
  int64_t step;          /* steps completed */
  int64_t steps;         /* steps the run will take (the config's) */
  double loss, scale;    /* of the last step; NaN before the first */
  double elapsed_s;      /* since probe_train began */
  double step_s;         /* wall time of the last step */
  uint64_t host_bytes;   /* memory need computed from the config (host) */
  uint64_t device_bytes; /* and on the device (CUDA backend) */
} probe_train_progress_info;

typedef int (*probe_train_report_fn)(const probe_train_progress_info *info,
                                     void *user);

typedef struct probe_train_opts {
  const char *trace_path;   /* NULL: no trace is written */
  probe_record_mode mode;   /* PROBE_MODE_SCALARS (flight recorder) or FULL */
  int ring_steps;           /* flight-recorder depth; 0 = libprobe default */
  const char *command_line; /* stored in the trace; may be NULL */
  probe_train_progress_fn progress; /* may be NULL */
  void *user;
  /* Polled once per step; nonzero ends the run cleanly (SIGINT handler). */
  volatile sig_atomic_t *stop_flag;
  /* End the run K steps after the first non-finite loss; -1 = never. */
  int64_t stop_on_nonfinite;
  /* Number of final steps averaged into final_loss (default 10). */
  int final_window;
  probe_backend backend; /* PROBE_BACKEND_CPU by default */
  /* 1: an existing file at trace_path is refused (PROBE_ERR_EXISTS, as
   * libprobe does by default); 0 (the default, as before): it is replaced
   * (probe_options.overwrite). A trace being written by another writer is
   * refused either way (PROBE_ERR_LOCKED). The CLI sets it unless told to
   * overwrite. */
  int trace_exclusive;
  /* Progress for logs (see probe_train_report_fn); may be NULL. Gets the
   * same `user` as progress. */
  probe_train_report_fn report;
  /* Host memory the run may need, in bytes: a config needing more is
   * refused before anything is allocated, with a one-line message naming
   * both figures (PROBE_ERR_NOMEM). 0 = the default: 80% of physical
   * memory, or the process's ulimit -v / -d when lower. */
  uint64_t max_memory;
  /* Data-parallel runs: the communicator (NULL = one process, no all-reduce
   * stage, the trace as before). With one, rank r of N trains micro-batches
   * r*M..r*M+M-1 of a global batch of N*M (M = the config's micro_batches),
   * gradients are all-reduced (the config's dist block) before unscaling,
   * found_inf by MAX, the loss is the global mean, and the trace gets the
   * rank, the world size and run_id. */
  probe_comm *comm;
  const char *run_id; /* NULL: none */
  /* Test aid (fault injection): with fault_kill set, raise(SIGKILL) at the
   * start of step fault_kill_step (0, the default: never). The CLI sets them
   * from AMPPROBE_FAULT_KILL_RANK / AMPPROBE_FAULT_KILL_STEP. */
  int fault_kill;
  int64_t fault_kill_step;
  /* The trace is also flushed every this many steps (probe_options.
   * flush_steps; 0 = libprobe's default: by time only). */
  int64_t flush_steps;
  /* ... and at most this long after data (probe_options.flush_seconds;
   * 0 = libprobe's default, 1 s). */
  double flush_seconds;
  /* The weight digest (probe_digest64 of the FP32 masters after each step,
   * in the steps' scalars): 1 on, 0 off (not measured, its bit set), -1
   * (probe_train_opts_init's default) on in a data-parallel run (comm set),
   * where the post-mortem compares the ranks' digests, and off in one
   * process, where nothing compares it: it hashes every master byte in
   * series (some 4 cycles a byte, ~2.5% of a step of the default scenario),
   * as ampprobe.torch.Tracer's weight_digest=True is opt-in too. */
  int weight_digest;
  /* appended: the signal that set *stop_flag (0 or NULL: not known). A run
   * the stop flag ended marks its trace aborted before closing it
   * (probe_session_mark_aborted: "signal SIGTERM", "signal SIGINT", "the
   * stop flag", "another rank's stop"), so the trace does not read as a
   * finished run. */
  volatile sig_atomic_t *stop_signal;
} probe_train_opts;

void probe_train_opts_init(probe_train_opts *o);

typedef struct probe_train_result {
  int64_t steps_run;        /* optimizer steps attempted (incl. skipped) */
  /* Mean loss of the last final_window steps run (all of them when fewer);
   * NaN/inf when any of those losses is. */
  double final_loss;
  double last_loss;         /* loss of the last step run */
  double first_loss;        /* loss of step 0 */
  int scaler_enabled;       /* dynamic loss scaling was on (the config's
                               scaler.enabled, and an FP16 run) */
  double min_scale, max_scale; /* loss scale range used (1, 1 if off) */
  double final_scale;
  int64_t backoffs;         /* scaler backoff events (incl. min clamps) */
  int64_t growths;
  int64_t skipped_steps;    /* optimizer steps skipped on overflow */
  int64_t longest_skip_run; /* most consecutive skipped steps */
  double clip_max_norm;     /* the config's clip threshold; 0 = clipping off */
  int64_t clip_norms_seen;  /* steps with clipping on and a finite norm */
  double max_clip_ratio;    /* max grad_norm / max_norm over finite norms;
                               0 when clipping is off or no norm was finite
                               (clip_norms_seen 0) */
  int64_t first_nonfinite_loss_step; /* -1 if none */
  /* First tensor with a non-finite value, in execution order, as the
   * trainer saw it (step -1 when none). */
  int64_t first_nonfinite_step;
  char first_nonfinite_layer[PROBE_NAME_MAX];
  probe_site first_nonfinite_site;
  int diverged;    /* any non-finite loss, or the final loss non-finite */
  int interrupted; /* stop flag, progress callback or stop_on_nonfinite */
  int stopped_by_flag; /* the stop flag (opts->stop_flag) was set, on this
                          rank or - agreed at the step boundary - another,
                          before the last step: the run stopped for it */
  double wall_seconds; /* the whole call: set-up, steps, closing the trace */
  double loop_seconds; /* the steps alone (no set-up, no opening or closing
                          of the trace) */
} probe_train_result;

/* Trains the config. Runs share no trainer state, so several may run in
 * threads, with two caveats: OpenBLAS's thread count is set to 1 globally,
 * and the HDF5 library (traces, HDF5 data) is the serial build, so runs that
 * write traces or read HDF5 data belong in separate processes.
 * Returns PROBE_OK when the run completed (even when it
 * diverged: see out->diverged) or was interrupted; an error status when it
 * could not run (bad data file, trace not writable...; PROBE_ERR_UNSUPPORTED
 * or PROBE_ERR_NO_DEVICE for a CUDA backend that is not there). */
probe_status probe_train(const probe_train_config *c,
                         const probe_train_opts *opts, probe_train_result *out,
                         char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_TRAINER_H */
