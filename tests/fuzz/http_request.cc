// Fuzzes the HTTP/1.1 request parsing of common/net/http_server.h without a socket: the bytes go
// to Boost.Beast's request_parser configured as every connection configures it
// (common/net/http_parse.h ConfigureRequestParser: the default 8 MiB body limit, 64 KiB header
// limit), in pieces the way a socket delivers them (the first byte picks the piece size), and a
// complete request becomes an HttpRequest (ToHttpRequest). What is fuzzed is Beast's parser in
// that configuration and Tandem's conversion; the session's timers, routing and writes are not.
// Properties: nothing crashes; a parsed request's path has no '?', its header names are lower
// case, and its body is no larger than the limit.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>

#include <boost/asio/buffer.hpp>

#include "common/net/http_parse.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  const size_t body_limit = HttpServerOptions{}.max_body_bytes;

  HttpRequestParser parser;
  ConfigureRequestParser(parser, body_limit);
  std::string pending;  // delivered but not yet consumed, as in the session's flat_buffer
  size_t offset = 0;
  boost::beast::error_code ec;
  while (!parser.is_done()) {
    const bool more_input = offset < n;
    if (more_input) {
      size_t take = std::min(piece, n - offset);
      pending.append(bytes + offset, take);
      offset += take;
    }
    if (pending.empty()) break;  // Beast's read never puts an empty buffer: it reads first
    size_t used = parser.put(boost::asio::buffer(pending), ec);
    pending.erase(0, used);
    if (parser.is_header_done()) parser.eager(true);  // async_read_header, then async_read
    if (ec == boost::beast::http::error::need_more) {
      ec = {};
      if (more_input) continue;
    } else if (ec) {
      return 0;
    } else if (used > 0 || more_input) {
      continue;
    }
    break;
  }
  if (!parser.is_done()) {
    // The client closed the connection: Beast's read ends the message (put_eof) only when it
    // got some of it, else reports end_of_stream.
    if (!parser.got_some()) return 0;
    parser.put_eof(ec);
  }
  if (ec || !parser.is_done()) return 0;
  HttpRequest request = ToHttpRequest(parser.release());
  FUZZ_CHECK(request.path.find('?') == std::string::npos, "a path with a query in it");
  for (const auto& [name, value] : request.headers) {
    FUZZ_CHECK(std::none_of(name.begin(), name.end(), [](unsigned char c) { return std::isupper(c); }),
               "a header name that is not lower case");
  }
  FUZZ_CHECK(request.body.size() <= body_limit, "a body over the limit");
  return 0;
}
