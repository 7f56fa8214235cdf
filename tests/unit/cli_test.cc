// Drives the real `tandem` binary: help, version, exit codes, config errors.
#include <catch2/catch.hpp>

#include "common/base/flags.h"
#include "test_util.h"

using namespace tandem;

namespace {
test::CommandResult Tandem(const std::string& args) {
  return test::RunCommand("timeout 60 " + std::string(TANDEM_BINARY) + " " + args);
}
}  // namespace

TEST_CASE("cli: --help and --version exit 0", "[cli]") {
  test::CommandResult help = Tandem("--help");
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("usage: tandem <command>") != std::string::npos);
  CHECK(help.output.find("make-model") != std::string::npos);
  test::CommandResult version = Tandem("--version");
  CHECK(version.exit_code == 0);
  CHECK(version.output.rfind("tandem ", 0) == 0);
}

TEST_CASE("cli: subcommand --help exits 0", "[cli]") {
  test::CommandResult help = Tandem("check-config --help");
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("usage: tandem check-config") != std::string::npos);
}

TEST_CASE("cli: unknown commands and flags exit 2 with a message", "[cli]") {
  test::CommandResult no_args = Tandem("");
  CHECK(no_args.exit_code == 2);
  test::CommandResult command = Tandem("fly");
  CHECK(command.exit_code == 2);
  CHECK(command.output.find("unknown command 'fly'") != std::string::npos);
  test::CommandResult flag = Tandem("--frobnicate");
  CHECK(flag.exit_code == 2);
  CHECK(flag.output.find("unknown flag '--frobnicate'") != std::string::npos);
  test::CommandResult sub_flag = Tandem("check-config --nope x.yaml");
  CHECK(sub_flag.exit_code == 2);
  CHECK(sub_flag.output.find("unknown flag --nope") != std::string::npos);
}

TEST_CASE("cli: check-config reports file:line:field and exits 1", "[cli]") {
  test::TempDir dir;
  std::string bad = dir.Write("bad.yaml", "decode:\n  max_batch_size: -3\n");
  test::CommandResult result = Tandem("check-config " + bad);
  CHECK(result.exit_code == 1);
  CHECK(result.output.find(bad + ":2:19: decode.max_batch_size: must be an integer") !=
        std::string::npos);
  std::string good = dir.Write("good.yaml", "router:\n  port: 8123\n");
  test::CommandResult ok = Tandem("check-config " + good + " --decode.max_batch_size=12");
  CHECK(ok.exit_code == 0);
  CHECK(ok.output.find("port: 8123") != std::string::npos);
  CHECK(ok.output.find("max_batch_size: 12") != std::string::npos);
}

TEST_CASE("cli: up and check-config stop on a latency model the router cannot use", "[cli]") {
  test::TempDir dir;
  // Ports 0: nothing is bound before the check. `timeout` bounds the old behaviour (the
  // launcher restarting the router with back-off for ever).
  std::string config = dir.Write(
      "cluster.yaml",
      "router: {port: 0, latency_model: missing-lm.yaml}\nprefill: {port: 0}\n"
      "decode: {port: 0}\ncolocated: {instances: 0}\n");
  test::CommandResult result = Tandem("up " + config);
  CHECK(result.exit_code == 1);
  CHECK(result.output.find("router.latency_model") != std::string::npos);
  CHECK(result.output.find("missing-lm.yaml") != std::string::npos);
  // check-config says the same.
  test::CommandResult check = Tandem("check-config " + config);
  CHECK(check.exit_code == 1);
  CHECK(check.output.find("missing-lm.yaml") != std::string::npos);
}

TEST_CASE("flags: parsing of values, booleans, positionals and overrides", "[cli]") {
  FlagParser flags("t", "s");
  flags.AddInt("n", 3, "count");
  flags.AddDouble("rate", 1.5, "rate");
  flags.AddString("out", "", "dir");
  flags.AddBool("verbose", "talk");
  flags.AllowConfigOverrides();
  REQUIRE(flags.Parse({"--n=7", "--rate", "2.25", "pos", "--verbose", "--decode.threads=2",
                       "--out", "d"}).ok());
  CHECK(flags.GetInt("n") == 7);
  CHECK(flags.GetDouble("rate") == 2.25);
  CHECK(flags.GetString("out") == "d");
  CHECK(flags.GetBool("verbose"));
  CHECK(flags.positional() == std::vector<std::string>{"pos"});
  CHECK(flags.config_overrides() == std::vector<std::string>{"decode.threads=2"});
  FlagParser strict("t", "s");
  strict.AddInt("n", 3, "count");
  CHECK(strict.Parse({"--n=x"}).message() == "flag --n takes an integer, got 'x'");
  CHECK(strict.Parse({"--n"}).message() == "flag --n needs a value");
  CHECK(strict.Parse({"--decode.threads=2"}).message() == "unknown flag --decode.threads");
}
