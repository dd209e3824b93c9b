// What cuGetProcAddress resolves, generated from cudaTypedefs.h (gen_driver.py).
#pragma once

#include <cstddef>
#include <string_view>

namespace ordo::driver {

// One signature of one driver function: `name` as cudaTypedefs.h spells it
// (without a _vN suffix), the CUDA version that introduced this signature (0:
// any), whether it is the per-thread-default-stream variant (_ptds/_ptsz), and
// the exported function with that signature.
struct ProcEntry {
  const char* name;
  int version;
  bool per_thread;
  void* fn;
  void* traced;  // fn, writing each call's result to stderr (ORDO_DRIVER_TRACE=1)
};

extern const ProcEntry kProcTable[];  // sorted by (name, per_thread, version)
extern const size_t kProcTableSize;

enum class ProcLookup { kFound, kSymbolNotFound, kVersionNotSufficient };

// The entry cuGetProcAddress(name, version, flags) returns: the newest signature
// introduced at or before `version`, the per-thread variant when `per_thread`
// and the function has one.
ProcLookup lookup_proc(std::string_view name, int version, bool per_thread, void** fn);

const char* error_name(int e);  // CUresult's enumerator name, or nullptr

}  // namespace ordo::driver
