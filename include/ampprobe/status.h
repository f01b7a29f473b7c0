/*
 * ampprobe/status.h - the status codes every ampprobe library returns.
 *
 * One X-macro list, PROBE_STATUS_MAP, generates both the enum and
 * probe_status_str(), so the two cannot drift apart. PROBE_OK is zero and
 * every error is negative, so `if (st < 0)` tests for failure.
 */
#ifndef AMPPROBE_STATUS_H
#define AMPPROBE_STATUS_H

#include "ampprobe/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* XX(NAME, value, "one-line description") */
#define PROBE_STATUS_MAP(XX)                                                   \
  XX(OK, 0, "success")                                                         \
  XX(ERR_INVALID_ARG, -1, "invalid argument")                                  \
  XX(ERR_NOMEM, -2, "out of memory")                                           \
  XX(ERR_IO, -3, "I/O error")                                                  \
  XX(ERR_NOSPACE, -4, "no space left or file size limit reached")              \
  XX(ERR_NOT_FOUND, -5, "not found")                                           \
  XX(ERR_NOT_HDF5, -6, "not an HDF5 file")                                     \
  XX(ERR_NOT_TRACE, -7, "not an ampprobe trace")                               \
  XX(ERR_VERSION, -8, "unsupported trace format version")                      \
  XX(ERR_CORRUPT, -9, "corrupt or truncated trace")                            \
  XX(ERR_STATE, -10, "call not valid in the current state")                    \
  XX(ERR_HDF5, -11, "HDF5 library error")                                      \
  XX(ERR_CUDA, -12, "CUDA error")                                              \
  XX(ERR_NO_DEVICE, -13, "no CUDA device available")                           \
  XX(ERR_UNSUPPORTED, -14, "not supported in this build")                      \
  XX(ERR_CONFIG, -15, "invalid configuration")                                 \
  XX(ERR_NONFINITE, -16, "non-finite value encountered")                       \
  XX(ERR_INTERRUPTED, -17, "interrupted")                                      \
  XX(ERR_EXISTS, -18, "file exists (not overwritten)")                         \
  XX(ERR_LOCKED, -19, "trace is being written by another writer")

typedef enum probe_status {
#define PROBE_STATUS_ENUM_(name, value, desc) PROBE_##name = value,
  PROBE_STATUS_MAP(PROBE_STATUS_ENUM_)
#undef PROBE_STATUS_ENUM_
} probe_status;

/* Returns a static, human-readable string for a status ("I/O error"). */
AMPPROBE_API
const char *probe_status_str(probe_status st);

/* Returns the enum name without prefix ("ERR_IO"), for logs and JSON. */
AMPPROBE_API
const char *probe_status_name(probe_status st);

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_STATUS_H */
