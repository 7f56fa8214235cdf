// The path of this build's `tandem` binary, for the tests that run it.
//
// It lives in one source file of its own (tests/tandem_binary.cc) rather than in every test's
// compile flags: the path names the build directory, and with it in the flags no test object of
// the CUDA-on build could be reused from the CUDA-off build's (tests/run.sh builds and runs the
// unit tests in both, and ccache compiles them once).
#pragma once

namespace tandem::test {

// An absolute path; the binary is built before the tests that use it (add_dependencies).
const char* TandemBinary();

}  // namespace tandem::test
