// User objects: a pointer and its destructor, reference-counted by the
// program and by the graphs and execs that hold it, destroyed after the last
// reference goes (for an exec: once its launches ran).
#include "graph.h"

#include <atomic>
#include <mutex>
#include <unordered_set>

namespace ordo::driver {

struct UserObject {
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  std::atomic<uint64_t> refs{0};
};

namespace {

std::mutex& objects_mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_set<UserObject*>& objects() {  // live ones: a handle is checked before use
  static auto* s = new std::unordered_set<UserObject*>;
  return *s;
}

UserObject* live_object(CUuserObject h) {
  auto* o = reinterpret_cast<UserObject*>(h);
  std::lock_guard lock(objects_mu());
  return objects().count(o) ? o : nullptr;
}

}  // namespace

void retain_user_object(UserObject* o, unsigned count) { o->refs.fetch_add(count, std::memory_order_relaxed); }

void release_user_object(UserObject* o, unsigned count) {
  if (o->refs.fetch_sub(count, std::memory_order_acq_rel) != count) return;
  {
    std::lock_guard lock(objects_mu());
    objects().erase(o);
  }
  o->destroy(o->ptr);
  delete o;
}

Graph::~Graph() {
  for (auto [o, n] : user_objects) release_user_object(o, n);
}

}  // namespace ordo::driver

using namespace ordo::driver;  // NOLINT: these files are the API's implementation

extern "C" {

CUresult CUDAAPI cuUserObjectCreate(CUuserObject* out, void* ptr, CUhostFn destroy, unsigned int initial,
                                    unsigned int flags) {
  // CUDA requires the flag: the destructor is not synchronized with any CUDA handle.
  if (!out || !destroy || initial == 0 || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult e = enter(); e != CUDA_SUCCESS) return e;
  auto* o = new UserObject;
  o->ptr = ptr;
  o->destroy = destroy;
  o->refs.store(initial);
  std::lock_guard lock(objects_mu());
  objects().insert(o);
  *out = reinterpret_cast<CUuserObject>(o);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuUserObjectRetain(CUuserObject h, unsigned int count) {
  UserObject* o = live_object(h);
  if (!o || count == 0) return CUDA_ERROR_INVALID_VALUE;
  retain_user_object(o, count);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuUserObjectRelease(CUuserObject h, unsigned int count) {
  UserObject* o = live_object(h);
  if (!o || count == 0) return CUDA_ERROR_INVALID_VALUE;
  release_user_object(o, count);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphRetainUserObject(CUgraph hg, CUuserObject h, unsigned int count, unsigned int flags) {
  UserObject* o = live_object(h);
  if (!o || count == 0 || (flags & ~unsigned(CU_GRAPH_USER_OBJECT_MOVE))) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mutex());
  auto* g = reinterpret_cast<Graph*>(hg);
  if (!live_graph(g)) return CUDA_ERROR_INVALID_VALUE;
  if (!(flags & CU_GRAPH_USER_OBJECT_MOVE)) retain_user_object(o, count);  // else the caller's move to the graph
  g->user_objects[o] += count;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphReleaseUserObject(CUgraph hg, CUuserObject h, unsigned int count) {
  UserObject* o = live_object(h);
  if (!o || count == 0) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard lock(graph_mutex());
    auto* g = reinterpret_cast<Graph*>(hg);
    if (!live_graph(g)) return CUDA_ERROR_INVALID_VALUE;
    auto it = g->user_objects.find(o);
    if (it == g->user_objects.end() || it->second < count) return CUDA_ERROR_INVALID_VALUE;
    if ((it->second -= count) == 0) g->user_objects.erase(it);
  }
  release_user_object(o, count);
  return CUDA_SUCCESS;
}

}  // extern "C"
