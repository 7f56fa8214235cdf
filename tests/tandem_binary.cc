#include "tests/tandem_binary.h"

namespace tandem::test {

const char* TandemBinary() { return TANDEM_BINARY; }  // defined by tests/CMakeLists.txt

}  // namespace tandem::test
