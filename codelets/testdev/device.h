/* The test device's table (device.c): CPU workers of a second StarPU memory node. */
#ifndef STARPIPE_TESTDEV_DEVICE_H
#define STARPIPE_TESTDEV_DEVICE_H

#include "starpipe/device.h"

const sp_device_kind *sp_device_kind_testdev(void);

#endif
