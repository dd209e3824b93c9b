// Images built byte by byte for the module-image reader's tests
// (test_module_image.cc, test_module_image_elf.cc, test_kernel_resources.cc):
// fields put at an offset, text as bytes, and the validator's answer as a
// string ("ok" or the text the cuda backend logs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/module_image.h"

namespace ordo::image {

using Bytes = std::vector<std::byte>;

template <class T>
void put(Bytes& v, size_t off, T value) {
  if (v.size() < off + sizeof value) v.resize(off + sizeof value);
  std::memcpy(v.data() + off, &value, sizeof value);
}

template <class T>
T get(const Bytes& v, size_t off) {
  T t;
  std::memcpy(&t, v.data() + off, sizeof t);
  return t;
}

inline Bytes bytes(std::string_view s) {
  Bytes v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

inline std::string validate(const Bytes& img) {
  std::string why;
  return validate_module_image(img, &why) ? "ok" : why;
}

inline std::string text(std::span<const std::byte> s) { return {reinterpret_cast<const char*>(s.data()), s.size()}; }

}  // namespace ordo::image
