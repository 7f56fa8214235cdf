// The UCX options of every test: reads chosen from the transports as the factory chooses them
// (ReadsForTls: authenticated read messages over tcp, RMA over shared memory), proved with the
// tests' cluster secret, exactly as a real cluster's are with its own.
#pragma once

#include <string>

#include "kvtransfer/ucx_transport.h"
#include "tests/test_control.h"

namespace tandem::test {

inline UcxOptions TestUcxOptions(const std::string& tls) {
  UcxOptions options;
  options.tls = tls;
  options.reads = ReadsForTls(tls);
  options.secret = kTestClusterSecret;
  return options;
}

}  // namespace tandem::test
