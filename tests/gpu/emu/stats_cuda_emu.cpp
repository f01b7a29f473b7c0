/* stats_cuda_emu.cpp - kernels/stats_cuda.cu compiled for the CPU emulation
 * (emu/cuda_runtime.h); see tests/gpu/CMakeLists.txt. */
#include "../../../kernels/stats_cuda.cu"
