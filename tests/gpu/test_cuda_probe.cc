// The cuda backend's paths that need no GPU: how the worker picks and refuses
// backends with and without a device, and the module-image checks against real
// nvcc output and forged headers. Runs everywhere; where a device is present it
// checks the other branch of each choice.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu.h"
#include "ordo/doorbell.h"
#include "worker/backend.h"
#include "worker/backends/cuda/cuda_backend.h"

namespace ordo::test {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct WorkerRun {
  int status = -1;  // exit code, or -signal
  std::string err;  // stderr
};

// Runs ordo-worker with `args`; with `ready` it waits for the ready file, then
// stops the worker with SIGTERM.
WorkerRun run_worker(std::vector<std::string> args, const std::string& ready = "") {
  const char* exe = std::getenv("ORDO_WORKER");
  if (!exe) throw std::runtime_error("ORDO_WORKER is not set: run the tests through meson test");
  const std::string log = "/dev/shm/ordo-probe-" + std::to_string(getpid()) + ".log";
  args.insert(args.begin(), exe);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe, argv.data());
    _exit(127);
  }
  int st = 0;
  if (!ready.empty()) {
    for (int i = 0; i < 1000 && access(ready.c_str(), F_OK) != 0; ++i) {
      if (waitpid(pid, &st, WNOHANG) == pid) goto done;
      usleep(5000);
    }
    kill(pid, SIGTERM);
  }
  waitpid(pid, &st, 0);
done:
  WorkerRun r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  r.err = slurp(log);
  unlink(log.c_str());
  return r;
}

std::string region_path(const char* tag) { return "/dev/shm/ordo-probe-" + std::to_string(getpid()) + "-" + tag; }

TEST(CudaProbe, CudaBackendIsRefusedWithAClearMessageWithoutADevice) {
  const cuda::Probe p = cuda::probe();
  std::string err;
  auto b = make_backend("cuda", &err);
  if (p.usable()) {
    ASSERT_TRUE(b) << err;
    EXPECT_EQ(b->name(), "cuda");
    return;
  }
  EXPECT_FALSE(b);
  EXPECT_EQ(err, p.why_not() + "; use --backend sim");
  if (p.error != 0) {
    // CI: the toolkit is there, the driver is not.
    EXPECT_EQ(err, "no CUDA device (cudaGetDeviceCount: " + p.error_name + " (" + std::to_string(p.error) +
                       ")); use --backend sim");
    EXPECT_EQ(p.count, 0);
  }
}

TEST(CudaProbe, WithoutADriverTheErrorIsInsufficientDriver) {
  if (access("/proc/driver/nvidia/version", F_OK) == 0) GTEST_SKIP() << "an NVIDIA driver is loaded here";
  const cuda::Probe p = cuda::probe();
  EXPECT_FALSE(p.usable());
  // 35 where no libcuda.so.1 can be loaded; 34 (stub library) if only the toolkit's stub is on the library path.
  EXPECT_TRUE(p.error == 35 || p.error == 34) << p.error << " " << p.error_name;
  EXPECT_NE(p.why_not().find("(" + std::to_string(p.error) + ")"), std::string::npos) << p.why_not();
}

TEST(CudaProbe, AutoPicksCudaWithADeviceAndSimWithout) {
  std::string err;
  auto b = make_backend("auto", &err);
  ASSERT_TRUE(b) << err;
  EXPECT_EQ(b->name(), cuda::probe().usable() ? "cuda" : "sim");
}

TEST(CudaProbe, UnknownBackendNamesTheChoices) {
  std::string err;
  EXPECT_FALSE(make_backend("gpu", &err));
  EXPECT_NE(err.find("choose auto, sim, null or cuda"), std::string::npos) << err;
}

TEST(CudaProbe, WorkerWithBackendCudaExitsWithTheReasonWithoutADevice) {
  if (cuda::probe().usable()) GTEST_SKIP() << "a CUDA device is present";
  const std::string region = region_path("cuda");
  const WorkerRun r = run_worker({"--region", region, "--backend", "cuda"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "ordo-worker: " + cuda::probe().why_not() + "; use --backend sim\n");
  EXPECT_NE(access(region.c_str(), F_OK), 0) << "the worker created its region before refusing the backend";
  unlink(region.c_str());
}

TEST(CudaProbe, WorkerDefaultsToAutoAndSaysWhichBackendItPicked) {
  const std::string region = region_path("auto"), ready = region + ".ready";
  const WorkerRun r = run_worker({"--region", region, "--ready-file", ready}, ready);
  unlink(region.c_str());
  unlink(doorbell_path(region).c_str());
  unlink(ready.c_str());
  EXPECT_EQ(r.status, 0) << r.err;
  if (cuda::probe().usable()) {
    EXPECT_NE(r.err.find("backend auto:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("using cuda"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("backend cuda)"), std::string::npos) << r.err;
  } else {
    EXPECT_NE(r.err.find("ordo-worker: backend auto: " + cuda::probe().why_not() + "; using sim\n"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("backend sim)"), std::string::npos) << r.err;
  }
}

// ---------------------------------------------------------------- module images

std::vector<std::byte> image(const char* var) { return read_image(var); }

template <class T>
void poke(std::vector<std::byte>& v, size_t off, T value) {
  ASSERT_LE(off + sizeof value, v.size());
  std::memcpy(v.data() + off, &value, sizeof value);
}

template <class T>
T peek(const std::vector<std::byte>& v, size_t off) {
  T t;
  std::memcpy(&t, v.data() + off, sizeof t);
  return t;
}

TEST(ModuleImage, NvccOutputPasses) {
  std::string why;
  for (const char* var : {"ORDO_TEST_FATBIN", "ORDO_TEST_FATBIN_COMPRESSED", "ORDO_TEST_CUBIN", "ORDO_TEST_PTX"}) {
    const auto img = image(var);
    EXPECT_TRUE(cuda::check_module_image(img, &why)) << var << ": " << why;
  }
  const auto builtins = cuda::builtin_image();
  ASSERT_GE(builtins.size(), 16u);
  EXPECT_EQ(std::memcmp(builtins.data(), "\x50\xed\x55\xba", 4), 0) << "the built-in kernels are not a fatbin";
  EXPECT_TRUE(cuda::check_module_image(builtins, &why)) << why;
}

TEST(ModuleImage, TruncatedFatbinIsRejected) {
  auto img = image("ORDO_TEST_FATBIN");
  std::string why;
  for (size_t n : {size_t{4}, size_t{15}, size_t{16}, img.size() / 2, img.size() - 1}) {
    std::vector<std::byte> cut(img.begin(), img.begin() + n);
    EXPECT_FALSE(cuda::check_module_image(cut, &why)) << "cut at " << n;
  }
}

TEST(ModuleImage, ForgedFatbinSizesAreRejected) {
  const auto good = image("ORDO_TEST_FATBIN");
  std::string why;
  auto img = good;
  poke<uint64_t>(img, 8, ~uint64_t{0});  // total size
  EXPECT_FALSE(cuda::check_module_image(img, &why));
  img = good;
  poke<uint16_t>(img, 6, 8);  // header smaller than itself
  EXPECT_FALSE(cuda::check_module_image(img, &why));
  img = good;
  const uint16_t hdr = peek<uint16_t>(good, 6);
  poke<uint64_t>(img, hdr + 8, uint64_t{1} << 62);  // first entry's payload
  EXPECT_FALSE(cuda::check_module_image(img, &why)) << why;
  img = good;
  poke<uint32_t>(img, hdr + 4, 0xffffffffu);  // first entry's header
  EXPECT_FALSE(cuda::check_module_image(img, &why));
}

TEST(ModuleImage, ForgedCubinHeadersAreRejected) {
  const auto good = image("ORDO_TEST_CUBIN");
  std::string why;
  auto img = good;
  poke<uint64_t>(img, 0x28, good.size());  // section headers start at the end
  EXPECT_FALSE(cuda::check_module_image(img, &why));
  img = good;
  poke<uint16_t>(img, 0x3c, 0xffff);  // too many sections
  EXPECT_FALSE(cuda::check_module_image(img, &why));
  img = good;
  poke<uint64_t>(img, 0x20, ~uint64_t{0} - 8);  // program headers wrap around
  EXPECT_FALSE(cuda::check_module_image(img, &why));
  // One section whose contents run past the end.
  img = good;
  const uint64_t shoff = peek<uint64_t>(good, 0x28);
  const uint16_t shentsize = peek<uint16_t>(good, 0x3a), shnum = peek<uint16_t>(good, 0x3c);
  bool forged = false;
  for (uint16_t i = 1; i < shnum && !forged; ++i) {
    const size_t sh = shoff + size_t{i} * shentsize;
    if (peek<uint32_t>(good, sh + 4) == 8) continue;  // NOBITS: no bytes in the file
    poke<uint64_t>(img, sh + 0x20, good.size());
    forged = true;
  }
  ASSERT_TRUE(forged);
  EXPECT_FALSE(cuda::check_module_image(img, &why));
  EXPECT_FALSE(cuda::check_module_image(std::vector<std::byte>(good.begin(), good.begin() + 40), &why));
}

TEST(ModuleImage, FatbinEntryHeadersShorterThanTheDriverReadsAreRejected) {
  const auto good = image("ORDO_TEST_FATBIN");
  const uint16_t hdr = peek<uint16_t>(good, 6);
  ASSERT_GE(peek<uint32_t>(good, hdr + 4), 64u);
  std::string why;
  // A 16-byte entry header whose payload still ends where the real entry did:
  // the sizes add up, but the driver would read 48 bytes of payload as header.
  auto img = good;
  const uint64_t payload = peek<uint64_t>(good, hdr + 8) + peek<uint32_t>(good, hdr + 4) - 16;
  poke<uint32_t>(img, hdr + 4, 16);
  poke<uint64_t>(img, hdr + 8, payload);
  EXPECT_FALSE(cuda::check_module_image(img, &why));
  EXPECT_NE(why.find("smaller than 64"), std::string::npos) << why;
  // A compressed size beyond the entry's payload.
  img = good;
  poke<uint32_t>(img, hdr + 16, uint32_t(peek<uint64_t>(good, hdr + 8) + 1));
  EXPECT_FALSE(cuda::check_module_image(img, &why));
  // A container whose last entry has fewer than 64 header bytes left.
  img = good;
  poke<uint64_t>(img, 8, 40);
  EXPECT_FALSE(cuda::check_module_image(img, &why));
}

std::vector<std::byte> bytes(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

TEST(ModuleImage, FatbinWrapperIsRejected) {
  // __fatBinC_Wrapper_t: magic, version, then a pointer the driver would follow.
  std::vector<std::byte> img(24);
  poke<uint32_t>(img, 0, 0x466243b1u);
  poke<uint32_t>(img, 4, 1);
  poke<uint64_t>(img, 8, 0x7f0000001000u);
  std::string why;
  EXPECT_FALSE(cuda::check_module_image(img, &why));
  EXPECT_NE(why.find("wrapper"), std::string::npos) << why;
}

TEST(ModuleImage, OnlyPtxTextPassesAsText) {
  std::string why;
  const std::string ptx = ".version 8.0\n.target sm_90\n.address_size 64\n\t// a comment\r\n";
  EXPECT_TRUE(cuda::check_module_image(bytes(ptx), &why)) << why;
  EXPECT_TRUE(cuda::check_module_image(bytes(ptx + '\0'), &why)) << why;  // NUL-terminated
  EXPECT_FALSE(cuda::check_module_image(bytes(std::string_view(".version 8.0\0.target sm_90\n", 27)), &why));
  EXPECT_FALSE(cuda::check_module_image(bytes(ptx + "\x01\x02"), &why));
  EXPECT_FALSE(cuda::check_module_image(bytes(ptx + "\xb1"), &why));
  EXPECT_FALSE(cuda::check_module_image(bytes(std::string(1, '\0')), &why));
  // Bytes that are none of the three formats.
  std::vector<std::byte> junk(4096);
  uint32_t x = 12345;
  for (auto& b : junk) b = std::byte((x = x * 1103515245u + 12345u) >> 24);
  EXPECT_FALSE(cuda::check_module_image(junk, &why));
  // A 32-bit ELF is not a cubin.
  auto elf32 = image("ORDO_TEST_CUBIN");
  elf32[4] = std::byte{1};
  EXPECT_FALSE(cuda::check_module_image(elf32, &why));
}

// Kernel ids are a HandleTable: tests/test_handle_table.cc.

}  // namespace
}  // namespace ordo::test
