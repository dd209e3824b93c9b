// Exports between the guest processes of one region (cudaIpcGetMemHandle,
// cudaIpcGetEventHandle). Each process has a worker of its own, so an export
// must be found by another worker process: the table is host memory the
// region's workers share (a memfd the supervisor makes and its parts
// inherit), which no guest can map. A guest holds only a token: the cell, its
// generation and a secret drawn when the cell was filled. Another worker
// opens an export only when all three match, so a guest reaches only what a
// guest of its own region exported, and a forged token finds nothing.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "ordo/limits.h"
#include "ordo/status.h"
#include "worker/backend.h"

namespace ordo {

struct IpcToken {
  uint64_t word = 0;  // generation << 32 | cell
  uint64_t secret = 0;
};

struct IpcExport {
  IpcKind kind = IpcKind::kMemory;
  uint32_t device = 0;
  uint32_t partition = 0;  // the exporting session's
  uint64_t size = 0;       // memory: the allocation's
  IpcBlob blob{};          // what the exporting worker's backend said
};

class IpcTable {
 public:
  static constexpr uint32_t kCells = 4096;

  // A new table in a memfd, which `inherited` lets survive exec (the
  // supervisor's); or the one inherited as descriptor `fd`.
  static std::unique_ptr<IpcTable> create(std::string* err, bool inherited = false);
  static std::unique_ptr<IpcTable> attach(int fd, std::string* err);
  ~IpcTable();
  IpcTable(const IpcTable&) = delete;
  IpcTable& operator=(const IpcTable&) = delete;

  int fd() const { return fd_; }

  // Fills a free cell; kMemoryAllocation when every cell is in use.
  Status publish(const IpcExport& x, IpcToken* out);
  // The exporter takes its export back (a free, a destroy, its session's end).
  void revoke(const IpcToken& t, uint32_t partition);
  // Every export of `partition`: a part's worker starting again finds the
  // exports its previous process made.
  void revoke_all(uint32_t partition);
  // What `t` names, if it names a live export: kInvalidResourceHandle otherwise.
  Status find(const IpcToken& t, IpcExport* out) const;

 struct Cell;  // ipc_table.cc

 private:
  IpcTable(int fd, Cell* cells) : fd_(fd), cells_(cells) {}
  void clear(Cell& c);
  int fd_;
  Cell* cells_;
};

}  // namespace ordo
