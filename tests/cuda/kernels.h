// Parameter layouts of the kernels in basic.cu, seed.cu and peer.cu, shared by the
// programs (device side) and their simulator twins (twins.cc): a twin reads the
// packed parameter buffer as one of these structs (KernelContext::args<T>()).
#pragma once

#include <cstdint>

struct Pair {
  int a;
  char b;
  double c;
};

// fill(int* p, int n, int v), and add(int* p, int n, int v) of peer.cu
struct FillArgs {
  uint64_t p;
  int32_t n;
  int32_t v;
};
// saxpy(float a, const float* x, float* y, int n)
struct SaxpyArgs {
  float a;
  uint64_t x;
  uint64_t y;
  int32_t n;
};
// mixed(char c, double d, short s, Pair pair, long long* out): scalars of every
// alignment and a struct by value, each at its own offset.
struct MixedArgs {
  char c;
  double d;
  int16_t s;
  Pair pair;
  uint64_t out;
};
// slow_copy(const int* in, int* out, int n, unsigned sleep_us)
struct SlowCopyArgs {
  uint64_t in;
  uint64_t out;
  int32_t n;
  uint32_t sleep_us;
};
