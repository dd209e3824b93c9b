// What the export tables (dark_api.cc) need of the driver's state (context.cc,
// device.cc, init.cc).
#pragma once

#include <cuda.h>

#include "dark_api.h"

namespace ordo::driver {

CUresult primary_context(CUdevice dev, CUcontext* out);  // retains it, as cuDevicePrimaryCtxRetain
// Context-local storage, on every runtime call: lock-free reads, a few nanoseconds.
CUresult CUDAAPI cls_put(CUcontext ctx, void* key, void* value, void (*dtor)(CUcontext, void*, void*));
CUresult CUDAAPI cls_delete(CUcontext ctx, void* key);
CUresult CUDAAPI cls_get(void** value, CUcontext ctx, void* key);
// Fills up to `max` devices; returns how many, or -CUresult when the host is unreachable.
int device_hash_info(DeviceHashInfo* out, int max);
int driver_version();
// ORDO_DRIVER_TRACE=1: calls, unknown table slots and missing entry points are logged.
bool driver_trace();

}  // namespace ordo::driver
