/* The CUDA runtime API header of the emulation: the same as cuda_runtime.h here. */
#include "cuda_runtime.h"
