/*
 * ampprobe/probe.h - libprobe: the instrumentation API a trainer calls at
 * every layer, and the validating reader every tool uses.
 *
 * Writing: open a session on a path, register layers, then per step
 * probe_step_begin / probe_tensor_record ... / probe_step_scalars /
 * probe_step_end. Every call returns a probe_status; the library never exits
 * or aborts the host program. The file format is docs/trace-format.md.
 *
 * Reading: probe_trace_open validates a trace and gives chunked access to its
 * tables, with memory bounded independently of trace length.
 *
 * Errors, one way for every call: the probe_status it returns says what
 * kind of failure (probe_status_str for its text, status.h), and the handle
 * keeps one line saying what exactly failed - probe_session_last_error(s),
 * probe_trace_last_error(t). A call that fails before there is a handle (a
 * failed probe_session_open, probe_trace_open or probe_trace_open_isolated)
 * leaves its line where the same functions find it with a NULL handle
 * (per thread). Details from below are folded into that line: HDF5's
 * message or the errno of a failed write, and for PROBE_ERR_CUDA the CUDA
 * runtime's own text (probe_cuda_last_error in numerics.h is the kernels'
 * layer of the same thing; a session caller need not read it). The
 * library prints nothing and installs no signal handlers.
 */
#ifndef AMPPROBE_PROBE_H
#define AMPPROBE_PROBE_H

#include "ampprobe/export.h"

#include <stddef.h>
#include <stdint.h>

#include "ampprobe/numerics.h"
#include "ampprobe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PROBE_TRACE_FORMAT "ampprobe-trace"
#define PROBE_TRACE_VERSION 1
#define PROBE_NAME_MAX 64 /* layer names, including the terminating NUL */
#define PROBE_LAYERS_MAX (1 << 20) /* layers in one trace (writer and reader) */

/* ---- vocabulary ----------------------------------------------------------- */

/* Module kinds. Names (probe_kind_name) are what users type in --fp32. */
#define PROBE_KIND_MAP(XX)                                                     \
  XX(INPUT, "input")                                                           \
  XX(LINEAR, "linear")                                                         \
  XX(BN, "bn")                                                                 \
  XX(LAYERNORM, "layernorm")                                                   \
  XX(REVIN, "revin")                                                           \
  XX(ACTIVATION, "activation")                                                 \
  XX(SOFTMAX, "softmax")                                                       \
  XX(ATTENTION, "attention")                                                   \
  XX(LOSS, "loss")                                                             \
  XX(OTHER, "other")                                                           \
  XX(CONV, "conv")           /* appended: convolutions (PyTorch tracer) */    \
  XX(EMBEDDING, "embedding") /* appended: embedding lookups */

typedef enum probe_kind {
#define PROBE_KIND_ENUM_(name, str) PROBE_KIND_##name,
  PROBE_KIND_MAP(PROBE_KIND_ENUM_)
#undef PROBE_KIND_ENUM_
      PROBE_KIND_COUNT
} probe_kind;

/* The name of a module kind as stored in traces ("linear", "revin", ...);
 * NULL for a value outside the enum. */
AMPPROBE_API
const char *probe_kind_name(probe_kind k);
/* Returns PROBE_ERR_NOT_FOUND for an unknown name. */
AMPPROBE_API
probe_status probe_kind_parse(const char *name, probe_kind *out);

/* The precision a module runs in is a probe_dtype (ampprobe/numerics.h):
 * fp32, fp16 or bf16, one enum for tensors and modules alike. */
AMPPROBE_API
probe_status probe_dtype_parse(const char *name, probe_dtype *out);

/* Where in a layer a tensor was observed. The phase follows from the site. */
#define PROBE_SITE_MAP(XX)                                                     \
  XX(FWD_IN, "fwd_in", FORWARD)       /* input the layer received */           \
  XX(FWD_OUT, "fwd_out", FORWARD)     /* output the layer produced */          \
  XX(FWD_SAVED, "fwd_saved", FORWARD) /* saved intermediate: mean, var,        \
                                         scores, probabilities */              \
  XX(GRAD_OUT, "grad_out", BACKWARD)  /* gradient arriving at the output */    \
  XX(GRAD_IN, "grad_in", BACKWARD)    /* gradient leaving to the input */      \
  XX(WEIGHT, "weight", FORWARD)       /* parameter as used (cast) */           \
  XX(WEIGHT_GRAD, "weight_grad", BACKWARD) /* parameter gradient (scaled) */   \
  XX(MASTER_WEIGHT, "master_weight", OPTIMIZER) /* FP32 master after step */ \
  /* appended (multi-rank, docs/trace-format.md): a layer's parameter         \
   * gradient as this rank sends it into the all-reduce (scaled, in the       \
   * all-reduce dtype, after any pre-division), and the same bucket as the    \
   * all-reduce returned it (before any division by N) */                     \
  XX(GRAD_PRE_ALLREDUCE, "grad_pre_allreduce", BACKWARD)                      \
  XX(GRAD_POST_ALLREDUCE, "grad_post_allreduce", BACKWARD)

typedef enum probe_site {
#define PROBE_SITE_ENUM_(name, str, phase) PROBE_SITE_##name,
  PROBE_SITE_MAP(PROBE_SITE_ENUM_)
#undef PROBE_SITE_ENUM_
      PROBE_SITE_COUNT
} probe_site;

typedef enum probe_phase {
  PROBE_PHASE_FORWARD = 0,
  PROBE_PHASE_BACKWARD = 1,
  PROBE_PHASE_OPTIMIZER = 2,
} probe_phase;

/* The name of a record site as stored in traces ("fwd_out", ...); NULL for a
 * value outside the enum. */
AMPPROBE_API
const char *probe_site_name(probe_site s);
/* The site of a name; PROBE_ERR_NOT_FOUND for an unknown one. */
AMPPROBE_API
probe_status probe_site_parse(const char *name, probe_site *out);
/* The phase a site's records are made in (forward for a value outside the
 * enum). */
AMPPROBE_API
probe_phase probe_site_phase(probe_site s);
/* "forward", "backward" or "optimizer"; NULL for a value outside the enum. */
AMPPROBE_API
const char *probe_phase_name(probe_phase p);
/* 1 when a record of a layer of `kind` at `site` with statistics s holds
 * inf or NaN as events are taken: every such record but the input of a
 * softmax or a loss holding -inf and nothing else non-finite (masked
 * logits: masked_fill(mask, -inf) before the softmax or the cross-entropy,
 * which map them to 0; a row of them only is the softmax's NaN output, a
 * masked target class the loss's inf, events there). The writer's
 * first non-finite step and record (probe_session_first_nonfinite,
 * probe_session_step_nonfinite), the post-mortem and the rank summaries
 * use it; the statistics themselves are as computed. */
AMPPROBE_API
int probe_record_nonfinite(probe_kind kind, probe_site site,
                           const probe_stats *s);

/* ---- records as stored and read back ------------------------------------- */

typedef struct probe_layer_info {
  int32_t id;                 /* index in the layers table, 0-based */
  char name[PROBE_NAME_MAX];  /* hierarchical, "encoder.bn2" */
  int32_t kind;               /* probe_kind */
  int32_t precision;          /* probe_dtype */
} probe_layer_info;

typedef struct probe_record {
  int64_t step;
  uint32_t seq;   /* execution order within the step, from 0 */
  int32_t layer;  /* layer id */
  int32_t site;   /* probe_site */
  int32_t dtype;  /* probe_dtype of the tensor as materialised */
  probe_stats stats;
} probe_record;

/* Bits of probe_step_scalars.unmeasured: which scalars were not measured
 * in a step. A scalar that was not measured is stored as NaN (the ints of
 * PROBE_SCALAR_SCALER as 0) with its bit set, so that a reader tells it
 * from a measured NaN: only a NaN whose bit is clear is a non-finite
 * value. 0, the default of a zero-initialised struct and what traces
 * written before the field existed read back as, means "all measured". */
#define PROBE_SCALAR_LOSS (1u << 0)       /* loss */
#define PROBE_SCALAR_LOSS_SCALE (1u << 1) /* loss_scale */
#define PROBE_SCALAR_SCALER (1u << 2)     /* growth_tracker, found_inf, skipped */
#define PROBE_SCALAR_LR (1u << 3)         /* lr */
#define PROBE_SCALAR_GRAD_NORM (1u << 4)  /* grad_norm */
#define PROBE_SCALAR_CLIP (1u << 5)       /* clip_threshold, clip_coef */
#define PROBE_SCALAR_WEIGHT_DIGEST (1u << 6) /* weight_digest; traces written
                                                before the field existed read
                                                back with this bit set */
#define PROBE_SCALAR_ALL ((1u << 7) - 1)

typedef struct probe_step_scalars {
  int64_t step;
  double loss;           /* unscaled loss of the step (NaN/inf kept) */
  double loss_scale;     /* scale used for this step's backward; 1 if off */
  int32_t growth_tracker; /* after the update */
  int32_t found_inf;     /* a gradient was non-finite after unscaling */
  int32_t skipped;       /* optimizer step skipped */
  uint32_t unmeasured;   /* PROBE_SCALAR_* bits of the scalars not measured
                            this step; 0: all were */
  double lr;             /* learning rate used */
  double grad_norm;      /* global L2 norm seen by the clipper, before clip */
  double clip_threshold; /* max_norm; 0 when clipping is off */
  double clip_coef;      /* coefficient applied, min(1, max/(norm+eps)); 1 if
                            no clipping happened */
  double wall_time;      /* seconds since the session opened */
  uint64_t weight_digest; /* appended: probe_digest64 of the FP32 master
                             weights after this step's optimizer step, in
                             parameter order (equal on every rank of a
                             data-parallel job); 0 with its bit set when not
                             measured */
} probe_step_scalars;

/* The weight digest: FNV-1a, 64 bit, over the bytes of data, chainable -
 * start with h = PROBE_DIGEST64_INIT and pass each result on to digest
 * several buffers as one (the parameters of a model, in order):
 *   h = PROBE_DIGEST64_INIT; for each p: h = probe_digest64(p, bytes, h);
 * For each byte b: h ^= b; h *= 1099511628211 (mod 2^64). Equal bytes give
 * equal digests on every host; data may be NULL when nbytes is 0. Host
 * memory only. */
#define PROBE_DIGEST64_INIT 14695981039346656037ull
AMPPROBE_API
uint64_t probe_digest64(const void *data, size_t nbytes, uint64_t h);

/* One stored tensor snapshot: n float32 values at data[offset .. offset+n)
 * of /snapshots/data (fp16/bf16 tensors are widened exactly). */
typedef struct probe_snapshot_info {
  int64_t step;
  uint32_t seq;    /* seq of the tensor's record in that step */
  int32_t layer;
  int32_t site;    /* probe_site */
  int32_t dtype;   /* probe_dtype the tensor had */
  int64_t offset;  /* first element in /snapshots/data */
  int64_t n;       /* elements stored (capped at snapshot_max_elems) */
  int64_t n_total; /* elements the tensor had */
} probe_snapshot_info;

#define PROBE_KERNEL_NAME_MAX 128 /* kernel names, including the NUL */

/* One GPU kernel collected with CUPTI, attributed to the NVTX range
 * (layer, site) open when it was launched; -1 when none was. */
typedef struct probe_kernel_record {
  int64_t step; /* -1 outside a step */
  int32_t layer;
  int32_t site;
  char name[PROBE_KERNEL_NAME_MAX]; /* (mangled) kernel name, truncated */
  uint64_t start_ns; /* GPU timestamps, ns */
  uint64_t end_ns;
  int32_t device;
  uint32_t stream;
} probe_kernel_record;

typedef enum probe_scaler_kind {
  PROBE_SCALER_BACKOFF = 0,   /* non-finite gradients: scale *= backoff */
  PROBE_SCALER_GROWTH = 1,    /* growth_interval clean steps: scale *= growth */
  PROBE_SCALER_HYSTERESIS = 2, /* overflow absorbed by hysteresis, no change */
  PROBE_SCALER_MIN_CLAMP = 3, /* backoff stopped at the minimum scale */
} probe_scaler_kind;

/* "backoff", "growth", "hysteresis" or "min_clamp"; NULL for a value
 * outside the enum. */
AMPPROBE_API
const char *probe_scaler_kind_name(probe_scaler_kind k);

typedef struct probe_scaler_event {
  int64_t step;
  int32_t kind; /* probe_scaler_kind */
  double old_scale;
  double new_scale;
  int32_t growth_tracker; /* after the event */
} probe_scaler_event;

/* ---- writing: the session ------------------------------------------------- */

typedef struct probe_session probe_session;

typedef enum probe_record_mode {
  /* Step scalars always; per-layer records go to an in-memory ring of the
   * last ring_steps steps, written out when a non-finite value appears,
   * with the ring_steps steps that follow (the flight recorder; at most
   * max_events times; docs/trace-format.md). */
  PROBE_MODE_SCALARS = 0,
  /* Every selected layer at every selected step. */
  PROBE_MODE_FULL = 1,
} probe_record_mode;

typedef struct probe_options {
  probe_record_mode mode;    /* default PROBE_MODE_SCALARS */
  const char *layer_select;  /* comma-separated name globs; NULL = all */
  int64_t step_start;        /* first step recorded in full mode (0) */
  int64_t step_end;          /* last step recorded, -1 = no end */
  int64_t step_every;        /* record every N-th step (1) */
  int ring_steps;            /* flight-recorder depth K (8), 0..
                                PROBE_RING_STEPS_MAX */
  double flush_seconds;      /* flush at most this long after data (1.0);
                                the session's writer thread keeps this
                                timer, calls or not */
  int64_t flush_steps;       /* also flush every N steps; 0 = off (0) */
  int snapshot_on_nonfinite; /* store full tensors at the first event (1) */
  size_t snapshot_max_elems; /* per tensor cap on stored elements (1<<20) */
  const char *command_line;  /* stored as a root attribute; may be NULL */
  const char *config_json;   /* run configuration, stored verbatim */
  const char *precision_policy; /* human-readable, e.g. "fp16; fp32: bn" */
  int cupti;                 /* collect kernel activity when on a GPU (0) */
  int max_events;            /* non-finite events that dump the flight
                                recorder / take snapshots, at most (16) */
  int64_t batch_rows;        /* rows buffered per table before one
                                H5Dwrite (4096); records and steps are
                                written at most 4 chunks at a time */
  int overwrite;             /* replace an existing trace file (0: an
                                existing file is PROBE_ERR_EXISTS) */
  /* appended: the rank of a multi-rank (data-parallel) job. rank -1 with
   * world_size 0 (the default): not part of one; else 0 <= rank <
   * world_size. run_id: the same string on every rank of one run (NULL or
   * "" = none), at most PROBE_RUN_ID_MAX characters of [A-Za-z0-9._-].
   * Anything else is PROBE_ERR_INVALID_ARG at probe_session_open. Stored
   * as the root attributes rank, world_size, run_id. */
  int rank;
  int world_size;
  const char *run_id;
} probe_options;

#define PROBE_RUN_ID_MAX 64 /* characters, without the NUL */
/* The deepest flight recorder probe_session_open accepts (the CLI's
 * --ring-steps limit); more is PROBE_ERR_CONFIG, as is any option above out
 * of its range (mode, step_every >= 1, step_start >= 0, flush_seconds >= 0,
 * flush_steps >= 0, max_events >= 0, batch_rows >= 1), the message naming
 * it. (A depth of 2^30 had the open allocate 24 GiB.) */
#define PROBE_RING_STEPS_MAX 1000000

/* Fills the defaults shown above. */
AMPPROBE_API
void probe_options_init(probe_options *opt);

/* Creates the trace file at path and starts the session's writer thread.
 * The path is claimed here: created exclusively - an existing file is
 * PROBE_ERR_EXISTS unless opt->overwrite (then it must be a regular file,
 * and is truncated) - and locked for the session's life, so that a second
 * writer of the same trace, in this process or another, fails at once
 * with PROBE_ERR_LOCKED. A missing directory, no permission, a read-only
 * file system, a path that is not a regular file (/dev/null) fail here too
 * (PROBE_ERR_IO). The HDF5 file and its tables are created by the writer
 * thread while the caller goes on, so a failure there (the disk fills, a
 * file-size limit) is a sticky I/O error like any later one (below).
 * The library installs no signal handler: a host that may run under a
 * file-size limit should ignore SIGXFSZ (the CLI does), so that a write
 * past the limit fails with EFBIG, which becomes PROBE_ERR_NOSPACE. The
 * writer checks the limit before each write and stops short of it anyway
 * (docs/trace-format.md). */
AMPPROBE_API
probe_status probe_session_open(probe_session **out, const char *path,
                                const probe_options *opt);
/* Flushes, marks the trace complete and closes. Always frees s. */
AMPPROBE_API
probe_status probe_session_close(probe_session *s);
/* Marks that this rank left the training loop by joining after the last
 * step it ended: its inputs ran out before the other ranks' (uneven
 * inputs: DDP's join(), torch.distributed.algorithms.Join), and it
 * shadows their collectives without steps of its own. The post-mortem of
 * the rank set (analysis.h, probe_ranks_run) then does not count the
 * trace, once closed, as "ended early" when it ends before the other
 * ranks'. A trace that is not closed (the rank was killed after joining)
 * is still "not closed": the mark does not say how the run ended. Call it
 * outside a step (PROBE_ERR_STATE inside one); calling it again changes
 * nothing, and the next probe_step_begin clears it (the rank is back: the
 * next epoch under join()). Written to the trace with its state at the
 * next flush, which is asked for now and not waited for, or at close
 * (/meta/state entry `joined`, docs/trace-format.md). */
AMPPROBE_API
probe_status probe_session_mark_joined(probe_session *s);
/* The most bytes of an abort reason kept (probe_session_mark_aborted),
 * its terminating NUL included. */
#define PROBE_ABORT_REASON_MAX 256
/* Marks that the job is ending abnormally (an exception, a signal, an
 * interrupt) though its trace is about to be closed: the close that
 * follows writes every row as usual but leaves the trace's completion flag
 * 0 (an older reader sees a trace that was not closed, never a healthy
 * one) and sets the root attributes `aborted` (reason) and `aborted_step`
 * (the step in progress at the mark, which the close ends as it stands -
 * half done; -1 between steps). Readers give them as
 * probe_trace_info.aborted and aborted_step. reason: what ended the job,
 * as data ("KeyboardInterrupt", "signal SIGTERM"); not empty, cut to
 * PROBE_ABORT_REASON_MAX - 1 bytes. The first mark holds: a later call
 * changes nothing. Callable inside or outside a step (PROBE_ERR_INVALID_ARG
 * for s or reason NULL or reason empty). Nothing is written before close. */
AMPPROBE_API
probe_status probe_session_mark_aborted(probe_session *s, const char *reason);
/* Forces everything buffered to disk now. */
AMPPROBE_API
probe_status probe_session_flush(probe_session *s);
/* Text of the last error, for messages ("H5Dwrite failed: ..."); s NULL:
 * the last failed probe_session_open or probe_session_close of this thread
 * (close frees the handle). I/O errors
 * (PROBE_ERR_NOSPACE, PROBE_ERR_IO, PROBE_ERR_HDF5) happen on the session's
 * writer thread and are sticky: the next call and every later one returns
 * them, and the file keeps its last flushed state. A session is used from
 * one thread at a time (docs/trace-format.md), in the process that opened
 * it: in a child of fork() every call on it that returns a status returns
 * PROBE_ERR_STATE at once, whatever its other arguments ("session opened
 * by process N, used in process M"; the two queries of its first
 * non-finite record say nothing more), and close frees nothing there (the
 * memory is the parent's copy); probe_range_push/pop do nothing there. */
AMPPROBE_API
const char *probe_session_last_error(const probe_session *s);

/* The first record holding NaN or inf, in execution order, among the steps
 * completed so far (probe_step_end): *step = -1 and *layer = -1 when none.
 * It is taken from the statistics the session computes anyway, so a caller
 * need not scan its tensors again. *covers_all (may be NULL) is 1 when the
 * session computes every record it is given (no layer_select, every step in
 * the window, and in scalars mode a flight recorder or snapshots on), so
 * that the answer is the first non-finite tensor of the whole run. */
AMPPROBE_API
probe_status probe_session_first_nonfinite(const probe_session *s,
                                           int64_t *step, int32_t *layer,
                                           probe_site *site, int *covers_all);

/* One record holding NaN or inf (probe_session_step_nonfinite): its layer
 * (-1: there is none; then site is PROBE_SITE_FWD_IN and the counts 0) and
 * site, and its counts as the session computed them when it was
 * recorded. */
typedef struct probe_nonfinite_record {
  int32_t layer;
  probe_site site;
  uint64_t count, nan_count, posinf_count, neginf_count;
} probe_nonfinite_record;

/* The step ended last (probe_step_end; *step = -1 before the first): its
 * first record holding NaN or inf in execution order (*any), and its first
 * such record at a forward-phase site (*forward: fwd_in, fwd_out,
 * fwd_saved, weight), each with layer -1 when there is none. It is taken
 * from the statistics computed as each record came, so a tensor the caller
 * changed in place after recording it (an activation's relu_(), a weight
 * the optimizer stepped) is judged as it was recorded. *measured (may be
 * NULL) is 1 when the session computed every record it was given in that
 * step, 0 when it left some out (a step outside the trace window, a layer
 * outside layer_select, scalars mode with neither flight recorder nor
 * snapshots): a caller who must know then looks at its tensors itself. */
AMPPROBE_API
probe_status probe_session_step_nonfinite(const probe_session *s,
                                          int64_t *step,
                                          probe_nonfinite_record *any,
                                          probe_nonfinite_record *forward,
                                          int *measured);

/* Layers may be registered at any time, but before the records that use
 * them; ids are 0, 1, 2, ... in registration order. A name is 1 to
 * PROBE_NAME_MAX - 1 bytes of valid UTF-8 (docs/trace-format.md), unique in
 * the session; at most PROBE_LAYERS_MAX layers. Else PROBE_ERR_INVALID_ARG
 * with the reason in probe_session_last_error. */
AMPPROBE_API
probe_status probe_layer_register(probe_session *s, const char *name,
                                  probe_kind kind, probe_dtype prec,
                                  int32_t *layer_id);

/* Opens step `step` (>= 0, above every step begun before); the records,
 * scalars and scaler transitions until probe_step_end belong to it.
 * PROBE_ERR_STATE inside a step or for a step not after the last. */
AMPPROBE_API
probe_status probe_step_begin(probe_session *s, int64_t step);

/* Records the statistics of one tensor. data is host or CUDA device memory
 * (detected); it must stay valid and unchanged until probe_step_end, since
 * the probe may snapshot it when this layer turns out to hold the step's
 * first non-finite value. Records of unselected layers/steps cost nothing
 * beyond a check. A host tensor recorded again right after itself (one
 * layer's output is the next one's input) with the same bytes reuses its
 * statistics; the bytes are compared, not assumed. */
AMPPROBE_API
probe_status probe_tensor_record(probe_session *s, int32_t layer,
                                 probe_site site, probe_dtype dtype,
                                 const void *data, size_t n);

/* Sets the step's scalars (sc->step is ignored; the current step is used;
 * wall_time is filled by the probe at probe_step_end). Scalars the caller
 * did not measure (no clipper: grad_norm, clip_coef) get their
 * PROBE_SCALAR_* bit in sc->unmeasured; their values are then stored as NaN
 * (0 for the scaler's ints) whatever sc holds. Unknown bits, found_inf
 * or skipped other than 0 and 1, and a measured loss_scale, grad_norm or
 * clip_threshold below 0 (NaN, inf and 0 are stored) are
 * PROBE_ERR_INVALID_ARG: a reader refuses such a row. A step gets a row in
 * the steps table only when this was called. (Named _set_ because the type
 * probe_step_scalars takes the plain name.) */
AMPPROBE_API
probe_status probe_step_set_scalars(probe_session *s,
                                    const probe_step_scalars *sc);
/* Records a loss-scaler event: inside a step at that step (ev->step is
 * ignored), outside one at ev->step, which must be >= 0
 * (PROBE_ERR_INVALID_ARG otherwise, as for an unknown kind). */
AMPPROBE_API
probe_status probe_scaler_transition(probe_session *s,
                                     const probe_scaler_event *ev);
AMPPROBE_API
probe_status probe_step_end(probe_session *s);

/* NVTX range named "<layer name>/<site name>" ("encoder.bn2/fwd_out") around
 * a layer's work, so Nsight Systems timelines show the model; with
 * opt.cupti, kernels launched inside the range are attributed to its step,
 * layer and site in the kernels table. Ranges nest; no-ops without CUDA. */
AMPPROBE_API
void probe_range_push(probe_session *s, int32_t layer, probe_site site);
AMPPROBE_API
void probe_range_pop(probe_session *s);

/* ---- reading -------------------------------------------------------------- */

typedef struct probe_trace probe_trace;

typedef struct probe_trace_info {
  int version;
  int complete;         /* 1 when the writer closed the file cleanly */
  int record_mode;      /* probe_record_mode the writer used */
  int64_t n_layers;
  int64_t n_steps;      /* rows in the steps table */
  int64_t n_records;
  int64_t n_scaler_events;
  int64_t n_snapshots;
  int64_t n_snapshot_elems; /* float32 values in /snapshots/data */
  int64_t n_kernels;
  int64_t n_events;     /* non-finite events the writer saw */
  int64_t n_flushes;
  int64_t last_step;    /* last step recorded, -1 if none */
  int64_t first_nonfinite_step; /* as the writer saw it, -1 if none */
  const char *created;      /* ISO 8601 UTC */
  const char *command_line;
  const char *config_json;
  const char *precision_policy;
  const char *library_versions;
  /* appended: as the writer's probe_options; traces written before they
   * existed read as -1, 0, "" */
  int32_t rank;
  int32_t world_size;
  const char *run_id;
  /* appended: 1 when the rank left the training loop by joining after
   * last_step (probe_session_mark_joined); 0 otherwise and in traces
   * written before the mark existed. Says nothing of how the trace ended:
   * complete does. */
  int joined;
  /* appended: the abort mark (probe_session_mark_aborted): "" when the job
   * did not mark an abnormal end (and in traces written before the mark);
   * else its reason (data, not escaped), the trace closed by its writer
   * with complete 0. aborted_step: the step in progress at the mark
   * (closed half done), -1 when none or not aborted. */
  const char *aborted;
  int64_t aborted_step;
  /* appended: 1 when the file is an HDF5 superblock and nothing else (its
   * stored end of file past the file's end) and no writer holds it: the
   * writer was killed before it wrote anything. Read as a trace not
   * closed, with 0 steps, no layers and empty strings (no config); 0 for
   * every other trace. */
  int unwritten;
} probe_trace_info;

/* Opens and validates (format name and version, tables, types, state and
 * layers in range). Errors: PROBE_ERR_NOT_FOUND, PROBE_ERR_NOT_HDF5,
 * PROBE_ERR_NOT_TRACE, PROBE_ERR_VERSION, PROBE_ERR_CORRUPT, PROBE_ERR_IO,
 * and PROBE_ERR_STATE for a file another trace handle of this process
 * holds open and that changed since it opened it (HDF5 would give this
 * open that handle's stale view: close it first). Opens traces of killed
 * writers (their rows up to the last flush) and live traces, this
 * process's own included (what was flushed, as another process reads
 * it). On
 * failure *out is NULL and probe_trace_last_error(NULL) has the message.
 * Not safe on files you do not trust: the validation runs HDF5 1.10 in
 * this process, and HDF5 itself can crash, hang or write past its buffers
 * on a damaged file (a corrupt global heap: a memcpy overrun in H5HG_read
 * while reading a string attribute, then SIGSEGV) before any check of
 * ours. For a file from elsewhere use probe_trace_open_isolated, which
 * parses it all in a child process first; the same holds for the
 * in-process analyses (probe_postmortem_json / _verdict against their
 * _isolated variants, probe_ranks_run with probe_ranks_options.isolate 0
 * against 1; analysis.h).
 * After an HDF5 call of the reader has failed on a damaged file, HDF5
 * 1.10 can leak internal blocks that make its own H5close loop and print
 * at exit; from then on the library's exit handler closes every HDF5
 * object still open in the process - the host's too, so close your own
 * HDF5 files before exit - and skips H5close. */
AMPPROBE_API
probe_status probe_trace_open(probe_trace **out, const char *path);
AMPPROBE_API
void probe_trace_close(probe_trace *t);
/* Text of the last error, one line; t NULL: the last failed
 * probe_trace_open of this thread. Every read checks the rows it returns
 * (ids, sites, dtypes in range; statistics and step scalars the writer can
 * produce, docs/trace-format.md "Reading") and fails with
 * PROBE_ERR_CORRUPT naming the row and the rule. */
AMPPROBE_API
const char *probe_trace_last_error(const probe_trace *t);

/* The trace's summary (format version, completeness, record mode, table
 * sizes), owned by t; NULL for a NULL t. */
AMPPROBE_API
const probe_trace_info *probe_trace_get_info(const probe_trace *t);
/* The layers table (small: held in memory). */
AMPPROBE_API
const probe_layer_info *probe_trace_layers(const probe_trace *t, size_t *n);

/* Chunked reads: copy up to max rows starting at row `start` into buf and set
 * *got (0 at the end). Rows are in write order (records: step, then seq). The
 * reader checks that order, for the first row against the row before it
 * too (kept from the read that ended there, else read from the file): rows
 * of /records not strictly increasing in (step, seq), or of /steps in
 * step, are PROBE_ERR_CORRUPT naming the row, whatever the chunk sizes. */
AMPPROBE_API
probe_status probe_trace_read_records(probe_trace *t, int64_t start,
                                      size_t max, probe_record *buf,
                                      size_t *got);
AMPPROBE_API
probe_status probe_trace_read_steps(probe_trace *t, int64_t start, size_t max,
                                    probe_step_scalars *buf, size_t *got);
AMPPROBE_API
probe_status probe_trace_read_scaler_events(probe_trace *t, int64_t start,
                                            size_t max,
                                            probe_scaler_event *buf,
                                            size_t *got);
/* (The same, for the snapshot index: one probe_snapshot_info a snapshot.) */
AMPPROBE_API
probe_status probe_trace_read_snapshots(probe_trace *t, int64_t start,
                                        size_t max, probe_snapshot_info *buf,
                                        size_t *got);
/* Copies the sn->n values of one snapshot into buf (n floats). */
AMPPROBE_API
probe_status probe_trace_read_snapshot_data(probe_trace *t,
                                            const probe_snapshot_info *sn,
                                            float *buf);
AMPPROBE_API
probe_status probe_trace_read_kernels(probe_trace *t, int64_t start,
                                      size_t max, probe_kernel_record *buf,
                                      size_t *got);

/* Runs probe_trace_open in a child process first and reads every row of
 * every table there (memory bounded), so that a crash inside the HDF5
 * library on a malformed file becomes PROBE_ERR_CORRUPT instead of killing
 * the caller, and a hang (no progress for 10 s, or not done in 60 s + 1 s
 * per 256 KB of file) becomes one too; then opens it in this process,
 * reading no variable-length string there (the child sends them). The safe
 * open for untrusted files. On failure the one-line message is
 * probe_trace_last_error(NULL), as for probe_trace_open; err (may be NULL)
 * gets a copy. Tools use this. */
AMPPROBE_API
probe_status probe_trace_open_isolated(probe_trace **out, const char *path,
                                       char *err, size_t errlen);

/* Progress of long work, for a caller that shows it (the library never
 * prints). phase is one of the PROBE_PROGRESS_* strings (compare with
 * strcmp); done units of total (rows; files for PROBE_PROGRESS_RANKS and
 * PROBE_PROGRESS_RANKS_AGAIN), done never decreasing within a phase,
 * done <= total, the last call of a phase that finished has done == total
 * (a phase that fails or is stopped may end earlier). Called in the
 * caller's process and thread, from inside the function that was given
 * it; it must not call back into the trace being read. Return 0 to go
 * on; non-zero asks to stop: the function then returns
 * PROBE_ERR_INTERRUPTED soon after (within one chunk of rows). */
typedef int (*probe_progress_fn)(const char *phase, uint64_t done,
                                 uint64_t total, void *user);
/* probe_trace_open_isolated's child reading every row of every table
 * (total: the rows of /records, /steps, /scaler_events, /kernels,
 * /snapshots/index and the values of /snapshots/data) */
#define PROBE_PROGRESS_CHECKING "checking"
/* probe_diag_run_progress's passes (analysis.h) */
#define PROBE_PROGRESS_ANALYSING "analysing"
/* probe_diff_run_progress reading both traces (analysis.h) */
#define PROBE_PROGRESS_COMPARING "comparing"
/* probe_ranks_run_progress reading the rank files (analysis.h; total: the
 * files), then reading again those whose first event needs a second look
 * (total: those files) */
#define PROBE_PROGRESS_RANKS "ranks"
#define PROBE_PROGRESS_RANKS_AGAIN "ranks again"

/* probe_trace_open_isolated, telling fn (may be NULL: the same as
 * probe_trace_open_isolated) how far the child has read: phase
 * PROBE_PROGRESS_CHECKING, from the child's messages on the pipe it
 * already signs its life on, a chunk of rows at a time (2,048 records).
 * fn is called from the parent's wait, never in the child. A non-zero
 * return kills the child and returns PROBE_ERR_INTERRUPTED. */
AMPPROBE_API
probe_status probe_trace_open_isolated_progress(probe_trace **out,
                                                const char *path, char *err,
                                                size_t errlen,
                                                probe_progress_fn fn,
                                                void *user);

/* ---- multi-rank trace sets ----------------------------------------------- */

/* The trace path of one rank (docs/trace-format.md, "Multi-rank traces"):
 * every "{rank}" in path is replaced by the decimal rank; else a path
 * ending in ".h5" gets ".rank<r>" inserted before it ("out/trace.h5" ->
 * "out/trace.rank3.h5"); else ".rank<r>.h5" is appended ("out/t" ->
 * "out/t.rank3.h5"). Writes the NUL-terminated result into out (cap
 * bytes). PROBE_ERR_INVALID_ARG for a NULL or empty path, rank < 0, or a
 * result that does not fit (out then holds ""). */
AMPPROBE_API
probe_status probe_rank_trace_path(char *out, size_t cap, const char *path,
                                   int rank);

/* Expands what a user names as a set of traces into file paths, the one
 * rule every tool and the Python package follow. Each arg:
 *   - an existing directory: its entries ending in ".h5" other than a
 *     directory or a dangling link (not recursive): a FIFO, socket or
 *     device named so is kept, and opening it says it is not a regular
 *     file;
 *   - an arg with glob metacharacters (* ? [) that is not an existing file:
 *     its glob(3) matches (none: PROBE_ERR_NOT_FOUND);
 *   - else the path itself (whether or not it exists: opening it reports).
 * The result is deduplicated (same string) and in natural order - digit
 * runs compare as numbers, so trace.rank2.h5 comes before trace.rank10.h5.
 * *paths_out is a malloc'ed array of *n_out malloc'ed strings; free it with
 * probe_trace_set_free. A directory with no .h5 file, or no args at all,
 * is PROBE_ERR_NOT_FOUND. On failure *paths_out is NULL, *n_out 0, and
 * probe_trace_last_error(NULL) names the argument. */
AMPPROBE_API
probe_status probe_trace_set_expand(const char *const *args, size_t n_args,
                                    char ***paths_out, size_t *n_out);
AMPPROBE_API
void probe_trace_set_free(char **paths, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_PROBE_H */
