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

// The case labels of every op of one path, for a switch over ops that names
// each op (no `default:`, so that a new op fails to compile until every such
// switch handles it):
//   #define ORDO_OP(name, path, order, args) ORDO_CASE_IF(Slot, path, name)
//   #include "ordo/ops.def"
//   #undef ORDO_OP
//     return Status::kNotSupported;  // every sync op: not on a ring
#define ORDO_CASE_IF(want, path, name) ORDO_CASE_IF_##want##_##path(name)
#define ORDO_CASE_IF_Ring_Ring(name) case ::ordo::Op::name:
#define ORDO_CASE_IF_Ring_Slot(name)
#define ORDO_CASE_IF_Slot_Ring(name)
#define ORDO_CASE_IF_Slot_Slot(name) case ::ordo::Op::name:

// The tokens only for ops of one path, for code generated per op:
//   #define ORDO_OP(name, path, order, args) ORDO_IF(Ring, path, Status op_##name(const RingCall&);)
#define ORDO_IF(want, path, ...) ORDO_IF_##want##_##path(__VA_ARGS__)
#define ORDO_IF_Ring_Ring(...) __VA_ARGS__
#define ORDO_IF_Ring_Slot(...)
#define ORDO_IF_Slot_Ring(...)
#define ORDO_IF_Slot_Slot(...) __VA_ARGS__

// Entries arrive from hostile memory as a raw uint16_t; this is the only way in.
constexpr bool valid_op(uint16_t raw) { return raw < kOpCount; }

}  // namespace ordo
