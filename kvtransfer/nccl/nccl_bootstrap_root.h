// NCCL bootstrap roots hosted by child processes, so that none outlives its link's setup.
//
// ncclGetUniqueId makes the calling process host the communicator's bootstrap root: a thread
// and a listening socket that end only once every rank has checked in. When the other rank of a
// link never does (its process died or failed before its NCCL init, or cannot reach the root's
// address: NCCL_SOCKET_IFNAME set wrong), they stay for the life of the process, one more for
// each new link the puller makes to replace a failed one. So the puller's unique ids come from
// child processes, `tandem-nccl-root` (kvtransfer/nccl/nccl_root_main.cc, installed beside the
// tandem binary), one root each; the link that uses an id holds its child until the link's
// setup ends, either way, and then ends it. (The link's own rank set up means every rank has
// checked in: the root is done.)
//
// A child starts in about 10 ms (it links NCCL alone), still a stall on the decode engine's
// thread, where the puller makes links. So NcclBootstrapRoots keeps children started ahead, on
// a thread of its own; when a burst of new links has taken them all, an id is made in this
// process as before, and only such a link can leave its root behind.
//
// Built only with the CUDA backend (kvtransfer/nccl/ goes to tandem_cuda); tested on the CPU
// (ncclGetUniqueId needs no GPU): tests/unit_cuda/nccl_bootstrap_root_test.cc.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "common/base/status.h"

namespace tandem {

// The helper's file name, beside the tandem binary.
inline constexpr const char* kNcclRootHelper = "tandem-nccl-root";

// The executable kNcclRootHelper in the directory of `binary` (symlinks resolved, so
// /proc/self/exe works); "" where there is none. A puller (CreateNcclPuller) uses the one beside
// its own program: tandem's. Other programs that make pullers (the GPU checks) have none beside
// them, and their ids are made in the puller's process (ncclGetUniqueId).
std::string NcclRootHelperBeside(const std::string& binary);

// One child process hosting one bootstrap root.
class NcclBootstrapRoot {
 public:
  // Starts `binary` (tandem-nccl-root) and reads the unique id it made (128 bytes), within
  // `timeout`. Errors: Unavailable (the child could not start, or ended without an id: NCCL's
  // message is on stderr, which the child shares), DeadlineExceeded.
  static StatusOr<std::unique_ptr<NcclBootstrapRoot>> Start(const std::string& binary,
                                                            std::chrono::milliseconds timeout);

  // Ends the child (its stdin closes, its cue to exit; SIGKILL if it has not within 1 s) and
  // reaps it.
  ~NcclBootstrapRoot();
  NcclBootstrapRoot(const NcclBootstrapRoot&) = delete;
  NcclBootstrapRoot& operator=(const NcclBootstrapRoot&) = delete;

  const std::string& unique_id() const { return unique_id_; }
  pid_t pid() const { return pid_; }

 private:
  NcclBootstrapRoot(pid_t pid, int stdin_fd, std::string unique_id)
      : pid_(pid), stdin_fd_(stdin_fd), unique_id_(std::move(unique_id)) {}

  pid_t pid_;
  int stdin_fd_;  // the write end of the child's stdin
  std::string unique_id_;
};

// The puller's unique ids (OrderedLinkMaker::new_unique_id), from children started ahead.
class NcclBootstrapRoots {
 public:
  // Keeps `spares` children (`binary`: tandem-nccl-root) started, on a thread of its own; a
  // child that fails to start is logged, and the next try waits kRetrySeconds.
  NcclBootstrapRoots(std::string binary, int spares);
  // Ends every child not claimed (spares, and ids handed out but never claimed).
  ~NcclBootstrapRoots();
  NcclBootstrapRoots(const NcclBootstrapRoots&) = delete;
  NcclBootstrapRoots& operator=(const NcclBootstrapRoots&) = delete;

  // A new unique id, at once: a spare child's when one is ready (Claim then gives its child),
  // else one made in this process (CreateNcclUniqueId: the root lives here). Either way a
  // replacement spare is started. Errors: CreateNcclUniqueId's.
  StatusOr<std::string> NewUniqueId();

  // The child hosting the root of `unique_id` (from NewUniqueId), for the link that uses the id
  // to hold until its setup ends; null for an id made in this process or claimed already.
  std::unique_ptr<NcclBootstrapRoot> Claim(std::string_view unique_id);

  size_t ready_spares() const;     // for tests
  size_t in_process_ids() const;   // ids NewUniqueId made in this process, so far

  static constexpr int kRetrySeconds = 5;
  static constexpr std::chrono::milliseconds kStartTimeout{10000};

 private:
  void KeepSpares();  // the thread

  const std::string binary_;
  const size_t spares_wanted_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<std::unique_ptr<NcclBootstrapRoot>> spares_;
  std::map<std::string, std::unique_ptr<NcclBootstrapRoot>, std::less<>> handed_out_;
  size_t in_process_ids_ = 0;
  std::thread thread_;  // last: started once the rest is made
};

}  // namespace tandem
