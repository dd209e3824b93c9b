// main() of the tests that need a GPU: exit 77 (skipped), saying why, without one.
#include <gtest/gtest.h>

#include "gpu.h"

int main(int argc, char** argv) {
  ordo::test::skip_without_gpu();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
