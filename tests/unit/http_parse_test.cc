// The HTTP request parsing the server's connections use (common/net/http_parse.h): Beast's parser
// as configured there, fed the way a socket delivers bytes, and the conversion to HttpRequest.
#include <string>

#include <boost/asio/buffer.hpp>
#include <catch2/catch.hpp>

#include "common/net/http_parse.h"

namespace tandem {
namespace {

namespace http = boost::beast::http;

TEST_CASE("http parse: a chunked body whose last chunk arrives in pieces", "[http]") {
  // Boost 1.74's Beast asserted n >= 5 on the second put (boostorg/beast PR #2861); Tandem keeps
  // assertions on, so a client could abort the router (common/base/boost_assert.cc).
  HttpRequestParser parser;
  ConfigureRequestParser(parser, 1 << 20);
  std::string pending =
      "POST /v1/completions?stream=1 HTTP/1.1\r\nHost: a\r\nX-Tandem-SLO-Class: chat\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  boost::beast::error_code ec;
  auto put = [&](const std::string& more) {
    pending += more;
    size_t used = parser.put(boost::asio::buffer(pending), ec);
    pending.erase(0, used);
  };
  put("");
  REQUIRE_FALSE(ec);
  REQUIRE(parser.is_header_done());
  put("0\r\n");
  CHECK(ec == http::error::need_more);
  put("\r");  // the piece that tripped the assertion
  CHECK(ec == http::error::need_more);
  put("\n");
  REQUIRE_FALSE(ec);
  REQUIRE(parser.is_done());

  HttpRequest request = ToHttpRequest(parser.release());
  CHECK(request.method == "POST");
  CHECK(request.path == "/v1/completions");
  CHECK(request.query == "stream=1");
  CHECK(request.Header("x-tandem-slo-class") == "chat");
  CHECK(request.body.empty());
}

TEST_CASE("http parse: the body limit is the configured one", "[http]") {
  HttpRequestParser parser;
  ConfigureRequestParser(parser, 4);
  std::string bytes = "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
  boost::beast::error_code ec;
  parser.eager(true);
  parser.put(boost::asio::buffer(bytes), ec);
  CHECK(ec == http::error::body_limit);
}

}  // namespace
}  // namespace tandem
