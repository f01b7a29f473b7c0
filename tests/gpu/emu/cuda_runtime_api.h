/*
 * emu/cuda_runtime_api.h - a CPU stand-in for the small part of the CUDA
 * runtime API that kernels/stats_cuda.cu and tests/gpu use, so the CUDA
 * statistics code (host orchestration and kernels alike) runs and is tested
 * on machines without a GPU (test gpu_stats_emu).
 *
 * "Device" memory is host memory; copies are memcpy; streams and events are
 * synchronous (every call completes before it returns). Allocations are
 * tracked so cudaPointerGetAttributes answers like the real one. Every name
 * is mapped to emu_* so nothing clashes with a real libcudart in the link.
 * C-compatible; the device-side half is in emu/cuda_runtime.h.
 */
#ifndef AMPPROBE_EMU_CUDA_RUNTIME_API_H
#define AMPPROBE_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define cudaError_t emu_cudaError_t
#define cudaStream_t emu_cudaStream_t
#define cudaEvent_t emu_cudaEvent_t
#define cudaDeviceProp emu_cudaDeviceProp
#define cudaPointerAttributes emu_cudaPointerAttributes

typedef enum emu_cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
} emu_cudaError_t;

typedef struct emu_stream *emu_cudaStream_t;
typedef struct emu_event *emu_cudaEvent_t;

enum emu_cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum emu_cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};
enum emu_cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaMemAttachGlobal 0x01

typedef struct emu_cudaDeviceProp {
  char name[256];
  int major, minor, multiProcessorCount;
  size_t totalGlobalMem;
} emu_cudaDeviceProp;

typedef struct emu_cudaPointerAttributes {
  enum emu_cudaMemoryType type;
  int device;
  void *devicePointer, *hostPointer;
} emu_cudaPointerAttributes;

#define cudaGetDeviceCount emu_cudaGetDeviceCount
#define cudaGetDevice emu_cudaGetDevice
#define cudaSetDevice emu_cudaSetDevice
#define cudaGetDeviceProperties emu_cudaGetDeviceProperties
#define cudaDeviceGetAttribute emu_cudaDeviceGetAttribute
#define cudaDeviceSynchronize emu_cudaDeviceSynchronize
#define cudaMalloc emu_cudaMalloc
#define cudaMallocManaged emu_cudaMallocManaged
#define cudaMallocHost emu_cudaMallocHost
#define cudaHostAlloc emu_cudaHostAlloc
#define cudaHostGetDevicePointer emu_cudaHostGetDevicePointer
#define cudaMemset emu_cudaMemset
#define cudaHostAllocMapped 0x02u
#define cudaFree emu_cudaFree
#define cudaFreeHost emu_cudaFreeHost
#define cudaMemcpy emu_cudaMemcpy
#define cudaMemcpyAsync emu_cudaMemcpyAsync
#define cudaMemsetAsync emu_cudaMemsetAsync
#define cudaStreamCreate emu_cudaStreamCreate
#define cudaStreamCreateWithFlags emu_cudaStreamCreateWithFlags
#define cudaStreamDestroy emu_cudaStreamDestroy
#define cudaStreamSynchronize emu_cudaStreamSynchronize
#define cudaEventCreate emu_cudaEventCreate
#define cudaEventCreateWithFlags emu_cudaEventCreateWithFlags
#define cudaEventRecord emu_cudaEventRecord
#define cudaEventSynchronize emu_cudaEventSynchronize
#define cudaEventDestroy emu_cudaEventDestroy
#define cudaGetLastError emu_cudaGetLastError
#define cudaGetErrorString emu_cudaGetErrorString
#define cudaGetErrorName emu_cudaGetErrorName
#define cudaPointerGetAttributes emu_cudaPointerGetAttributes

emu_cudaError_t cudaGetDeviceCount(int *n);
emu_cudaError_t cudaGetDevice(int *dev);
emu_cudaError_t cudaSetDevice(int dev);
emu_cudaError_t cudaGetDeviceProperties(emu_cudaDeviceProp *p, int dev);
emu_cudaError_t cudaDeviceGetAttribute(int *v, enum emu_cudaDeviceAttr a,
                                       int dev);
emu_cudaError_t cudaDeviceSynchronize(void);
emu_cudaError_t cudaMalloc(void **p, size_t bytes);
emu_cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned flags);
emu_cudaError_t cudaMallocHost(void **p, size_t bytes);
/* Mapped pinned memory: host memory whose device view is the same address
 * (as with unified addressing). */
emu_cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
emu_cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags);
emu_cudaError_t cudaMemset(void *p, int v, size_t bytes);
emu_cudaError_t cudaFree(void *p);
emu_cudaError_t cudaFreeHost(void *p);
emu_cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes,
                           enum emu_cudaMemcpyKind kind);
emu_cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                enum emu_cudaMemcpyKind kind,
                                emu_cudaStream_t s);
emu_cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes,
                                emu_cudaStream_t s);
emu_cudaError_t cudaStreamCreate(emu_cudaStream_t *s);
emu_cudaError_t cudaStreamCreateWithFlags(emu_cudaStream_t *s, unsigned f);
emu_cudaError_t cudaStreamDestroy(emu_cudaStream_t s);
emu_cudaError_t cudaStreamSynchronize(emu_cudaStream_t s);
emu_cudaError_t cudaEventCreate(emu_cudaEvent_t *e);
emu_cudaError_t cudaEventCreateWithFlags(emu_cudaEvent_t *e, unsigned f);
emu_cudaError_t cudaEventRecord(emu_cudaEvent_t e, emu_cudaStream_t s);
emu_cudaError_t cudaEventSynchronize(emu_cudaEvent_t e);
emu_cudaError_t cudaEventDestroy(emu_cudaEvent_t e);
emu_cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(emu_cudaError_t e);
const char *cudaGetErrorName(emu_cudaError_t e);
emu_cudaError_t cudaPointerGetAttributes(emu_cudaPointerAttributes *a,
                                         const void *p);

/* Emulated device shape: SM count reported (default 64). */
void emu_set_sm_count(int sms);

#ifdef __cplusplus
}
#endif
#endif
