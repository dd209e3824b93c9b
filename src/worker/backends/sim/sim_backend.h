// The sim backend as the worker makes it (src/worker/backend.cc) and the
// worker's --sim-kernels option loads kernels into it. The kernel API is
// ordo/sim.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ordo/sim.h"
#include "worker/backend.h"

namespace ordo::sim {

// `devices` simulated devices (1..kMaxDevices), each with its own address
// range: a kernel given another device's pointer faults unless peer access
// from its device to that one is enabled.
std::unique_ptr<Backend> make_sim_backend(uint32_t devices = 1);

// Loads a kernel plugin: a shared object exporting
//   extern "C" void ordo_sim_register(void (*reg)(const char* name, ordo::sim::Kernel fn));
// which calls reg once per kernel, named like the device kernel it stands in
// for (the mangled name, e.g. "_Z3addPii"). Returns false with a message.
bool load_kernel_plugin(const std::string& path, std::string* error);

// Registers the built-in kernels (sim_kernels.cc; their argument structs are in
// ordo/sim.h). Idempotent.
void register_builtin_kernels();

}  // namespace ordo::sim
