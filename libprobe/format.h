/*
 * format.h - private: the trace layout shared by the writer and the reader
 * (docs/trace-format.md is the public description).
 *
 * Every table is a 1-D chunked dataset of a compound type. Each compound is
 * described once, as a list of fields (name, offset in the C struct, kind);
 * from that list format.c builds the native memory type and the
 * little-endian file type, and the reader checks a file's type against it.
 */
#ifndef AMPPROBE_LIBPROBE_FORMAT_H
#define AMPPROBE_LIBPROBE_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include <hdf5.h>

#include "ampprobe/probe.h"

/* Tables, in the order the state dataset counts them. */
typedef enum probe__table {
  PROBE__T_LAYERS = 0,
  PROBE__T_STEPS,
  PROBE__T_RECORDS,
  PROBE__T_SCALER,
  PROBE__T_SNAPIDX,
  PROBE__T_SNAPDATA, /* 1-D float32, not a compound */
  PROBE__T_KERNELS,
  PROBE__T_COUNT
} probe__table;

/* /meta/state: int64[PROBE__STATE_LEN], overwritten in place at each flush.
 * Indices 1..7 are the committed row counts of the tables above. */
enum {
  PROBE__S_COMPLETE = 0,
  PROBE__S_ROWS = 1, /* PROBE__S_ROWS + probe__table */
  PROBE__S_LAST_STEP = PROBE__S_ROWS + PROBE__T_COUNT, /* 8 */
  PROBE__S_FIRST_NONFINITE,                            /* 9 */
  PROBE__S_EVENTS,                                     /* 10 */
  PROBE__S_FLUSHES,                                    /* 11 */
  PROBE__S_RECORD_MODE,                                /* 12 */
  PROBE__S_CHECK,    /* 13: probe__state_check of the others (features) */
  PROBE__S_FEATURES, /* 14: PROBE__FEAT_* bits; 0 in older traces */
  PROBE__S_JOINED,   /* 15: 1 when the rank left the loop by joining after
                        last_step (probe_session_mark_joined); 0 in older
                        traces, whose writers kept it "reserved" and 0 */
  PROBE__STATE_LEN = 16
};

/* Bits of /meta/state[PROBE__S_FEATURES]. */
#define PROBE__FEAT_CHECK 1 /* state[PROBE__S_CHECK] holds the check value */

/* The check value of a state: FNV-1a (64 bit) over the little-endian bytes
 * of every entry but PROBE__S_CHECK. A reader that finds it wrong has a
 * state that was edited or damaged after the writer wrote it. */
int64_t probe__state_check(const int64_t st[PROBE__STATE_LEN]);

/* Names of the state entries, stored as the "fields" attribute of
 * /meta/state (comma-separated). */
#define PROBE__STATE_FIELDS                                                    \
  "complete,n_layers,n_steps,n_records,n_scaler_events,n_snapshots,"          \
  "n_snapshot_elems,n_kernels,last_step,first_nonfinite_step,n_events,"       \
  "n_flushes,record_mode,check,features,joined"

typedef enum probe__fkind {
  PROBE__F_I32,
  PROBE__F_U32,
  PROBE__F_I64,
  PROBE__F_U64,
  PROBE__F_F32,
  PROBE__F_F64,
  PROBE__F_STR,  /* fixed-length UTF-8, NUL-terminated; len = bytes */
  PROBE__F_U64A, /* array of len uint64 */
} probe__fkind;

typedef struct probe__field {
  const char *name;
  size_t offset; /* in the C struct */
  probe__fkind kind;
  size_t len;    /* STR: bytes; U64A: elements; else 1 */
  int optional;  /* added after version 1 was first written: traces of
                    older writers lack it, and read it as zeros */
} probe__field;

typedef struct probe__tabledef {
  const char *path;      /* dataset path in the file */
  const probe__field *fields; /* NULL for the float data table */
  size_t n_fields;
  size_t mem_size;       /* sizeof the C struct (or float) */
  hsize_t chunk_rows;
} probe__tabledef;

extern const probe__tabledef probe__tables[PROBE__T_COUNT];

#define PROBE__STATE_PATH "/meta/state"

/* Builds the native memory type (file = 0) or the little-endian file type
 * (file = 1) of a table. Returns H5I_INVALID_HID on failure. */
hid_t probe__type_create(probe__table t, int file);

/* The native memory type of table t holding only the fields that
 * file_type has (optional fields may be absent); *missing gets bit i set
 * for each field i (index in the table's field list) that was absent, so
 * 0 when none was. Returns H5I_INVALID_HID on failure. */
hid_t probe__type_create_read(probe__table t, hid_t file_type,
                              uint32_t *missing);

/* Index of a field in its table's field list (for *missing above); -1
 * when the table has no such field. */
int probe__field_index(probe__table t, const char *name);

/* Checks that a file type holds every field of table t (optional ones
 * when present) with a compatible class and size. Returns 0, or -1 with a
 * reason written to why. */
int probe__type_check(probe__table t, hid_t file_type, char *why,
                      size_t whylen);

/* 1 when run_id is NULL, "" or at most PROBE_RUN_ID_MAX characters of
 * [A-Za-z0-9._-] (session.c; the reader checks a file's run_id with it). */
int probe__run_id_ok(const char *run_id);

/* Sets the message probe_trace_last_error(NULL) returns (this thread's
 * last failed open; reader.c), for probe_trace_set_expand. */
void probe__trace_open_msg(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* Rules rows obey, checked by the writer (refused, PROBE_ERR_INVALID_ARG)
 * and the reader (PROBE_ERR_CORRUPT) alike (format.c): a /steps row's
 * found_inf and skipped are 0 or 1; a /scaler_events row has a known kind
 * and a step >= 0. */
int probe__step_flags_ok(const probe_step_scalars *s);

/* reader.c: reads every row of the tables the analyses do not read
 * otherwise - /kernels, /snapshots/index, /snapshots/data - with the
 * checks of every read (at most once per handle; nothing for a handle of
 * probe_trace_open_isolated, whose child read them), so that an in-process
 * analysis refuses a file damaged only there as the isolated open does
 * (PROBE_ERR_CORRUPT, the message in probe_trace_last_error(t)). Memory:
 * a 1 MiB buffer. */
probe_status probe__trace_check_unread(probe_trace *t);

/* UTF-8 (format.c): the length (2..4) of the valid multi-byte sequence at
 * p, 0 when there is none (an ASCII byte, a stray or overlong byte, a
 * surrogate, past U+10FFFF); and whether a whole string is valid. */
int probe__utf8_len(const unsigned char *p);
int probe__utf8_valid(const char *s);

/* probe_text_escape (ampprobe/analysis.h) itself: the library's messages
 * show names from callers and files through it too. */
size_t probe__text_escape(char *out, size_t cap, const char *s);
/* The code point of the n-byte UTF-8 sequence at p when it is a bidi
 * formatting control (U+061C, U+200E, U+200F, U+202A..U+202E,
 * U+2066..U+2069), which probe__text_escape writes as \u202e; else 0. */
unsigned probe__bidi_control(const unsigned char *p, int n);
/* Why a scaler event cannot be one a loss scaler made, by itself (not
 * against the trace's steps: the reader checks those), NULL when it can:
 * the one rule of the writer (probe_scaler_transition) and the reader. */
const char *probe__scaler_event_why(const probe_scaler_event *e);

/* child.c: sessions register their writer-lock descriptor while they hold
 * it; a child the library forks (isolated readers) calls
 * probe__child_detach first: it closes those (so that it holds no trace
 * locked after its parent closed it) and sends stderr to /dev/null (what a
 * crash in the child prints is not the caller's to see). */
void probe__lock_fd_register(int fd);
void probe__lock_fd_unregister(int fd);
void probe__child_detach(void);
/* pipe(2) with both ends close-on-exec (a program another thread of the
 * host execs must not hold the pipe to an isolated reader open) and both
 * at fd 3 or above (a host started with 0, 1 or 2 closed: the child's
 * dup2 onto 2 must not hit its own pipe). */
int probe__pipe(int fds[2]);

/* Variable-length UTF-8 string type (for root attributes). */
hid_t probe__vlstr_type(void);

/* The HDF5 library here is the serial (not thread-safe) build, and every
 * writer session runs its own writer thread (writer.c). All of libprobe's
 * HDF5 calls hold this process-wide recursive lock, so that two threads
 * never run inside HDF5 at once. fork() takes it first (pthread_atfork,
 * registered at its first use), so a child never inherits an HDF5 in the
 * middle of a call; probe__h5_lock_child_reset re-creates it in the child
 * of a fork() made while holding it. */
void probe__h5_lock(void);
void probe__h5_unlock(void);
void probe__h5_lock_child_reset(void);
/* The process's fork generation (registering the fork handlers first):
 * probe__forked_since(g) is 1 in a child of fork() made after g was read
 * (an atomic load: cheap enough for every record). */
int probe__fork_generation(void);
int probe__forked_since(int generation);

/* Marks the descriptor under an open HDF5 file close-on-exec, so a program
 * the host starts (subprocess, system) does not inherit the trace open (or
 * HDF5's lock on it). HDF5 1.10 opens without O_CLOEXEC and has no option
 * for it; a fork+exec by another thread between the open and this call
 * can still inherit it. Under the lock. */
void probe__h5_cloexec(hid_t file);
/* The descriptor under an open HDF5 file (the sec2 driver's), or -1. */
int probe__h5_fd(hid_t file);
/* The descriptor under a trace this process writes, from its creation
 * (own) to its close (disown), under the lock: a child of fork() points
 * each at a sink and leaves HDF5 alone at its exit, so that nothing it
 * does - exit() included - writes into the parent's live trace. */
void probe__h5_own_fd(int fd);
void probe__h5_disown_fd(int fd);
/* Points fd at a sink: an empty anonymous memory file named name (writes
 * and truncates taken, reads of what was not written return zeros), or
 * /dev/null opened read-write without memfd_create; close-on-exec. 0, or
 * -1 when neither could be made. System calls only (async-signal-safe). */
int probe__fd_to_sink(int fd, const char *name);

/* HDF5's clean-up at exit (H5_term_library) closes every file still open;
 * after an H5Fclose that failed - HDF5 1.10 then keeps the id of a file it
 * has freed - it crashes there (SIGSEGV in H5F__close_cb, or it prints
 * "infinite loop closing library"). libprobe therefore asks HDF5 not to
 * register that handler (H5dont_atexit, from a constructor that runs when
 * the library is loaded, before any HDF5 call of the host) and registers
 * its own, which calls H5close - the same clean-up - unless a close failed,
 * in which case it leaves HDF5 alone: the process exits, and the kernel
 * closes the files. probe__h5_close_failed records such a failure.
 *
 * HDF5 1.10 also leaks internal blocks of its free lists on some failed
 * calls on a damaged file - every H5Dopen of a dataset whose object header
 * fails its checksum - with no id left to close (H5Fget_obj_count is 0).
 * H5close then loops over its free lists 100 times and prints "HDF5:
 * infinite loop closing library" on stderr at exit. The reader calls
 * probe__h5_failed_call after an HDF5 call of its own failed; from then on
 * the clean-up at exit closes every id still open (the host's files are
 * flushed and closed, as H5close would) and leaves the rest of HDF5's
 * clean-up to the process's exit. */
void probe__h5_close_failed(void);
void probe__h5_failed_call(void);
/* Closes an HDF5 id of any kind (file, group, dataset, datatype,
 * attribute); others are left alone. */
void probe__h5_close_id(hid_t id);

#endif /* AMPPROBE_LIBPROBE_FORMAT_H */
