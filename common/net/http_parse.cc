#include "common/net/http_parse.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <utility>

namespace tandem {

namespace {

std::string Lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

void ConfigureRequestParser(HttpRequestParser& parser, size_t max_body_bytes) {
  parser.body_limit(max_body_bytes);
  parser.header_limit(kHttpHeaderLimitBytes);
}

HttpRequest ToHttpRequest(BeastHttpRequest&& message) {
  HttpRequest request;
  boost::beast::string_view method = message.method_string();
  request.method.assign(method.data(), method.size());
  std::string target(message.target());
  size_t q = target.find('?');
  request.path = target.substr(0, q);
  if (q != std::string::npos) request.query = target.substr(q + 1);
  for (const auto& field : message) {
    boost::beast::string_view name = field.name_string();
    request.headers[Lower(std::string_view(name.data(), name.size()))] = std::string(field.value());
  }
  request.body = std::move(message.body());
  return request;
}

}  // namespace tandem
