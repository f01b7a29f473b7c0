/*
 * emu/cuda_emu.cpp - the CPU emulation behind emu/cuda_runtime*.h: tracked
 * allocations, synchronous copies/streams/events, and the block scheduler
 * (each block's threads are coroutines on the calling thread: a few
 * instructions of stack switch on x86-64, told to ASan as fiber switches
 * under it; ucontext elsewhere and under TSan).
 */
#include "cuda_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
/* Coroutine stacks are reused: clear ASan's marks of the frames they held. */
#define EMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

/* ---- allocations ------------------------------------------------------------ */

namespace {
struct emu_alloc {
  size_t bytes;
  emu_cudaMemoryType type;
};
std::map<uintptr_t, emu_alloc> &allocs() {
  static std::map<uintptr_t, emu_alloc> m;
  return m;
}
/* 64 "SMs" x 2 blocks each: big tensors get ~128 chunks, so every warp of
 * the merge kernel (128 threads) has partials to fold. */
int sm_count = 64;

/* Every allocation carries CANARY bytes past its end, checked when it is
 * freed: a kernel or copy that writes past a buffer aborts the test. */
const size_t CANARY = 64;

emu_cudaError_t track(void **p, size_t bytes, emu_cudaMemoryType type) {
  if (!p) return cudaErrorInvalidValue;
  *p = malloc(bytes + CANARY);
  if (!*p) return cudaErrorMemoryAllocation;
  memset((char *)*p + bytes, 0xa5, CANARY);
  allocs()[(uintptr_t)*p] = {bytes, type};
  return cudaSuccess;
}

emu_cudaError_t untrack(void *p) {
  if (!p) return cudaSuccess;
  auto it = allocs().find((uintptr_t)p);
  if (it == allocs().end()) return cudaErrorInvalidValue;
  const unsigned char *c = (const unsigned char *)p + it->second.bytes;
  for (size_t i = 0; i < CANARY; i++)
    if (c[i] != 0xa5) {
      fprintf(stderr, "emu: write past the end of a %zu-byte allocation\n",
              it->second.bytes);
      abort();
    }
  allocs().erase(it);
  free(p);
  return cudaSuccess;
}
} // namespace

extern "C" {

void emu_set_sm_count(int sms) { sm_count = sms; }

emu_cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
emu_cudaError_t cudaGetDevice(int *dev) {
  *dev = 0;
  return cudaSuccess;
}
emu_cudaError_t cudaSetDevice(int dev) {
  return dev == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
emu_cudaError_t cudaGetDeviceProperties(emu_cudaDeviceProp *p, int dev) {
  if (dev != 0) return cudaErrorInvalidValue;
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "CPU emulation (tests/gpu/emu)");
  p->major = 9;
  p->multiProcessorCount = sm_count;
  p->totalGlobalMem = (size_t)1 << 30;
  return cudaSuccess;
}
emu_cudaError_t cudaDeviceGetAttribute(int *v, emu_cudaDeviceAttr a, int dev) {
  (void)dev;
  if (a != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *v = sm_count;
  return cudaSuccess;
}
emu_cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

emu_cudaError_t cudaMalloc(void **p, size_t bytes) {
  return track(p, bytes, cudaMemoryTypeDevice);
}
emu_cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned flags) {
  (void)flags;
  return track(p, bytes, cudaMemoryTypeManaged);
}
emu_cudaError_t cudaMallocHost(void **p, size_t bytes) {
  return track(p, bytes, cudaMemoryTypeHost);
}
emu_cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
  (void)flags;
  return track(p, bytes, cudaMemoryTypeHost);
}
emu_cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags) {
  (void)flags;
  *dev = host;
  return cudaSuccess;
}
emu_cudaError_t cudaMemset(void *p, int v, size_t bytes) {
  memset(p, v, bytes);
  return cudaSuccess;
}
emu_cudaError_t cudaFree(void *p) { return untrack(p); }
emu_cudaError_t cudaFreeHost(void *p) { return untrack(p); }

emu_cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes,
                           emu_cudaMemcpyKind kind) {
  (void)kind;
  if (bytes) memmove(dst, src, bytes);
  return cudaSuccess;
}
emu_cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                emu_cudaMemcpyKind kind, emu_cudaStream_t s) {
  (void)s;
  return cudaMemcpy(dst, src, bytes, kind);
}
emu_cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes,
                                emu_cudaStream_t s) {
  (void)s;
  memset(p, v, bytes);
  return cudaSuccess;
}

struct emu_stream {
  int unused;
};
struct emu_event {
  int unused;
};
emu_cudaError_t cudaStreamCreate(emu_cudaStream_t *s) {
  *s = new emu_stream();
  return cudaSuccess;
}
emu_cudaError_t cudaStreamCreateWithFlags(emu_cudaStream_t *s, unsigned f) {
  (void)f;
  return cudaStreamCreate(s);
}
emu_cudaError_t cudaStreamDestroy(emu_cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
emu_cudaError_t cudaStreamSynchronize(emu_cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
emu_cudaError_t cudaEventCreate(emu_cudaEvent_t *e) {
  *e = new emu_event();
  return cudaSuccess;
}
emu_cudaError_t cudaEventCreateWithFlags(emu_cudaEvent_t *e, unsigned f) {
  (void)f;
  return cudaEventCreate(e);
}
emu_cudaError_t cudaEventRecord(emu_cudaEvent_t e, emu_cudaStream_t s) {
  (void)s;
  return e ? cudaSuccess : cudaErrorInvalidValue;
}
emu_cudaError_t cudaEventSynchronize(emu_cudaEvent_t e) {
  return e ? cudaSuccess : cudaErrorInvalidValue;
}
emu_cudaError_t cudaEventDestroy(emu_cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
emu_cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(emu_cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInsufficientDriver: return "insufficient driver";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  }
  return "unknown error";
}
const char *cudaGetErrorName(emu_cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  }
  return "cudaErrorUnknown";
}
emu_cudaError_t cudaPointerGetAttributes(emu_cudaPointerAttributes *a,
                                         const void *p) {
  memset(a, 0, sizeof *a);
  a->type = cudaMemoryTypeUnregistered;
  uintptr_t u = (uintptr_t)p;
  auto it = allocs().upper_bound(u);
  if (it != allocs().begin()) {
    --it;
    if (u < it->first + (it->second.bytes ? it->second.bytes : 1))
      a->type = it->second.type;
  }
  return cudaSuccess;
}

} /* extern "C" */

/* ---- the block scheduler ------------------------------------------------------ */

/* Context switch. On x86-64 a few instructions that save the callee-saved
 * registers and swap stack pointers; ucontext elsewhere and under TSan.
 * swapcontext saves the signal mask with a system call per switch (a block
 * barrier is one switch per thread), and under ASan its interceptor also
 * clears the shadow of the whole target stack (16 KiB for 128 KiB) at every
 * switch: with it, test_gpu_stats_emu took 488 s under ASan+UBSan on a Zen 1
 * where the plain build takes 20. Under ASan the assembly switch is
 * announced by __sanitizer_{start,finish}_switch_fiber, ASan's interface for
 * user-level stack switching, so that it knows which stack is running. */
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define EMU_ASM_SWITCH 1
extern "C" void emu_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl emu_switch\n"
        ".type emu_switch,@function\n"
        "emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n"
        "  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n"
        "  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_switch, .-emu_switch\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");
#endif

namespace {
enum { RUNNABLE, AT_BARRIER, DONE };
/* Stacks 128 KiB + 320 bytes apart: a power-of-two stride would put every
 * thread's stack top in the same cache sets. */
const size_t STACK_BYTES = 128 * 1024 + 320;
/* A coroutine: a thread of the running block, or the scheduler (the
 * calling thread's own stack, whose bounds ASan reports on the first switch
 * away from it). */
struct emu_context {
#ifdef EMU_ASM_SWITCH
  void *sp;
#else
  ucontext_t ctx;
#endif
  const void *stack_bottom; /* for ASan's fiber switches */
  size_t stack_size;
};
struct emu_thread {
  emu_context c;
  int state;
};
std::vector<emu_thread> threads;
std::vector<char> stacks;
std::vector<uint64_t> shfl_slots;
std::vector<unsigned int> shfl_count; /* shuffles per thread: bank parity */
unsigned int current;
const std::function<void()> *kernel_body;
emu_context scheduler;

/* EMU_FIBER_LEAVE tells ASan that the switch that follows is over to
 * `to`'s stack (`leaving`: the current coroutine will never run again);
 * EMU_FIBER_ARRIVE, first thing on the stack switched to, that it is done
 * (and, when asked, which stack was left). */
#ifdef __SANITIZE_ADDRESS__
#define EMU_FIBER_LEAVE(fake, to, leaving)                                     \
  __sanitizer_start_switch_fiber((leaving) ? nullptr : &(fake),                \
                                 (to).stack_bottom, (to).stack_size)
#define EMU_FIBER_ARRIVE(fake, from_bottom, from_size)                         \
  __sanitizer_finish_switch_fiber((fake), (from_bottom), (from_size))
#else
#define EMU_FIBER_LEAVE(fake, to, leaving) ((void)(fake), (void)(leaving))
#define EMU_FIBER_ARRIVE(fake, from_bottom, from_size) ((void)(fake))
#endif

/* Saves the running coroutine into `from` and resumes `to`; returns when
 * something switches back to `from`. */
void switch_to(emu_context &from, emu_context &to, bool leaving) {
  void *fake = nullptr;
  EMU_FIBER_LEAVE(fake, to, leaving);
#ifdef EMU_ASM_SWITCH
  emu_switch(&from.sp, to.sp);
#else
  swapcontext(&from.ctx, &to.ctx);
#endif
  EMU_FIBER_ARRIVE(fake, nullptr, nullptr);
}

/* Leaves thread me for the next runnable thread after it, or for the
 * scheduler when there is none: a barrier costs one switch per thread. */
void yield_from(unsigned int me, bool leaving) {
  unsigned int next = me + 1;
  while (next < blockDim.x && threads[next].state != RUNNABLE) next++;
  if (next < blockDim.x) {
    current = next;
    threadIdx = {next, 0, 0};
    switch_to(threads[me].c, threads[next].c, leaving);
  } else {
    switch_to(threads[me].c, scheduler, leaving);
  }
}

void run_from_scheduler(unsigned int t) {
  current = t;
  threadIdx = {t, 0, 0};
  switch_to(scheduler, threads[t].c, false);
}

void trampoline() {
  /* the first switch to a thread always comes from the scheduler (it runs
   * thread 0 first), so this learns the calling thread's stack bounds */
  const void *from_bottom = nullptr;
  size_t from_size = 0;
  EMU_FIBER_ARRIVE(nullptr, &from_bottom, &from_size);
  if (!scheduler.stack_bottom) {
    scheduler.stack_bottom = from_bottom;
    scheduler.stack_size = from_size;
  }
  (*kernel_body)();
  threads[current].state = DONE;
  yield_from(current, true); /* never resumed */
  abort();
}

void thread_init(unsigned int t) {
  char *stack = &stacks[t * STACK_BYTES];
  EMU_UNPOISON(stack, STACK_BYTES);
  emu_context &c = threads[t].c;
  c.stack_bottom = stack;
  c.stack_size = STACK_BYTES;
#ifdef EMU_ASM_SWITCH
  /* Stack as emu_switch leaves it: 6 saved registers, then the address
   * `ret` jumps to, at a 16-byte boundary so the entry sees the ABI's
   * alignment, then a zero return address for the entry itself. */
  uintptr_t top = ((uintptr_t)(stack + STACK_BYTES)) & ~(uintptr_t)15;
  void **ret_slot = (void **)(top - 16);
  ret_slot[1] = nullptr;
  ret_slot[0] = (void *)&trampoline;
  void **sp = ret_slot - 6;
  for (int i = 0; i < 6; i++) sp[i] = nullptr;
  c.sp = sp;
#else
  getcontext(&c.ctx);
  c.ctx.uc_stack.ss_sp = stack;
  c.ctx.uc_stack.ss_size = STACK_BYTES;
  c.ctx.uc_link = nullptr;
  makecontext(&c.ctx, trampoline, 0);
#endif
  threads[t].state = RUNNABLE;
}
} // namespace

uint64_t *emu_shfl_slot(unsigned int bank, unsigned int t) {
  return &shfl_slots[bank * blockDim.x + t];
}
unsigned int emu_shfl_bank(void) { return shfl_count[current]++ & 1u; }

void __syncthreads(void) {
  unsigned int me = current;
  threads[me].state = AT_BARRIER;
  yield_from(me, false);
}

void emu_launch(unsigned int grid, unsigned int block,
                const std::function<void()> &body) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  scheduler.stack_bottom = nullptr; /* learnt again: this caller's stack */
  threads.assign(block, emu_thread());
  EMU_UNPOISON(stacks.data(), stacks.size());
  stacks.resize(block * STACK_BYTES);
  shfl_slots.assign(2 * (size_t)block, 0);
  kernel_body = &body;
  for (unsigned int b = 0; b < grid; b++) {
    blockIdx = {b, 0, 0};
    for (unsigned int t = 0; t < block; t++) thread_init(t);
    shfl_count.assign(block, 0);
    for (;;) {
      /* each runnable thread runs to its next barrier or its end, handing
       * over to the next one; then release the barrier, or finish */
      unsigned int first = 0;
      while (first < block && threads[first].state != RUNNABLE) first++;
      if (first < block) run_from_scheduler(first);
      int waiting = 0;
      for (unsigned int t = 0; t < block; t++)
        if (threads[t].state == AT_BARRIER) {
          threads[t].state = RUNNABLE;
          waiting = 1;
        }
      if (!waiting) break; /* every thread is done */
    }
  }
  kernel_body = nullptr;
}
