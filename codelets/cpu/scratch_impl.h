/* Buffers a kernel thread keeps from one call to the next, freed when the thread ends:
 * StarPU's workers run thousands of kernels a step, and a fresh buffer of a few megabytes
 * each time is an mmap whose pages fault in on first touch. Internal to codelets/cpu. */
#ifndef STARPIPE_CPU_SCRATCH_IMPL_H
#define STARPIPE_CPU_SCRATCH_IMPL_H

#include <stdint.h>

/* One user at a time per slot on a thread: a caller's buffer stays valid across its calls
 * into users of other slots. */
enum {
    SP_SCRATCH_ROUND_X, /* matmul.c: a product's operands rounded to bfloat16 */
    SP_SCRATCH_ROUND_Y,
    SP_SCRATCH_GEMM_A,  /* gemm.c: a block of a packed */
    SP_SCRATCH_GEMM_B,  /* gemm.c: b's packed panels */
    SP_SCRATCH_SLOTS
};

/* The calling thread's buffer for slot, with room for n floats, 64-byte aligned; what it
 * held is lost when it grows. NULL when memory runs out. */
float *sp_scratch(int slot, int64_t n);

#endif
