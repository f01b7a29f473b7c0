/*
 * version.c - ampprobe_version(): the library's version at run time, from
 * the generated ampprobe/version.h (one source: project(VERSION) in the
 * top-level CMakeLists.txt).
 */
#include "ampprobe/version.h"

const char *ampprobe_version(void) { return AMPPROBE_VERSION_STRING; }
