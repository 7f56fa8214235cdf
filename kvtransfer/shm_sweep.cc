#include "kvtransfer/shm_sweep.h"

#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/base/log.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

bool SweptName(const std::string& name) {
  return name.rfind("ucx_", 0) == 0 || name.rfind("tandem-", 0) == 0;
}

// Inodes of the files under `shm_dir` that a live process holds open or mapped.
std::set<ino_t> InodesInUse(const std::string& shm_dir) {
  std::set<ino_t> in_use;
  std::error_code ec;
  for (const fs::directory_entry& proc : fs::directory_iterator("/proc", ec)) {
    const std::string pid = proc.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fd_ec;
    for (const fs::directory_entry& fd : fs::directory_iterator(proc.path() / "fd", fd_ec)) {
      struct stat st {};
      if (stat(fd.path().c_str(), &st) == 0) in_use.insert(st.st_ino);
    }
    std::ifstream maps(proc.path() / "maps");
    std::string line;
    while (std::getline(maps, line)) {
      if (line.find(shm_dir) == std::string::npos) continue;
      std::istringstream fields(line);
      std::string range, perms, offset, dev;
      unsigned long inode = 0;
      if (fields >> range >> perms >> offset >> dev >> inode) in_use.insert(inode);
    }
  }
  return in_use;
}

void SweepFiles(const std::string& shm_dir, ShmSweepResult* result) {
  std::error_code ec;
  std::set<ino_t> in_use;
  bool scanned = false;
  for (const fs::directory_entry& entry : fs::directory_iterator(shm_dir, ec)) {
    if (!SweptName(entry.path().filename().string())) continue;
    struct stat st {};
    if (lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (!scanned) {  // only when there is a candidate: the scan reads all of /proc
      in_use = InodesInUse(shm_dir);
      scanned = true;
    }
    if (in_use.count(st.st_ino)) continue;
    if (unlink(entry.path().c_str()) == 0) {
      ++result->files;
      result->bytes += static_cast<uint64_t>(st.st_size);
    }
  }
}

void SweepSysv(ShmSweepResult* result) {
  struct shm_info info {};
  const int max_index = shmctl(0, SHM_INFO, reinterpret_cast<struct shmid_ds*>(&info));
  for (int index = 0; index <= max_index; ++index) {
    struct shmid_ds ds {};
    const int id = shmctl(index, SHM_STAT, &ds);
    if (id < 0 || ds.shm_perm.uid != geteuid() || ds.shm_nattch != 0) continue;
    if (kill(ds.shm_cpid, 0) == 0 || errno != ESRCH) continue;  // its creator lives
    if (shmctl(id, IPC_RMID, nullptr) == 0) {
      ++result->sysv_segments;
      result->bytes += ds.shm_segsz;
    }
  }
}

}  // namespace

ShmSweepResult SweepOrphanedSharedMemory(const std::string& shm_dir) {
  ShmSweepResult result;
  SweepFiles(shm_dir, &result);
  SweepSysv(&result);
  if (result.files + result.sysv_segments > 0) {
    TANDEM_LOG(kInfo) << "removed shared memory left by dead processes: " << result.files
                      << " file(s) in " << shm_dir << ", " << result.sysv_segments
                      << " SysV segment(s), " << result.bytes << " bytes";
  }
  return result;
}

}  // namespace tandem
