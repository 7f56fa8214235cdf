// Boost's assertion handler (BOOST_ENABLE_ASSERT_HANDLER, set for the whole tree in
// CMakeLists.txt): a failed BOOST_ASSERT prints and aborts, as assert() does, except for one
// assertion known to be wrong.
//
// Boost.Beast before Boost 1.86 asserts `n >= 5` in basic_parser::parse_chunk_header when a
// chunked body's last chunk ("0\r\n") was delivered on its own and the next read adds fewer than
// two bytes (boostorg/beast PR #2861: "it's possible that we reach code only with 3 symbols").
// The code after the assertion handles that input (it asks for more bytes); the assertion does
// not. Tandem builds keep assertions on, so without this any HTTP client could abort the router
// by splitting a chunked request across TCP segments (found by tests/fuzz/http_request.cc).
#include <boost/assert.hpp>
#include <boost/version.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

bool EndsWith(const char* text, const char* suffix) {
  size_t n = std::strlen(text), m = std::strlen(suffix);
  return n >= m && std::strcmp(text + n - m, suffix) == 0;
}

bool KnownWrongAssertion(const char* expr, const char* file) {
#if BOOST_VERSION < 108600
  return std::strcmp(expr, "n >= 5") == 0 && EndsWith(file, "beast/http/impl/basic_parser.ipp");
#else
  (void)expr;
  (void)file;
  return false;
#endif
}

}  // namespace

namespace boost {

void assertion_failed(char const* expr, char const* function, char const* file, long line) {
  if (KnownWrongAssertion(expr, file)) return;
  std::fprintf(stderr, "%s:%ld: %s: Boost assertion `%s' failed.\n", file, line, function, expr);
  std::abort();
}

void assertion_failed_msg(char const* expr, char const* msg, char const* function,
                          char const* file, long line) {
  std::fprintf(stderr, "%s:%ld: %s: Boost assertion `%s' failed: %s\n", file, line, function, expr,
               msg);
  std::abort();
}

}  // namespace boost
