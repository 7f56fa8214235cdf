// How many connections a listener may hold and still leave file descriptors to the rest of the
// process (its KV transfers, files, /health): the control listener and the HTTP server cap
// their connections with it.
#pragma once

#include <cstdint>

namespace tandem {

// `wanted` (a configured max_connections), lowered so that the open connections leave file
// descriptors to the rest of the process under RLIMIT_NOFILE `fd_limit` (0: this process's soft
// limit): at most fd_limit - min(256, fd_limit / 2), at least 4.
int MaxConnectionsForFds(int wanted, uint64_t fd_limit = 0);

}  // namespace tandem
