/* tools/ddmin.h - ddmin lives in the analysis library
 * (include/ampprobe/analysis.h); kept so older CLI files compile. */
#ifndef AMPPROBE_TOOLS_DDMIN_H
#define AMPPROBE_TOOLS_DDMIN_H
#include "ampprobe/analysis.h"
#endif
