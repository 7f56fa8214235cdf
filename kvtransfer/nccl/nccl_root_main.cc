// tandem-nccl-root: hosts the NCCL bootstrap root of one link for a decode instance's KV puller
// (kvtransfer/nccl/nccl_bootstrap_root.h), a child process the puller starts and ends. Not a
// command for users. Linked with NCCL alone, so that it starts in milliseconds and holds next
// to no memory of its own (the tandem binary, with the CUDA libraries' relocations, would take
// about 0.1 s and 90 MiB).
//
// It makes a unique id (ncclGetUniqueId: NCCL's root thread starts here), writes its 128 bytes
// to file descriptor 3, and waits until stdin ends: the puller let go of it, or died. Exit code
// 0, or 1 when no id could be made (NCCL's reason on stderr) or the puller is gone.
#include <nccl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

int main() {
  ncclUniqueId id;
  const ncclResult_t made = ncclGetUniqueId(&id);
  if (made != ncclSuccess) {
    std::fprintf(stderr, "tandem-nccl-root: ncclGetUniqueId: %s (%s)\n",
                 ncclGetErrorString(made), ncclGetLastError(nullptr));
    return 1;
  }
  for (size_t written = 0; written < sizeof id.internal;) {
    const ssize_t n = ::write(3, id.internal + written, sizeof id.internal - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 1;  // the puller is gone
    written += static_cast<size_t>(n);
  }
  ::close(3);
  // NCCL's root thread serves the ranks meanwhile.
  char buffer[64];
  for (;;) {
    const ssize_t n = ::read(0, buffer, sizeof buffer);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    return 0;
  }
}
