// Modules and libraries: images (fatbins, cubins, PTX) shipped to the worker
// once per content, their functions and kernels, and their device variables.
#include "module.h"

#include "transport/module_image.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace ordo::driver {
namespace {

// An image as the worker holds it, shared by every module loaded from the same
// bytes: it goes to the worker once, and its device variables have one address
// per device.
struct Image {
  uint32_t id = 0;  // the worker's module id
  int refs = 0;
  using Globals = std::map<std::string, std::pair<uint64_t, uint64_t>, std::less<>>;  // name -> (addr, size)
  std::map<CUdevice, Globals> globals;  // resolved, by device
};

// Handles are checked on every launch: hash lookups under a shared lock.
struct Modules {
  std::shared_mutex mu;
  std::unordered_map<const void*, std::unique_ptr<Module>> live;
  std::unordered_set<const void*> functions;  // every function of a live module handed out
  std::unordered_map<uint64_t, Image> images;  // content hash -> image; guarded by load_mu
  std::mutex load_mu;  // loads, unloads and variable lookups one at a time: an image is shipped once
};
Modules& modules() {
  static auto* m = new Modules;
  return *m;
}

}  // namespace

Module* module_of(const void* h) {
  Modules& m = modules();
  std::shared_lock lock(m.mu);
  auto it = m.live.find(h);
  return it == m.live.end() ? nullptr : it->second.get();
}

Function* function_of(const void* h) {
  Modules& m = modules();
  std::shared_lock lock(m.mu);
  return m.functions.count(h) ? static_cast<Function*>(const_cast<void*>(h)) : nullptr;
}

namespace {

// What an image pointer points at: an nvcc fatbinC wrapper, a fatbin, an ELF
// cubin or PTX text. Returns the image proper and its size.
CUresult size_image(const void* image, const std::byte** data, uint64_t* size, image::Format* kind) {
  if (!image) return CUDA_ERROR_INVALID_VALUE;
  uint32_t magic;
  std::memcpy(&magic, image, 4);
  if (magic == kFatbinWrapperMagic) {
    struct Wrapper {
      int magic, version;
      const void* data;
      void* filename_or_fatbins;
    } w;
    std::memcpy(&w, image, sizeof w);
    return size_image(w.data, data, size, kind);
  }
  *data = static_cast<const std::byte*>(image);
  if (magic == kFatbinMagic) {
    *kind = image::Format::kFatbin;
    *size = fatbin_size(image);
  } else if (magic == image::kElfMagic) {
    *kind = image::Format::kElf;
    *size = image::elf_extent(*data);
  } else {
    *kind = image::Format::kPtx;  // NUL-terminated
    *size = std::strlen(static_cast<const char*>(image)) + 1;
    // Anything else is no module: PTX states its version first (after comments).
    const std::string_view text(static_cast<const char*>(image), *size - 1);
    if (text.find(".version") == std::string_view::npos) return CUDA_ERROR_INVALID_IMAGE;
  }
  return *size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE;
}

uint64_t hash_image(const std::byte* p, uint64_t n) {
  uint64_t h = 1469598103934665603ull ^ n;  // FNV-1a
  for (uint64_t i = 0; i < n; ++i) h = (h ^ uint64_t(p[i])) * 1099511628211ull;
  return h;
}

CUresult load_module(const void* image, Module** out) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  const std::byte* data;
  uint64_t size;
  image::Format kind;
  if (CUresult e = size_image(image, &data, &size, &kind); e != CUDA_SUCCESS) return e;
  auto m = std::make_unique<Module>();
  const std::span<const std::byte> bytes(data, size);
  bool parsed = kind == image::Format::kFatbin ? parse_fatbin(bytes, &m->layouts, &m->parse_error, &m->global_sizes)
              : kind == image::Format::kElf ? parse_cubin(bytes, &m->layouts, &m->parse_error, &m->global_sizes)
                          : parse_ptx({reinterpret_cast<const char*>(data), size - 1}, &m->layouts,
                                                    &m->parse_error, &m->global_sizes);
  (void)parsed;  // kernels without a layout fail when fetched, naming themselves
  m->key = hash_image(data, size);
  m->device = this_device();
  Modules& ms = modules();
  std::lock_guard load(ms.load_mu);
  Image* img = nullptr;
  if (auto it = ms.images.find(m->key); it != ms.images.end()) img = &it->second;
  if (!img) {
    uint32_t id = 0;
    const Status s = c->module_load(data, size, &id);
    if (!ok(s)) {
      // Images go in pieces of the heap: this is a heap with no room left for
      // even a small piece, or a worker out of memory or module ids.
      if (s == Status::kMemoryAllocation)
        std::fprintf(stderr,
                     "ordo: no room to load a %llu-byte module image: the region's pinned heap is full, or the worker "
                     "holds %u modules or is out of memory\n",
                     (unsigned long long)size, unsigned(ordo::kMaxModules));
      return to_cu(s);
    }
    img = &ms.images[m->key];
    img->id = id;
  }
  ++img->refs;
  m->id = img->id;
  std::unique_lock lock(ms.mu);
  Module* raw = m.get();
  ms.live.emplace(raw, std::move(m));
  *out = raw;
  return CUDA_SUCCESS;
}

CUresult unload_module(Module* m) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  Modules& ms = modules();
  std::lock_guard load(ms.load_mu);
  uint32_t drop = 0;
  {
    std::unique_lock lock(ms.mu);
    auto it = ms.live.find(m);
    if (it == ms.live.end()) return CUDA_ERROR_INVALID_HANDLE;
    // Its functions' handles now fail the check instead of reaching freed memory.
    for (auto& [n, f] : m->functions) ms.functions.erase(f.get());
    auto img = ms.images.find(m->key);
    if (img != ms.images.end() && --img->second.refs == 0) {
      drop = img->second.id;
      for (auto& [dev, globals] : img->second.globals)
        for (auto& [n, g] : globals) device_allocs().erase(g.first);
      ms.images.erase(img);
    }
    ms.live.erase(it);  // m is gone from here on
  }
  return drop ? to_cu(c->module_unload(drop)) : CUDA_SUCCESS;
}

// Names travel in a reply slot's payload: a longer one is a limit of ordo's, said as such.
CUresult check_name_fits(const char* name, const char* what) {
  const size_t n = std::strlen(name);
  if (n < ordo::kSlotPayload) return CUDA_SUCCESS;
  std::fprintf(stderr, "ordo: the %s name %.60s... is %zu bytes; ordo passes names of up to %zu bytes\n", what, name,
               n, ordo::kSlotPayload - 1);
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult get_function(Module* m, const char* name, Function** out) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!m || !name || !out) return !m ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = check_name_fits(name, "kernel"); e != CUDA_SUCCESS) return e;
  std::lock_guard lock(m->mu);
  if (auto it = m->functions.find(std::string_view(name)); it != m->functions.end()) {
    *out = it->second.get();
    return CUDA_SUCCESS;
  }
  auto f = std::make_unique<Function>();
  f->module = m;
  f->name = name;
  if (auto it = m->layouts.find(f->name); it != m->layouts.end()) f->layout = &it->second;
  // Every kernel of a readable image has a layout (cubins: a .nv.info.<kernel>
  // section each, parameterless ones too; PTX: its .entry): a name without one
  // is not in the module, whatever a backend without the image would say.
  else if (m->parse_error.empty() && !m->layouts.empty()) return CUDA_ERROR_NOT_FOUND;
  const Status s = c->kernel_lookup(m->id, f->name, &f->id);
  if (!ok(s)) return to_cu(s);
  Function* raw = f.get();
  m->functions.emplace(f->name, std::move(f));
  Modules& ms = modules();
  std::unique_lock lk(ms.mu);
  ms.functions.insert(raw);
  *out = raw;
  return CUDA_SUCCESS;
}

// The kernels of `m`: those its image declares (a layout each, cubin or PTX),
// in name order. ordo knows a module's kernels only by reading its image.
CUresult kernel_count(Module* m, unsigned* count) {
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  if (m->layouts.empty() && !m->parse_error.empty()) {
    std::fprintf(stderr, "ordo: cannot list the kernels of a module: %s\n", m->parse_error.c_str());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  *count = unsigned(std::min<size_t>(m->layouts.size(), ~0u));
  return CUDA_SUCCESS;
}

// The first `max` of them as functions, as cuModuleGetFunction gives each.
CUresult enumerate_kernels(Module* m, Function** out, unsigned max) {
  unsigned n = 0;
  if (CUresult e = kernel_count(m, &n); e != CUDA_SUCCESS) return e;
  if (!out && max) return CUDA_ERROR_INVALID_VALUE;
  auto it = m->layouts.begin();  // read-only once loaded
  for (unsigned i = 0; i < std::min(n, max); ++i, ++it)
    if (CUresult e = get_function(m, it->first.c_str(), &out[i]); e != CUDA_SUCCESS) return e;
  return CUDA_SUCCESS;
}

// Device variable `name` of `m` as device `dev` has it.
CUresult get_global(Module* m, const char* name, CUdeviceptr* addr, size_t* size, CUdevice dev) {
  ordo::Client* c = nullptr;
  if (CUresult e = enter(&c); e != CUDA_SUCCESS) return e;
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = check_name_fits(name, "device variable"); e != CUDA_SUCCESS) return e;
  Modules& ms = modules();
  std::lock_guard load(ms.load_mu);  // keeps the image loaded while its variable is resolved
  Image::Globals& globals = ms.images.at(m->key).globals[dev];
  auto it = globals.find(std::string_view(name));
  if (it == globals.end()) {
    auto sz = m->global_sizes.find(std::string_view(name));
    const uint64_t hint = sz == m->global_sizes.end() ? 0 : sz->second;
    uint64_t a = 0, n = 0;
    const Status s = on_device(c, dev, [&] { return c->module_global(m->id, name, hint, &a, &n); });
    if (!ok(s)) return to_cu(s);
    device_allocs().add(a, n, dev);  // cuMemcpy with unified addressing sees it as device memory
    it = globals.emplace(name, std::make_pair(a, n)).first;
  }
  if (addr) *addr = it->second.first;
  if (size) *size = it->second.second;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  *mode = CU_MODULE_LAZY_LOADING;  // images are shipped when the program first asks for them
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule* out, const void* image) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Module* m = nullptr;
  if (CUresult e = load_module(image, &m); e != CUDA_SUCCESS) return e;
  *out = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* out, const void* image, unsigned int, CUjit_option*, void**) {
  return cuModuleLoadData(out, image);  // JIT options concern PTX compilation, done on the host
}

CUresult CUDAAPI cuModuleUnload(CUmodule m) {
  Module* mod = module_of(m);
  if (!mod) return CUDA_ERROR_INVALID_HANDLE;
  return unload_module(mod);
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* out, CUmodule m, const char* name) {
  Function* f = nullptr;
  if (CUresult e = get_function(module_of(m), name, &f); e != CUDA_SUCCESS) return e;
  *out = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int* count, CUmodule m) { return kernel_count(module_of(m), count); }
CUresult CUDAAPI cuModuleEnumerateFunctions(CUfunction* functions, unsigned int max, CUmodule m) {
  return enumerate_kernels(module_of(m), reinterpret_cast<Function**>(functions), max);
}
CUresult CUDAAPI cuLibraryGetKernelCount(unsigned int* count, CUlibrary lib) {
  return kernel_count(module_of(lib), count);
}
CUresult CUDAAPI cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int max, CUlibrary lib) {
  return enumerate_kernels(module_of(lib), reinterpret_cast<Function**>(kernels), max);
}

CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr* addr, size_t* size, CUmodule m, const char* name) {
  Module* mod = module_of(m);
  return get_global(mod, name, addr, size, mod ? mod->device : 0);
}
CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr* addr, size_t* size, CUlibrary lib, const char* name) {
  return get_global(module_of(lib), name, addr, size, this_device());  // a library serves every context
}

CUresult CUDAAPI cuLibraryLoadData(CUlibrary* out, const void* image, CUjit_option*, void**, unsigned int,
                                   CUlibraryOption*, void**, unsigned int) {
  // Options: JIT options (host-side) and CU_LIBRARY_BINARY_IS_PRESERVED (the
  // image is copied to the worker at once either way).
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Module* m = nullptr;
  if (CUresult e = load_module(image, &m); e != CUDA_SUCCESS) return e;
  *out = reinterpret_cast<CUlibrary>(m);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary lib) {
  Module* m = module_of(lib);
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  return unload_module(m);
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel* out, CUlibrary lib, const char* name) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Function* f = nullptr;
  if (CUresult e = get_function(module_of(lib), name, &f); e != CUDA_SUCCESS) return e;
  *out = reinterpret_cast<CUkernel>(f);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLibraryGetModule(CUmodule* out, CUlibrary lib) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Module* m = module_of(lib);
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelGetFunction(CUfunction* out, CUkernel k) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (!function_of(k)) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUfunction>(k);  // kernel ids serve every device: a kernel is its function everywhere
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelGetLibrary(CUlibrary* out, CUkernel k) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(k);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUlibrary>(f->module);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetModule(CUmodule* out, CUfunction fn) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUmodule>(f->module);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction fn) {
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  *name = f->name.c_str();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel k) {
  return cuFuncGetName(name, reinterpret_cast<CUfunction>(k));
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction fn, size_t index, size_t* offset, size_t* size) {
  Function* f = function_of(fn);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (!f->layout) return CUDA_ERROR_INVALID_IMAGE;
  if (index >= f->layout->params.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset) *offset = f->layout->params[index].offset;
  if (size) *size = f->layout->params[index].size;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuKernelGetParamInfo(CUkernel k, size_t index, size_t* offset, size_t* size) {
  return cuFuncGetParamInfo(reinterpret_cast<CUfunction>(k), index, offset, size);
}

}  // extern "C"
