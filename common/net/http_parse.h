// The request side of common/net/http_server.h apart from the socket: how the server configures
// Boost.Beast's HTTP/1.1 request parser (header and body limits) and how a parsed message becomes
// an HttpRequest. Split out so that tests/fuzz/http_request.cc feeds bytes to the same parser,
// configured the same way, that every connection reads with.
#pragma once

#include <cstddef>

#include <boost/beast/http.hpp>

#include "common/net/http_server.h"

namespace tandem {

// A request's start line and headers together; larger is a 400 (header_limit).
inline constexpr size_t kHttpHeaderLimitBytes = 64 << 10;

using HttpRequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;
using BeastHttpRequest = boost::beast::http::request<boost::beast::http::string_body>;

// Sets the limits a connection reads a request under: the body limit (a larger body is 413) and
// kHttpHeaderLimitBytes.
void ConfigureRequestParser(HttpRequestParser& parser, size_t max_body_bytes);

// The method, the target split at the first '?' into path and query, the headers with names
// lower-cased (a repeated header keeps its last value) and the body.
HttpRequest ToHttpRequest(BeastHttpRequest&& message);

}  // namespace tandem
