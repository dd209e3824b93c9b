// The soft check the CUDA test programs share: a failed EXPECT is counted
// and printed, and the program goes on (main returns failures != 0).
#pragma once

#include <cstdio>

inline int failures = 0;

#define EXPECT(cond)                                              \
  do {                                                            \
    if (!(cond)) {                                                \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                 \
    }                                                             \
  } while (0)
