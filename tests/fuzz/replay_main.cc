// Runs the fuzz target over a corpus directory without libFuzzer, so the
// corpus is replayed by `meson test` with any compiler.
#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  DIR* d = opendir(argv[1]);
  if (!d) {
    std::fprintf(stderr, "cannot open corpus %s\n", argv[1]);
    return 2;
  }
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string(argv[1]) + "/" + e->d_name, std::ios::binary);
    std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
    ++n;
  }
  closedir(d);
  std::printf("replayed %d corpus inputs without a crash\n", n);
  return n > 0 ? 0 : 1;
}
