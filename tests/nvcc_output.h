// nvcc's output for the image-parsing tests: meson test names each file
// (fatbins, cubins, PTX built from tests/cuda) in an environment variable.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace ordo::test {

// The bytes of the file $env names; empty when it is unset.
inline std::vector<std::byte> load_nvcc_output(const char* env) {
  const char* path = std::getenv(env);
  if (!path) return {};
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());
  return out;
}

}  // namespace ordo::test

#define LOAD_OR_SKIP(var, env)                                \
  const std::vector<std::byte> var = ordo::test::load_nvcc_output(env); \
  if (var.empty()) GTEST_SKIP() << env << " is not set (no nvcc, or not run by meson test)"
