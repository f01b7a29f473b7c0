/*
 * trainer/comm_nccl.c - the NCCL communicator (builds with AMPPROBE_HAVE_NCCL,
 * i.e. CUDA + MPI + nccl.h/libnccl): MPI processes, one GPU each (the
 * node-local rank modulo the devices), whose device gradient buffers are
 * all-reduced by ncclAllReduce (FP32 sum) on a stream of their own. MPI
 * bootstraps it (rank 0's ncclUniqueId, broadcast) and keeps doing the host
 * operations (scalars, broadcasts, the FP16-emulating host all-reduce), so
 * the table below is MPI's with the name and close changed.
 * Without a GPU, pt_comm_nccl_open fails with PROBE_ERR_NO_DEVICE.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdlib.h>

#include "trainer-impl.h"

typedef struct pt_nccl {
  ncclComm_t comm;
  cudaStream_t stream;
} pt_nccl;

static void nccl_close(probe_comm *c) {
  pt_nccl *n = c->nccl;
  if (n) {
    ncclCommDestroy(n->comm);
    cudaStreamDestroy(n->stream);
    free(n);
    c->nccl = NULL;
  }
  pt_comm_mpi_ops.close(c);
}

static pt_comm_ops nccl_ops;

/* The rank among the processes of this node (MPI's shared-memory split). */
static int local_rank(void) {
  MPI_Comm node;
  int r = 0;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0,
                          MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_rank(node, &r);
    MPI_Comm_free(&node);
  }
  return r;
}

probe_status pt_comm_nccl_open(probe_comm *c, char *err, size_t errlen) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)
    return pt_fail(err, errlen, PROBE_ERR_NO_DEVICE,
                   "comm: NCCL needs a CUDA device; none here");
  if (cudaSetDevice(local_rank() % ndev) != cudaSuccess)
    return pt_fail(err, errlen, PROBE_ERR_NO_DEVICE,
                   "comm: cudaSetDevice failed");
  ncclUniqueId id;
  if (c->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
    return pt_fail(err, errlen, PROBE_ERR_IO, "comm: ncclGetUniqueId failed");
  if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) !=
      MPI_SUCCESS)
    return pt_fail(err, errlen, PROBE_ERR_IO, "comm: broadcasting the NCCL id "
                                              "failed");
  pt_nccl *n = calloc(1, sizeof *n);
  if (!n) return pt_fail(err, errlen, PROBE_ERR_NOMEM, "comm: out of memory");
  ncclResult_t nr = ncclCommInitRank(&n->comm, c->size, id, c->rank);
  if (nr != ncclSuccess) {
    free(n);
    return pt_fail(err, errlen, PROBE_ERR_IO, "comm: ncclCommInitRank: %s",
                   ncclGetErrorString(nr));
  }
  if (cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) !=
      cudaSuccess) {
    ncclCommDestroy(n->comm);
    free(n);
    return pt_fail(err, errlen, PROBE_ERR_IO, "comm: cudaStreamCreate failed");
  }
  nccl_ops = pt_comm_mpi_ops;
  nccl_ops.name = "nccl";
  nccl_ops.close = nccl_close;
  c->nccl = n;
  c->ops = &nccl_ops;
  c->kind = PROBE_COMM_NCCL;
  return PROBE_OK;
}

probe_status pt_comm_nccl_allreduce_dev(probe_comm *c, float *buf, size_t n) {
  pt_nccl *s = c->nccl;
  if (!s) return PROBE_ERR_INVALID_ARG;
  /* the buffer was written by synchronous copies on the legacy stream */
  if (ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, s->comm, s->stream) !=
      ncclSuccess)
    return PROBE_ERR_IO;
  return cudaStreamSynchronize(s->stream) == cudaSuccess ? PROBE_OK
                                                         : PROBE_ERR_IO;
}
