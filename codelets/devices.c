/* The registry of devices (include/starpipe/device.h): one row per kind this build has,
 * in the order the executor tries them. A new device is its folder of codelets/ and one
 * row here. */
#include "starpipe/device.h"

#include <string.h>

#ifdef STARPIPE_HAVE_CUDA
#include "codelets/cuda/device.h"
#endif
#include "codelets/testdev/device.h"

const sp_device_kind *const *sp_device_kinds(void)
{
    static const sp_device_kind *kinds[4]; /* NULL-terminated */
    static int listed;
    if (!listed) {
        int n = 0;
#ifdef STARPIPE_HAVE_CUDA
        kinds[n++] = sp_device_kind_cuda();
#endif
        kinds[n++] = sp_device_kind_testdev(); /* only when STARPIPE_DEVICE=testdev */
        listed = 1;
    }
    return kinds;
}

const sp_device_kind *sp_device_kind_by_name(const char *name)
{
    for (const sp_device_kind *const *k = sp_device_kinds(); name && *k; k++)
        if (!strcmp((*k)->name, name)) return *k;
    return NULL;
}
