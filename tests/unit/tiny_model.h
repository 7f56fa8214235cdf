// The built-in tiny model (`tandem make-model --preset tiny`) loaded as the router serves it:
// made once per test process and per max_model_len, for tests that need a real tokenizer and
// chat template but no forward pass.
#pragma once

#include <map>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

#include "cluster/make_model_cli.h"
#include "router/openai_api.h"
#include "tests/unit/test_util.h"

namespace tandem::test {

inline const ServedModel& TinyServedModel(int max_model_len = 256) {
  static TempDir* dir = new TempDir();  // leaked: the models live for the process
  static auto* models = new std::map<int, ServedModel>();
  auto it = models->find(max_model_len);
  if (it != models->end()) return it->second;
  const std::string out = (dir->path() / "tiny").string();
  if (models->empty()) REQUIRE(MakeModelMain({"--preset", "tiny", "--out", out}) == 0);
  StatusOr<ServedModel> loaded = LoadServedModel(out, "tiny", "auto", max_model_len);
  REQUIRE(loaded.ok());
  return models->emplace(max_model_len, std::move(loaded).value()).first->second;
}

}  // namespace tandem::test
