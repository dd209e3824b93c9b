// ordo-worker --sim-kernels: host twins of a program's device kernels, so that
// CUDA programs run on the simulator (tests/cuda).
#include <dlfcn.h>

#include "sim_backend.h"

namespace ordo::sim {
namespace {

void register_from_plugin(const char* name, Kernel fn) {
  if (name && *name && fn) register_kernel(name, fn);
}

}  // namespace

bool load_kernel_plugin(const std::string& path, std::string* error) {
  // Never closed: its kernels stay registered for the worker's lifetime.
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    if (error) *error = std::string("cannot load kernel plugin: ") + dlerror();
    return false;
  }
  using Register = void (*)(void (*)(const char*, Kernel));
  auto reg = reinterpret_cast<Register>(dlsym(h, "ordo_sim_register"));
  if (!reg) {
    if (error) *error = "kernel plugin " + path + " does not export extern \"C\" ordo_sim_register";
    return false;
  }
  reg(register_from_plugin);
  return true;
}

}  // namespace ordo::sim
