/* tools/diffcore.h - the diff engine lives in the analysis library
 * (include/ampprobe/analysis.h); kept so older CLI files compile. */
#ifndef AMPPROBE_TOOLS_DIFFCORE_H
#define AMPPROBE_TOOLS_DIFFCORE_H
#include "ampprobe/analysis.h"
#endif
