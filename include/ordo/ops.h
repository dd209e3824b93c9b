// The operation table (ops.def) as C++: an enum and a constexpr array of roles.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ordo {

enum class Path : uint8_t { Ring, Slot };
enum class Order : uint8_t { None, Stream, EventWrite, EventRead };

enum class Op : uint16_t {
#define ORDO_OP(name, path, order, args) name,
#include "ordo/ops.def"
#undef ORDO_OP
  kCount
};

struct OpInfo {
  std::string_view name;
  Path path;
  Order order;
  std::string_view args;
};

inline constexpr std::array<OpInfo, static_cast<size_t>(Op::kCount)> kOps = {{
#define ORDO_OP(name, path, order, args) {#name, Path::path, Order::order, args},
#include "ordo/ops.def"
#undef ORDO_OP
}};

constexpr size_t kOpCount = static_cast<size_t>(Op::kCount);

constexpr const OpInfo& info(Op op) { return kOps[static_cast<size_t>(op)]; }

// The tokens only for ops of one path, for code generated per op: a switch
// over ops that names each op (no `default:`, so that a new op fails to build
// until every such switch handles it), or a declaration per op:
//   #define ORDO_OP(name, path, order, args) case Op::name: ORDO_IF(Ring, path, return op_##name(c);) ORDO_IF(Slot, path, break;)
#define ORDO_IF(want, path, ...) ORDO_IF_##want##_##path(__VA_ARGS__)
#define ORDO_IF_Ring_Ring(...) __VA_ARGS__
#define ORDO_IF_Ring_Slot(...)
#define ORDO_IF_Slot_Ring(...)
#define ORDO_IF_Slot_Slot(...) __VA_ARGS__

// Entries arrive from hostile memory as a raw uint16_t; this is the only way in.
constexpr bool valid_op(uint16_t raw) { return raw < kOpCount; }

}  // namespace ordo
