// NCCL bootstrap roots hosted by child processes (kvtransfer/nccl/nccl_bootstrap_root.h), with
// the real NCCL and the real helper beside the tandem binary: ncclGetUniqueId needs no GPU (it
// opens a socket and starts NCCL's root thread), so these run wherever the CUDA backend is
// built.
#include <signal.h>
#include <sys/types.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>

#include "kvtransfer/nccl/nccl_bootstrap_root.h"
#include "kvtransfer/nccl_protocol.h"
#include "tests/tandem_binary.h"
#include "tests/unit/test_util.h"

using namespace tandem;
using namespace std::chrono_literals;

namespace {

size_t ThreadsOf(const std::string& pid) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + pid + "/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

bool Running(pid_t pid) { return ::kill(pid, 0) == 0; }  // a reaped child is gone (ESRCH)

// The helper as the tandem binary finds it.
std::string Helper() { return NcclRootHelperBeside(test::TandemBinary()); }

}  // namespace

TEST_CASE("nccl bootstrap root: the tandem binary finds its helper", "[nccl]") {
  const std::string helper = Helper();
  CHECK(std::filesystem::path(helper).filename() == "tandem-nccl-root");
  CHECK(std::filesystem::path(helper).parent_path() ==
        std::filesystem::canonical(test::TandemBinary()).parent_path());
  CHECK(NcclRootHelperBeside("/bin/true").empty());  // none beside it
  // And says so, for an operator to see.
  const test::CommandResult version = test::RunCommand(std::string(test::TandemBinary()) +
                                                       " --version");
  CHECK(version.exit_code == 0);
  CHECK_THAT(version.output, Catch::Contains("NCCL bootstrap roots: in children, " + helper));
}

TEST_CASE("nccl bootstrap root: a child hosts the root and ends with its holder", "[nccl]") {
  const size_t threads_here = ThreadsOf("self");
  pid_t pid = -1;
  {
    StatusOr<std::unique_ptr<NcclBootstrapRoot>> root =
        NcclBootstrapRoot::Start(Helper(), 20s);
    INFO(root.status().ToString());
    REQUIRE(root.ok());
    const std::string& id = (*root)->unique_id();
    CHECK(id.size() == kNcclUniqueIdBytes);
    CHECK(id != std::string(kNcclUniqueIdBytes, '\0'));
    pid = (*root)->pid();
    CHECK(Running(pid));
    // NCCL's root thread runs in the child (its main thread waits beside it), not here.
    CHECK(ThreadsOf(std::to_string(pid)) >= 2);
    CHECK(ThreadsOf("self") == threads_here);

    StatusOr<std::unique_ptr<NcclBootstrapRoot>> other =
        NcclBootstrapRoot::Start(Helper(), 20s);
    REQUIRE(other.ok());
    CHECK((*other)->unique_id() != id);
  }
  CHECK_FALSE(Running(pid));  // ended and reaped
}

TEST_CASE("nccl bootstrap root: a binary that makes no id is refused, naming why", "[nccl]") {
  StatusOr<std::unique_ptr<NcclBootstrapRoot>> silent = NcclBootstrapRoot::Start("/bin/true", 20s);
  REQUIRE_FALSE(silent.ok());
  CHECK(silent.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(silent.status().message(), Catch::Contains("ended without a unique id"));

  StatusOr<std::unique_ptr<NcclBootstrapRoot>> missing =
      NcclBootstrapRoot::Start("/nonexistent/tandem", 20s);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.status().message(), Catch::Contains("cannot start /nonexistent/tandem"));

  // One that never answers: the start timeout ends the wait, and the child.
  StatusOr<std::unique_ptr<NcclBootstrapRoot>> stuck = NcclBootstrapRoot::Start("/bin/cat", 200ms);
  REQUIRE_FALSE(stuck.ok());
  CHECK(stuck.status().code() == StatusCode::kDeadlineExceeded);
}

TEST_CASE("nccl bootstrap roots: spares made ahead, each id's child claimed once", "[nccl]") {
  NcclBootstrapRoots roots(Helper(), 2);
  REQUIRE(test::Eventually([&] { return roots.ready_spares() == 2; }, 30s));
  StatusOr<std::string> a = roots.NewUniqueId(), b = roots.NewUniqueId();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a != *b);
  CHECK(roots.in_process_ids() == 0);

  std::unique_ptr<NcclBootstrapRoot> child = roots.Claim(*a);
  REQUIRE(child != nullptr);
  CHECK(child->unique_id() == *a);
  CHECK(Running(child->pid()));
  CHECK(roots.Claim(*a) == nullptr);  // once
  // Both taken spares are replaced; b's child stays unclaimed until `roots` ends it.
  CHECK(test::Eventually([&] { return roots.ready_spares() == 2; }, 30s));
  const pid_t pid = child->pid();
  child.reset();
  CHECK_FALSE(Running(pid));
}

TEST_CASE("nccl bootstrap roots: without children, ids are made in this process", "[nccl]") {
  NcclBootstrapRoots roots("/bin/true", 1);  // every start fails: logged, retried later
  StatusOr<std::string> id = roots.NewUniqueId();
  INFO(id.status().ToString());
  REQUIRE(id.ok());
  CHECK(id->size() == kNcclUniqueIdBytes);
  CHECK(roots.in_process_ids() == 1);
  CHECK(roots.Claim(*id) == nullptr);
}
