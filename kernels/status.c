/*
 * status.c - probe_status_str / probe_status_name, generated from the one
 * list in include/ampprobe/status.h.
 */
#include "ampprobe/status.h"

const char *probe_status_str(probe_status st) {
  switch (st) {
#define PROBE_STATUS_STR_(name, value, desc)                                   \
  case PROBE_##name:                                                           \
    return desc;
    PROBE_STATUS_MAP(PROBE_STATUS_STR_)
#undef PROBE_STATUS_STR_
  }
  return "unknown status";
}

const char *probe_status_name(probe_status st) {
  switch (st) {
#define PROBE_STATUS_NAME_(name, value, desc)                                  \
  case PROBE_##name:                                                           \
    return #name;
    PROBE_STATUS_MAP(PROBE_STATUS_NAME_)
#undef PROBE_STATUS_NAME_
  }
  return "UNKNOWN";
}
