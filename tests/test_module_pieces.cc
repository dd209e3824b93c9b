// Module images larger than what one pinned-heap block may take (a quarter of
// the heap): the guest sends them in pieces (ModuleChunk) through one block,
// and the worker loads them as one image. A small region's heap, so that the
// images stay small; cuRAND's 29 MB module meets the same limit in 64 MiB.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "guest/kernels.h"
#include "harness.h"
#include "ordo/sim.h"
#include "worker/backends/null/null_backend.h"

namespace ordo::test {
namespace {

constexpr uint64_t kRegion = 4u << 20;

// The null backend, keeping every image it was handed.
class RecordingBackend final : public NullBackend {
 public:
  Status module_load(uint32_t id, std::span<const std::byte> image) override {
    std::lock_guard lock(mu_);
    images_[id].assign(image.begin(), image.end());
    return Status::kSuccess;
  }
  std::vector<std::byte> image(uint32_t id) {
    std::lock_guard lock(mu_);
    return images_[id];
  }

 private:
  std::mutex mu_;
  std::map<uint32_t, std::vector<std::byte>> images_;
};

// Bytes that differ with their position and `seed`, so a piece out of place shows.
std::vector<std::byte> pattern(uint64_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = std::byte(uint8_t(i * 131 + (i >> 11) * 7 + seed));
  return v;
}

uint64_t ops(InProcessWorker& w, Op op) { return w.worker().stats().ops[size_t(op)]; }

struct Recorded {
  RecordingBackend* backend = new RecordingBackend;
  InProcessWorker w{{}, kRegion, std::unique_ptr<Backend>(backend)};
  std::unique_ptr<Client> c = w.attach();
  uint64_t share() const { return c->layout().heap_size / guest::Kernels::kImageHeapShare; }
};

TEST(ModulePieces, ImageLargerThanThePinnedHeapArrivesIntactInPieces) {
  Recorded r;
  const uint64_t heap = r.c->layout().heap_size;
  const auto image = pattern(2 * heap + 12345, 1);
  const uint64_t chunks = ops(r.w, Op::ModuleChunk), loads = ops(r.w, Op::ModuleLoad);
  uint32_t m = 0;
  ASSERT_EQ(r.c->module_load(image.data(), image.size(), &m), Status::kSuccess);
  EXPECT_EQ(r.backend->image(m), image);
  // Pieces of a quarter of the heap: all but the last by ModuleChunk, the last with the load.
  const uint64_t pieces = (image.size() + r.share() - 1) / r.share();
  EXPECT_EQ(ops(r.w, Op::ModuleChunk) - chunks, pieces - 1);
  EXPECT_EQ(ops(r.w, Op::ModuleLoad) - loads, 1u);
  // The block went back: a second image of the same size loads too, and the heap is whole again.
  const auto second = pattern(image.size(), 2);
  ASSERT_EQ(r.c->module_load(second.data(), second.size(), &m), Status::kSuccess);
  EXPECT_EQ(r.backend->image(m), second);
  void* all = nullptr;
  ASSERT_EQ(r.c->malloc_host(&all, heap / 2), Status::kSuccess);
  EXPECT_EQ(r.c->free_host(all), Status::kSuccess);
}

TEST(ModulePieces, ImagesUpToAShareOfTheHeapTakeOneRequest) {
  Recorded r;
  for (uint64_t n : {uint64_t{1}, uint64_t{100000}, r.share()}) {
    const auto image = pattern(n, 3);
    const uint64_t chunks = ops(r.w, Op::ModuleChunk), loads = ops(r.w, Op::ModuleLoad);
    uint32_t m = 0;
    ASSERT_EQ(r.c->module_load(image.data(), image.size(), &m), Status::kSuccess) << n;
    EXPECT_EQ(r.backend->image(m), image) << n;
    EXPECT_EQ(ops(r.w, Op::ModuleChunk), chunks) << n;
    EXPECT_EQ(ops(r.w, Op::ModuleLoad) - loads, 1u) << n;
  }
  // One byte more: two pieces.
  const auto image = pattern(r.share() + 1, 4);
  const uint64_t chunks = ops(r.w, Op::ModuleChunk);
  uint32_t m = 0;
  ASSERT_EQ(r.c->module_load(image.data(), image.size(), &m), Status::kSuccess);
  EXPECT_EQ(r.backend->image(m), image);
  EXPECT_EQ(ops(r.w, Op::ModuleChunk) - chunks, 1u);
}

// A heap the program filled: pieces get smaller until one fits, and only a
// heap without room for the smallest piece fails the load.
TEST(ModulePieces, ABusyHeapTakesSmallerPieces) {
  Recorded r;
  const uint64_t heap = r.c->layout().heap_size;
  void* hog = nullptr;
  ASSERT_EQ(r.c->malloc_host(&hog, heap - (96u << 10)), Status::kSuccess);
  const auto image = pattern(r.share() / 2, 5);  // one request, were the heap free
  const uint64_t chunks = ops(r.w, Op::ModuleChunk);
  uint32_t m = 0;
  ASSERT_EQ(r.c->module_load(image.data(), image.size(), &m), Status::kSuccess);
  EXPECT_EQ(r.backend->image(m), image);
  EXPECT_GE(ops(r.w, Op::ModuleChunk) - chunks, image.size() / (96u << 10));
  // No room for 4 KiB: the load fails, and works again once the heap has room.
  std::vector<void*> more;
  for (void* p = nullptr; r.c->malloc_host(&p, 1024) == Status::kSuccess;) more.push_back(p);
  EXPECT_EQ(r.c->module_load(image.data(), image.size(), &m), Status::kMemoryAllocation);
  for (void* p : more) ASSERT_EQ(r.c->free_host(p), Status::kSuccess);
  ASSERT_EQ(r.c->free_host(hog), Status::kSuccess);
  ASSERT_EQ(r.c->module_load(image.data(), image.size(), &m), Status::kSuccess);
  EXPECT_EQ(r.backend->image(m), image);
}

// The worker keeps one image in pieces per session: the guest's threads take turns.
TEST(ModulePieces, ThreadsLoadingLargeImagesAtOnceEachGetTheirOwn) {
  Recorded r;
  constexpr uint32_t kThreads = 4;
  std::vector<std::vector<std::byte>> images;
  for (uint32_t t = 0; t < kThreads; ++t) images.push_back(pattern(r.share() * 3 + t * 1000, 10 + t));
  std::vector<uint32_t> ids(kThreads);
  std::vector<Status> got(kThreads);
  {
    std::vector<std::jthread> threads;
    for (uint32_t t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (int k = 0; k < 3 && (k == 0 || ok(got[t])); ++k)
          got[t] = r.c->module_load(images[t].data(), images[t].size(), &ids[t]);
      });
  }
  for (uint32_t t = 0; t < kThreads; ++t) {
    ASSERT_EQ(got[t], Status::kSuccess) << t;
    EXPECT_EQ(r.backend->image(ids[t]), images[t]) << t;
  }
}

// On the sim, whose module kernels are its registered kernels by name: a large
// image's module resolves them, and they run.
TEST(ModulePieces, KernelsOfALargeImageResolveAndRun) {
  InProcessWorker w({}, kRegion);
  auto c = w.attach();
  const auto image = pattern(3 * c->layout().heap_size, 6);
  uint32_t m = 0, k = 0;
  ASSERT_EQ(c->module_load(image.data(), image.size(), &m), Status::kSuccess);
  bool runnable = false;
  ASSERT_EQ(c->kernel_lookup(m, "ordo_fill_u32", &k, &runnable), Status::kSuccess);
  EXPECT_TRUE(runnable);
  constexpr uint64_t kCount = 1000;
  uint64_t d = 0;
  ASSERT_EQ(c->malloc(&d, kCount * 4), Status::kSuccess);
  const sim::FillU32Args args{d, kCount, 0xfeedf00d, 0};
  ASSERT_EQ(c->launch(k, {1}, {1}, &args, sizeof args, kLegacyStream), Status::kSuccess);
  std::vector<uint32_t> out(kCount);
  ASSERT_EQ(c->memcpy_d2h(out.data(), d, kCount * 4), Status::kSuccess);
  EXPECT_EQ(out, std::vector<uint32_t>(kCount, 0xfeedf00d));
  EXPECT_EQ(c->module_unload(m), Status::kSuccess);
  EXPECT_EQ(c->kernel_lookup(m, "ordo_fill_u32", &k), Status::kInvalidResourceHandle);
}

}  // namespace
}  // namespace ordo::test
