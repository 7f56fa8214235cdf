#include "common/net/fd_budget.h"

#include <sys/resource.h>

#include <algorithm>

namespace tandem {

int MaxConnectionsForFds(int wanted, uint64_t fd_limit) {
  if (fd_limit == 0) {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return wanted;
    fd_limit = limit.rlim_cur;
  }
  const uint64_t reserve = std::min<uint64_t>(256, fd_limit / 2);
  const uint64_t cap = std::max<uint64_t>(4, fd_limit - reserve);
  return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(std::max(wanted, 0)), cap));
}

}  // namespace tandem
