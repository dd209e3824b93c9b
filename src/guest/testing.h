// What tests look at inside a Client: not the guest API, and not installed.
#pragma once

#include <cstdint>

#include "ordo/client.h"
#include "ordo/region.h"

namespace ordo::guest {

// The ring `s` is on; kNoRing if `s` is not a live stream.
uint32_t ring_of_stream(Client& c, Stream s);
// The position the calling thread's last entry (its call's own, not a fence) got.
uint64_t last_position(Client& c);
Region& region_of(Client& c);

}  // namespace ordo::guest
