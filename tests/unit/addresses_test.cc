// Where instances listen and what peers dial: S.host, S.advertise_host ($TANDEM_ADVERTISE_HOST),
// S.addresses (the router's static discovery), and the cluster secret's sources.
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>

#include "common/config/config.h"
#include "common/config/serving_config.h"
#include "kvtransfer/factory.h"
#include "test_util.h"

using namespace tandem;

namespace {

StatusOr<ClusterConfig> Parse(const std::string& yaml) { return ParseConfig(yaml, "cluster.yaml"); }

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Sets an environment variable for a scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (value) setenv(name.c_str(), value, 1); else unsetenv(name.c_str());
  }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("addresses: hosts and static lists are IP addresses, named by field", "[config]") {
  auto error = [](const std::string& yaml) {
    auto c = Parse(yaml);
    return c.ok() ? std::string() : c.status().message();
  };
  CHECK(error("prefill: {host: 0.0.0.0, advertise_host: 10.1.2.3}\n").empty());
  CHECK(error("decode: {addresses: ['10.0.0.2:7000', '[fd00::2]:7000']}\n").empty());
  CHECK(Has(error("prefill:\n  host: myhost\n"), "cluster.yaml:2:9: prefill.host: 'myhost' is not an IP address"));
  CHECK(Has(error("decode: {advertise_host: 0.0.0.0}\n"),
            "decode.advertise_host: 0.0.0.0 is not an address peers can dial"));
  CHECK(Has(error("decode: {addresses: ['10.0.0.2']}\n"), "decode.addresses: '10.0.0.2' is not IP:PORT"));
  CHECK(Has(error("decode: {addresses: ['0.0.0.0:7000']}\n"), "is not IP:PORT"));
  CHECK(Has(error("decode: {addresses: ['10.0.0.2:99999']}\n"), "is not IP:PORT"));
  CHECK(Has(error("decode: {addresses: {a: b}}\n"), "decode.addresses: must be a list of strings"));
  CHECK(error("decode: {dns_name: 'tandem-decode.ns.svc.cluster.local:7000'}\n").empty());
  CHECK(Has(error("decode: {dns_name: tandem-decode}\n"), "decode.dns_name: 'tandem-decode' is not NAME:PORT"));
  CHECK(Has(error("decode: {dns_name: 'd:7000', addresses: ['10.0.0.2:7000']}\n"),
            "set either decode.addresses or decode.dns_name, not both"));
  // An override gives a comma-separated list.
  auto c = ParseConfig("", "cluster.yaml", {"decode.addresses=10.0.0.2:7000,10.0.0.3:7000"});
  REQUIRE(c.ok());
  CHECK(c->decode.addresses == std::vector<std::string>{"10.0.0.2:7000", "10.0.0.3:7000"});
  auto again = ParseConfig(ConfigToYaml(*c), "again.yaml");
  REQUIRE(again.ok());
  CHECK(again->decode.addresses == c->decode.addresses);
}

TEST_CASE("addresses: what an instance advertises", "[config]") {
  ScopedEnv clear(kAdvertiseHostEnv, nullptr);
  auto local = Parse("");
  REQUIRE(local.ok());
  CHECK(*AdvertiseHost(*local, local->prefill, "prefill") == "127.0.0.1");
  CHECK_FALSE(IsMultiHost(*local));

  auto everywhere = Parse("prefill: {host: 0.0.0.0}\n");
  REQUIRE(everywhere.ok());
  StatusOr<std::string> none = AdvertiseHost(*everywhere, everywhere->prefill, "prefill");
  REQUIRE_FALSE(none.ok());
  CHECK(Has(none.status().message(), "prefill.advertise_host: prefill.host is 0.0.0.0"));
  {
    ScopedEnv pod(kAdvertiseHostEnv, "10.244.1.7");  // the downward API's status.podIP
    CHECK(*AdvertiseHost(*everywhere, everywhere->prefill, "prefill") == "10.244.1.7");
  }
  {
    ScopedEnv bad(kAdvertiseHostEnv, "pod-name");
    CHECK(Has(AdvertiseHost(*everywhere, everywhere->prefill, "prefill").status().message(),
              "$TANDEM_ADVERTISE_HOST 'pod-name' is not an IP address"));
  }
  // Peers on other machines cannot dial a loopback address.
  auto multi = Parse("decode: {addresses: ['10.0.0.2:7000']}\n");
  REQUIRE(multi.ok());
  CHECK(IsMultiHost(*multi));
  StatusOr<std::string> loop = AdvertiseHost(*multi, multi->prefill, "prefill");
  REQUIRE_FALSE(loop.ok());
  CHECK(Has(loop.status().message(), "loopback address 127.0.0.1"));
  auto multi_ok = Parse("prefill: {host: 10.0.0.1}\ndecode: {addresses: ['10.0.0.2:7000']}\n");
  REQUIRE(multi_ok.ok());
  CHECK(*AdvertiseHost(*multi_ok, multi_ok->prefill, "prefill") == "10.0.0.1");
  auto by_name = Parse("decode: {dns_name: 'tandem-decode:7000'}\n");
  REQUIRE(by_name.ok());
  CHECK(IsMultiHost(*by_name));  // found by name: anywhere
}

TEST_CASE("addresses: the UCX data plane offers only the interface of S.host", "[kvtransfer]") {
  CHECK(*InterfaceOfAddress("127.0.0.1") == "lo");
  CHECK(*InterfaceOfAddress("127.0.0.2") == "lo");
  CHECK(InterfaceOfAddress("0.0.0.0")->empty());  // every interface
  CHECK(InterfaceOfAddress("192.0.2.77").status().code() == StatusCode::kNotFound);  // TEST-NET-1
  CHECK(InterfaceOfAddress("nohost").status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("transfer factory: cuda_ipc needs a CUDA build and one machine", "[kvtransfer]") {
  // The machine's identity for cuda_ipc: the kernel's boot id, the same on every call.
  StatusOr<std::string> boot = MachineBootId();
  REQUIRE(boot.ok());
  CHECK(boot->size() == 36);  // a UUID
  CHECK(*MachineBootId() == *boot);
  TransferSection transfer;
  transfer.backend = "cuda_ipc";
  StatusOr<PublisherWithPool> pub = CreatePublisherWithPool(transfer, 1 << 20, {});
  StatusOr<PullerWithPool> pull = CreatePullerWithPool(transfer, 1 << 20, {});
  REQUIRE_FALSE(pub.ok());
  REQUIRE_FALSE(pull.ok());
  if (!BuiltWithCuda()) {
    CHECK(Has(pub.status().message(), "transfer.backend cuda_ipc needs a build with the CUDA backend"));
    CHECK(pull.status().code() == StatusCode::kInvalidArgument);
  } else {  // a CUDA build: its pools are shaped per rank, so the shape is asked for first
    CHECK(Has(pub.status().message(), "cuda_ipc: the KV pools' shape "
                                      "(TransferFactoryOptions::pool_shape) is required"));
    CHECK(pull.status().code() == StatusCode::kInvalidArgument);
  }
  transfer.backend = "nccl";
  CHECK(Has(CreatePublisherWithPool(transfer, 1 << 20, {}).status().message(),
            BuiltWithCuda() ? "nccl: the KV pools' shape (TransferFactoryOptions::pool_shape) is "
                              "required"
                            : "transfer.backend nccl needs a build with the CUDA backend"));
  CHECK(Has(CreatePullerWithPool(transfer, 1 << 20, {}).status().message(),
            BuiltWithCuda() ? "nccl: the KV pools' shape" : "nccl needs a build with the CUDA"));
  transfer.backend = "rdma";
  CHECK(Has(CreatePublisherWithPool(transfer, 1 << 20, {}).status().message(),
            "is not supported by the instance servers (ucx, cuda_ipc, nccl or inproc)"));
}

TEST_CASE("cluster secret: from a private file or the environment, never too short",
          "[config]") {
  test::TempDir dir;
  ScopedEnv clear(kClusterSecretEnv, nullptr);
  auto config = Parse("");
  REQUIRE(config.ok());
  CHECK(Has(LoadClusterSecret(*config).status().message(),
            "control.secret_file: no cluster secret: set control.secret_file"));
  {
    ScopedEnv env(kClusterSecretEnv, "0123456789abcdef0123");
    CHECK(*LoadClusterSecret(*config) == "0123456789abcdef0123");
  }
  {
    ScopedEnv env(kClusterSecretEnv, "short");
    CHECK(Has(LoadClusterSecret(*config).status().message(), "is 5 bytes; at least 16"));
  }
  const std::string path = dir.Write("secret", "  0123456789abcdef-from-a-file\n");
  ::chmod(path.c_str(), 0644);
  config->control.secret_file = path;
  CHECK(Has(LoadClusterSecret(*config).status().message(), "is readable by group or others"));
  ::chmod(path.c_str(), 0600);
  CHECK(*LoadClusterSecret(*config) == "0123456789abcdef-from-a-file");
  config->control.secret_file = path + ".missing";
  CHECK(Has(LoadClusterSecret(*config).status().message(), "cannot read"));
}
