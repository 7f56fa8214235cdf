#include "common/net/metrics_http.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>

#include "common/base/log.h"

namespace tandem {
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

constexpr size_t kMaxHeaderBytes = 8 << 10;
constexpr auto kRequestTimeout = std::chrono::seconds(5);

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const MetricsHttpServer::TextFn* metrics,
          const MetricsHttpServer::HealthFn* health)
      : stream_(std::move(socket)), metrics_(metrics), health_(health) {
    parser_.header_limit(kMaxHeaderBytes);
    parser_.body_limit(0);
  }

  void Start() {
    stream_.expires_after(kRequestTimeout);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout) return Close();
    response_.version(11);
    response_.keep_alive(false);
    response_.set(http::field::server, "tandem");
    if (ec) {
      Reply(http::status::bad_request, "text/plain", "bad request\n");
      return;
    }
    const auto& request = parser_.get();
    std::string target(request.target());
    if (size_t q = target.find('?'); q != std::string::npos) target.resize(q);
    if (request.method() != http::verb::get && request.method() != http::verb::head) {
      Reply(http::status::method_not_allowed, "text/plain", "only GET\n");
    } else if (target == "/metrics") {
      Reply(http::status::ok, "text/plain; version=0.0.4; charset=utf-8", (*metrics_)());
    } else if (target == "/health") {
      Status s = (*health_)();
      if (s.ok()) {
        Reply(http::status::ok, "text/plain", "ok\n");
      } else {
        Reply(http::status::service_unavailable, "text/plain", s.ToString() + "\n");
      }
    } else {
      Reply(http::status::not_found, "text/plain", "not found\n");
    }
  }

  void Reply(http::status status, const char* content_type, std::string body) {
    response_.result(status);
    response_.set(http::field::content_type, content_type);
    response_.body() = std::move(body);
    response_.prepare_payload();
    stream_.expires_after(kRequestTimeout);
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code, size_t) { self->Close(); });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kMaxHeaderBytes};
  http::request_parser<http::empty_body> parser_;
  http::response<http::string_body> response_;
  const MetricsHttpServer::TextFn* metrics_;
  const MetricsHttpServer::HealthFn* health_;
};

}  // namespace

struct MetricsHttpServer::Impl {
  boost::asio::io_context io{1};
  tcp::acceptor acceptor{io};
  TextFn metrics;
  HealthFn health;
  bool stopped = false;

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == boost::asio::error::operation_aborted) return;
        TANDEM_LOG(kWarn) << "metrics endpoint: accept failed: " << ec.message();
      } else {
        std::make_shared<Session>(std::move(socket), &metrics, &health)->Start();
      }
      Accept();
    });
  }
};

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host,
                                                                      int port, TextFn metrics,
                                                                      HealthFn health) {
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->impl_ = std::make_unique<Impl>();
  Impl& impl = *server->impl_;
  impl.metrics = std::move(metrics);
  impl.health = std::move(health);
  beast::error_code ec;
  auto address = boost::asio::ip::make_address(host, ec);
  if (ec) return InvalidArgument("metrics endpoint: bad host '" + host + "'");
  tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  impl.acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(endpoint, ec);
  if (!ec) impl.acceptor.listen(boost::asio::socket_base::max_listen_connections, ec);
  if (ec)
    return Unavailable("metrics endpoint: cannot listen on " + host + ":" + std::to_string(port) +
                       ": " + ec.message());
  server->port_ = impl.acceptor.local_endpoint().port();
  impl.Accept();
  server->thread_ = std::thread([&impl] { impl.io.run(); });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  impl_->io.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tandem
