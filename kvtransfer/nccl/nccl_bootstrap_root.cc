#include "kvtransfer/nccl/nccl_bootstrap_root.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "common/base/fd.h"
#include "common/base/log.h"
#include "kvtransfer/nccl/nccl_transport.h"

extern char** environ;

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// A pipe whose ends are above the descriptors the child's are dup'ed to (0-3), so that no
// dup2 of the spawn overwrites another's source (a process may run with stdin closed).
Status MakePipe(Fd* read_end, Fd* write_end) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0)
    return Unavailable(std::string("tandem-nccl-root: pipe: ") + std::strerror(errno));
  for (int& fd : ends) {
    if (fd > 3) continue;
    const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 4);
    ::close(fd);
    fd = moved;
  }
  read_end->reset(ends[0]);
  write_end->reset(ends[1]);
  if (ends[0] < 0 || ends[1] < 0)
    return Unavailable(std::string("tandem-nccl-root: fcntl: ") + std::strerror(errno));
  return Status();
}

// Reads exactly `bytes` from `fd` before `deadline`; fewer where the writer closed first.
StatusOr<std::string> ReadUntil(int fd, size_t bytes, Clock::time_point deadline) {
  std::string out;
  char buffer[256];
  while (out.size() < bytes) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return DeadlineExceeded("no unique id within the start timeout");
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Unavailable(std::string("poll: ") + std::strerror(errno));
    if (ready == 0) continue;  // the deadline check above ends it
    const ssize_t n = ::read(fd, buffer, std::min(sizeof buffer, bytes - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // closed (or failed): the caller sees a short id
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

// Waits for `pid` to end, up to `wait`; then kills it and waits for that.
void Reap(pid_t pid, std::chrono::milliseconds wait) {
  const Clock::time_point deadline = Clock::now() + wait;
  for (;;) {
    const pid_t done = ::waitpid(pid, nullptr, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) return;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

std::string NcclRootHelperBeside(const std::string& binary) {
  std::error_code ec;
  const std::filesystem::path resolved = std::filesystem::canonical(binary, ec);
  if (ec) return "";
  const std::filesystem::path helper = resolved.parent_path() / kNcclRootHelper;
  return ::access(helper.c_str(), X_OK) == 0 ? helper.string() : "";
}

// ---- NcclBootstrapRoot -------------------------------------------------------------------------

StatusOr<std::unique_ptr<NcclBootstrapRoot>> NcclBootstrapRoot::Start(
    const std::string& binary, std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  Fd id_read, id_write, life_read, life_write;
  TANDEM_RETURN_IF_ERROR(MakePipe(&id_read, &id_write));
  TANDEM_RETURN_IF_ERROR(MakePipe(&life_read, &life_write));

  // The child: stdin the life pipe, fd 3 the id pipe, stdout to stderr (NCCL_DEBUG's lines go
  // to stdout: the instance's log), nothing else of this process's descriptors, and no signal
  // blocked (the calling thread's mask would be inherited).
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, life_read.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, id_write.get(), 3);
  posix_spawn_file_actions_adddup2(&actions, 2, 1);
  posix_spawn_file_actions_addclosefrom_np(&actions, 4);
  std::string arg0 = binary;
  char* argv[] = {arg0.data(), nullptr};
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, binary.c_str(), &actions, &attributes, argv, environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return Unavailable("tandem-nccl-root: cannot start " + binary + ": " +
                       std::strerror(spawned));
  }
  life_read.reset();  // the child has its copies; these ends close here
  id_write.reset();
  std::unique_ptr<NcclBootstrapRoot> root(new NcclBootstrapRoot(pid, life_write.release(), ""));
  StatusOr<std::string> id = ReadUntil(id_read.get(), kNcclUniqueIdBytes, deadline);
  if (!id.ok()) return id.status().WithContext("tandem-nccl-root " + binary);  // ~root ends it
  if (id->size() != kNcclUniqueIdBytes) {
    return Unavailable("tandem-nccl-root: " + binary + " ended without a unique id (" +
                       std::to_string(id->size()) + " of " + std::to_string(kNcclUniqueIdBytes) +
                       " bytes; its reason is on stderr)");
  }
  root->unique_id_ = std::move(id).value();
  return root;
}

NcclBootstrapRoot::~NcclBootstrapRoot() {
  ::close(stdin_fd_);  // the child's stdin ends: it exits
  Reap(pid_, std::chrono::milliseconds(1000));
}

// ---- NcclBootstrapRoots ------------------------------------------------------------------------

NcclBootstrapRoots::NcclBootstrapRoots(std::string binary, int spares)
    : binary_(std::move(binary)), spares_wanted_(static_cast<size_t>(std::max(spares, 0))) {
  thread_ = std::thread([this] { KeepSpares(); });
}

NcclBootstrapRoots::~NcclBootstrapRoots() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // spares_ and handed_out_ end their children as they go.
}

StatusOr<std::string> NcclBootstrapRoots::NewUniqueId() {
  std::unique_ptr<NcclBootstrapRoot> spare;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!spares_.empty()) {
      spare = std::move(spares_.front());
      spares_.pop_front();
      std::string id = spare->unique_id();
      handed_out_.emplace(id, std::move(spare));
      cv_.notify_all();  // a replacement
      return id;
    }
    ++in_process_ids_;
  }
  cv_.notify_all();
  return CreateNcclUniqueId();
}

std::unique_ptr<NcclBootstrapRoot> NcclBootstrapRoots::Claim(std::string_view unique_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = handed_out_.find(unique_id);
  if (found == handed_out_.end()) return nullptr;
  std::unique_ptr<NcclBootstrapRoot> root = std::move(found->second);
  handed_out_.erase(found);
  return root;
}

size_t NcclBootstrapRoots::ready_spares() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spares_.size();
}

size_t NcclBootstrapRoots::in_process_ids() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_process_ids_;
}

void NcclBootstrapRoots::KeepSpares() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || spares_.size() < spares_wanted_; });
    if (stop_) return;
    lock.unlock();  // a start takes about 0.1 s: NewUniqueId goes on meanwhile
    StatusOr<std::unique_ptr<NcclBootstrapRoot>> root =
        NcclBootstrapRoot::Start(binary_, kStartTimeout);
    lock.lock();
    if (root.ok()) {
      spares_.push_back(std::move(root).value());
      continue;
    }
    TANDEM_LOG(kWarn) << "NCCL bootstrap roots: " << root.status().ToString()
                      << "; new links' ids are made in this process (a link whose peer never "
                         "joins then leaves its root's thread behind); next try in "
                      << kRetrySeconds << " s";
    cv_.wait_for(lock, std::chrono::seconds(kRetrySeconds), [this] { return stop_; });
  }
}

}  // namespace tandem
