/* The CUDA kernel backend (backend.c): the table of include/starpipe/backend.h on the
 * kernels of kernels_cuda.h. Pointers are device pointers; everything is enqueued on the
 * context's stream. */
#ifndef STARPIPE_CUDA_BACKEND_H
#define STARPIPE_CUDA_BACKEND_H

#include "starpipe/backend.h"

/* The backend's ctx: a cudaStream_t and a cublasHandle_t bound to it (NULL is fine for
 * what uses no cuBLAS: AdamW, the helpers). */
typedef struct {
    void *stream;
    void *cublas;
} sp_cuda_ctx;
const sp_backend *sp_backend_cuda(void);

/* The device of a CUDA worker: the table, c (the caller's, alive while the device is
 * used) holding stream and cublas. */
static inline sp_device sp_device_cuda(sp_cuda_ctx *c, void *stream, void *cublas)
{
    c->stream = stream;
    c->cublas = cublas;
    sp_device d = { SP_DEVICE_CUDA, sp_backend_cuda(), c, stream, NULL, 0 };
    return d;
}

#endif
