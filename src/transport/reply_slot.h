// A guest thread's reply slot (layout.h, ReplySlot), both ends: the caller
// writes a synchronous request and reads its reply; the server (the worker)
// takes the request, copied out once, and answers it.
//
// A request is numbered: the caller stores `request.seq` last (release), the
// server answers by storing the same number in `reply_seq` last. Only the
// slot's thread (or the holder of a leased slot) calls, so numbers only grow
// and one request is in flight per slot.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ordo/layout.h"
#include "ordo/status.h"

namespace ordo {

// The caller: writes a request and publishes it as number `seq`. `e.thread`
// and `e.stream` are not carried (SlotRequest: the slot is the thread).
inline void write_request(ReplySlot& s, const Entry& e, uint64_t seq) {
  s.request.op = e.op;
  s.request.flags = e.flags;
  s.request.edge_count = e.edge_count;
  for (unsigned k = 0; k < e.edge_count && k < kMaxEdges; ++k) s.edges[k] = e.edges[k];
  for (unsigned k = 0; k < 6; ++k) s.request.arg[k] = e.arg[k];
  // On a write-combined BAR mapping the release store alone does not order the
  // request's stores (and the payload's before them) before seq: the sfence does.
  _mm_sfence();
  s.request.seq.store(seq, std::memory_order_release);
}

// The caller, once reply_seq reached its request's number.
inline Status read_reply(const ReplySlot& s, uint64_t* r0, uint64_t* r1) {
  if (r0) *r0 = s.result[0];
  if (r1) *r1 = s.result[1];
  return Status(s.status);
}

// The server: takes slot `index`'s request if its number is not `taken`,
// copied out once into `out` (an Entry whose thread is the slot; validate only
// the copy) and its number into `seq`.
inline bool take_request(const ReplySlot& s, uint32_t index, uint64_t taken, Entry* out, uint64_t* seq) {
  *seq = s.request.seq.load(std::memory_order_acquire);
  if (*seq == taken) return false;
  struct {
    uint64_t seq;
    uint16_t op, flags;
    uint8_t edge_count, reserved[3];
    uint64_t arg[6];
  } req;
  static_assert(sizeof req == sizeof(SlotRequest) && offsetof(decltype(req), arg) == offsetof(SlotRequest, arg));
  std::memcpy(&req, &s.request, sizeof req);
  // Field by field: `*out = Entry{}` compiled to a `rep stos`, a third of the
  // worker's own cost of a null call.
  out->op = req.op;
  out->flags = req.flags;
  out->edge_count = req.edge_count;
  out->lap = 0;
  std::memset(out->reserved0, 0, sizeof out->reserved0);
  out->thread = index;
  out->stream = 0;
  if (req.edge_count) std::memcpy(out->edges, s.edges, sizeof out->edges);
  else std::memset(out->edges, 0, sizeof out->edges);
  std::memcpy(out->arg, req.arg, sizeof req.arg);
  return true;
}

// The server: answers request `seq`.
inline void write_reply(ReplySlot& s, uint64_t seq, Status st, uint64_t r0, uint64_t r1) {
  s.status = int32_t(st);
  s.result[0] = r0;
  s.result[1] = r1;
  s.reply_seq.store(seq, std::memory_order_release);
}

}  // namespace ordo
