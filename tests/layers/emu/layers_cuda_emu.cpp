/* layers_cuda_emu.cpp - kernels/layers/layers_cuda.cu compiled for the CPU
 * emulation (tests/gpu/emu/cuda_runtime.h + emu/cublas_v2.h); see
 * tests/layers/CMakeLists.txt. */
#include "../../../kernels/layers/layers_cuda.cu"
