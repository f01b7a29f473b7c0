/*
 * tests/trainer/test_nccl.c - the NCCL communicator (trainer/comm_nccl.c) on
 * a GPU: one process (an MPI singleton, world 1) trains healthy-dp on the
 * CUDA backend with its FP32 gradient buckets all-reduced by NCCL, and gets
 * the run the MPI communicator gives (a sum over one rank is the identity),
 * with the all-reduce sites recorded. Skips (77) with the reason in a build
 * without NCCL or on a machine without a CUDA device; multi-GPU runs are
 * beyond this machine.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampprobe/trainer.h"

static int train(probe_comm *comm, const char *path, probe_train_result *r) {
  char err[256] = "";
  probe_train_config *c = NULL;
  if (probe_config_load_scenario(&c, "healthy-dp", err, sizeof err) ||
      probe_config_set(c, "steps", "20", err, sizeof err)) {
    fprintf(stderr, "config: %s\n", err);
    return 1;
  }
  probe_train_opts o;
  probe_train_opts_init(&o);
  o.backend = PROBE_BACKEND_CUDA;
  o.comm = comm;
  o.trace_path = path;
  o.mode = PROBE_MODE_FULL;
  probe_status st = probe_train(c, &o, r, err, sizeof err);
  probe_config_free(c);
  if (st != PROBE_OK) fprintf(stderr, "train (%s): %s\n", probe_comm_name(comm), err);
  return st != PROBE_OK;
}

int main(void) {
  if (!probe_comm_nccl_available()) {
    printf("SKIP: this build has no NCCL (AMPPROBE_NCCL off)\n");
    return 77;
  }
  if (!probe_train_backend_available(PROBE_BACKEND_CUDA)) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  char err[256] = "";
  probe_comm *comm = NULL;
  if (probe_comm_open(&comm, PROBE_COMM_NCCL, err, sizeof err) != PROBE_OK) {
    fprintf(stderr, "FAIL: opening NCCL: %s\n", err);
    return 1;
  }
  char dir[] = "/tmp/ampprobe-nccl-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char a[256], b[256];
  snprintf(a, sizeof a, "%s/nccl.h5", dir);
  snprintf(b, sizeof b, "%s/plain.h5", dir);
  probe_train_result rn, rp;
  int bad = train(comm, a, &rn) || train(NULL, b, &rp);
  if (!bad && !(rn.final_loss == rp.final_loss && isfinite(rn.final_loss))) {
    fprintf(stderr, "FAIL: NCCL world-1 run %.9g, plain run %.9g\n",
            rn.final_loss, rp.final_loss);
    bad = 1;
  }
  unlink(a);
  unlink(b);
  rmdir(dir);
  probe_comm_close(comm);
  printf("%s: NCCL world-1 final loss %.9g\n", bad ? "FAIL" : "ok",
         rn.final_loss);
  return bad;
}
