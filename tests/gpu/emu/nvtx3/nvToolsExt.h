/* emu/nvtx3/nvToolsExt.h - NVTX ranges as no-ops for the CPU emulation. */
#ifndef AMPPROBE_EMU_NVTX_H
#define AMPPROBE_EMU_NVTX_H
static inline int nvtxRangePushA(const char *name) { (void)name; return 0; }
static inline int nvtxRangePop(void) { return 0; }
#endif
