/* The CUDA device's table (device.c): StarPU's CUDA workers, their streams and cuBLAS
 * handles, and a GPU's memory from the main thread. */
#ifndef STARPIPE_CUDA_DEVICE_H
#define STARPIPE_CUDA_DEVICE_H

#include "starpipe/device.h"

const sp_device_kind *sp_device_kind_cuda(void);

#endif
