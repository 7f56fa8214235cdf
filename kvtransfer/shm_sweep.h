// Removes the shared memory that KV pools of killed instances left behind.
//
// A KV pool over UCX lives in shared memory when UCX can give it (kvtransfer/ucx_transport.h
// UcxPool: SysV segments first, then POSIX files in /dev/shm). An instance that exits cleanly
// frees it; one that is killed (SIGKILL, OOM) cannot, and whatever UCX had not already marked
// for removal stays until reboot. So every pool allocation first sweeps (kvtransfer/factory.h):
// the next start of any instance on the machine removes what a dead one left.
//
// What counts as left behind (and nothing else is touched):
//   - a file in `shm_dir` whose name starts with "ucx_" or "tandem-" that no live process has
//     open or mapped (checked through /proc/PID/fd and /proc/PID/maps);
//   - a SysV segment of this user that no process is attached to and whose creator is dead.
//
// Thread-safe (no state); best effort: entries that cannot be read or removed are skipped.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct ShmSweepResult {
  int files = 0;         // POSIX files removed
  int sysv_segments = 0;  // SysV segments removed
  uint64_t bytes = 0;    // their total size
};

ShmSweepResult SweepOrphanedSharedMemory(const std::string& shm_dir = "/dev/shm");

}  // namespace tandem
