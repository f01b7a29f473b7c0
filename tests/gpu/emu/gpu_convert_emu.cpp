/* gpu_convert_emu.cpp - tests/gpu/gpu_convert.cu compiled for the CPU
 * emulation (emu/cuda_runtime.h). */
#include "../gpu_convert.cu"
