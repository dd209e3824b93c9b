// gtest prints a Status by name and number instead of as raw bytes (it finds
// PrintTo by argument-dependent lookup).
#pragma once

#include <cstdint>
#include <ostream>

#include "ordo/status.h"

namespace ordo {
inline void PrintTo(Status s, std::ostream* os) { *os << status_name(s) << " (" << int32_t(s) << ")"; }
}  // namespace ordo
