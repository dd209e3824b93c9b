// Shared by the GPU tests: skip (exit 77, meson's "skipped") where there is no
// usable CUDA device, and read the nvcc-built test images.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../status_print.h"
#include "worker/backends/cuda/cuda_backend.h"

namespace ordo::test {

inline void skip_without_gpu() {
  const cuda::Probe p = cuda::probe();
  if (p.usable()) return;
  if (p.error != 0)
    std::printf("no CUDA device (cudaGetDeviceCount returned %d): skipping\n", p.error);
  else
    std::printf("no CUDA device (cudaGetDeviceCount found none): skipping\n");
  std::fflush(stdout);
  std::exit(77);
}

// The file named by environment variable `var` (set by meson test), whole.
inline std::vector<std::byte> read_image(const char* var) {
  const char* path = std::getenv(var);
  if (!path) {
    std::fprintf(stderr, "%s is not set: run the tests through meson test\n", var);
    std::exit(1);
  }
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  if (bytes.empty()) {
    std::fprintf(stderr, "%s: cannot read %s\n", var, path);
    std::exit(1);
  }
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace ordo::test
