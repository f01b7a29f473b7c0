/*
 * kernels/layers/layers-backend.h - what a backend file gives the registry
 * (layers_backend.c): its table of operations and a context constructor.
 * Internal (probe__ prefix); callers use probe_layers_backend_init.
 */
#ifndef AMPPROBE_LAYERS_BACKEND_H
#define AMPPROBE_LAYERS_BACKEND_H

#include "ampprobe/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

/* layers_cuda.cu (builds with CUDA only). create: PROBE_ERR_NO_DEVICE
 * without a usable device; stream is a cudaStream_t or NULL. */
const probe_layer_ops *probe__cuda_layer_ops(void);
probe_status probe__cuda_layers_create(void **ctx, void *stream);
/* Why the last create failed beyond its status (cuBLAS, which
 * layers_cuda.cu opens on first use, could not be loaded: the library and
 * the loader's words), or NULL. */
const char *probe__cuda_layers_error(void);
/* 1 when cuBLAS is loaded or loads now (no device needed). */
int probe__cuda_blas_loadable(void);

#ifdef __cplusplus
}
#endif
#endif /* AMPPROBE_LAYERS_BACKEND_H */
