// What a cubin says of each kernel's use of the device: registers, local
// (stack) memory, static shared memory and the launch bound. The cuda
// backend's device reports these itself (cuFuncGetAttribute); the sim, which
// runs no device code, reports what the program's own cubin states, so that
// cuFuncGetAttribute and the occupancy calls answer for the kernel at hand.
//
// Where a cubin keeps them (nvcc 13, every architecture seen):
//   .nv.info             EIATTR_REGCOUNT (0x2f), EIATTR_FRAME_SIZE (0x11):
//                        SVAL records {u32 symbol index, u32 value}
//   .nv.info.<kernel>    EIATTR_MAX_THREADS (0x05, __launch_bounds__) or
//                        EIATTR_REQNTID (0x10, .reqntid): SVAL {u32 x, y, z}
//   .nv.shared.<kernel>  SHT_NOBITS; its size is the kernel's static shared memory,
//                        and, where the cubin has .nv.shared.reserved.0 (sm_90
//                        and later), the 1 KiB the device reserves per block first
// The bytes come from the guest: every read is bounded by the span given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>

namespace ordo::image {

// One record of an .nv.info section: {u8 format, u8 attribute, u16}, then
// for format 4 (SVAL) that u16's count of bytes. The u16 is unused by format
// 1 (NVAL, e.g. EIATTR_CTAIDZ_USED: a kernel that reads blockIdx.z), a byte
// value for 2 (BVAL), the value for 3 (HVAL).
struct NvInfoRecord {
  uint8_t format = 0, attr = 0;
  uint16_t hval = 0;                  // format 2 (the byte) and 3
  std::span<const std::byte> value;   // format 4
};
inline constexpr uint8_t kNvFmtNval = 1, kNvFmtBval = 2, kNvFmtHval = 3, kNvFmtSval = 4;
// Calls `fn` for each record; false at a record that runs past the section or
// has an unknown format (nothing after it can be trusted).
bool walk_nv_info(std::span<const std::byte> section, const std::function<void(const NvInfoRecord&)>& fn);

// Each value bounded, whatever the image says: registers <= 255, bytes
// <= 1 GiB, max_threads <= 1025 (anything above a block's 1024 threads).
struct KernelResources {
  uint32_t registers = 0;    // per thread
  uint32_t local_bytes = 0;  // per thread: the stack frame
  uint32_t shared_bytes = 0; // static, per block
  uint32_t max_threads = 0;  // the launch bound's threads per block; 0: none
};
using KernelResourceMap = std::map<std::string, KernelResources, std::less<>>;

// Every kernel of one cubin (an ELF; false if it cannot be read as one).
bool cubin_resources(std::span<const std::byte> elf, KernelResourceMap* out);

// The kernels of the cubin a device of architecture `arch` (e.g. 90) would
// load from a module image: the image itself when it is a cubin; from a
// fatbin, its cubin of the highest architecture up to `arch`, or failing that
// of the lowest, decompressed if it is compressed (decompress.h). False when
// there is none, or it cannot be read (PTX alone: what the device compiles
// from it is its own).
bool image_resources(std::span<const std::byte> image, uint32_t arch, KernelResourceMap* out);

}  // namespace ordo::image
