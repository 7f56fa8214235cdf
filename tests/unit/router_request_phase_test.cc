// The router's per-request phases: which transitions are legal.
#include <catch2/catch.hpp>

#include "router/request_phase.h"

namespace tandem {
namespace {

using P = RequestPhase;

TEST_CASE("request phase: the legal transitions and only those", "[router]") {
  const P all[] = {P::kPrefilling, P::kHandingOff, P::kDecoding,
                   P::kColocated,  P::kCancelling, P::kFinished};
  auto legal = [](P from, P to) {
    if (from == P::kFinished) return false;
    if (to == P::kFinished) return true;
    if (to == P::kHandingOff) return from == P::kPrefilling;
    if (to == P::kDecoding)
      return from == P::kPrefilling || from == P::kHandingOff || from == P::kDecoding;
    if (to == P::kCancelling) return from != P::kCancelling;
    return false;
  };
  for (P from : all) {
    for (P to : all) {
      INFO(RequestPhaseName(from) << " -> " << RequestPhaseName(to));
      CHECK(IsLegalTransition(from, to) == legal(from, to));
    }
  }
  // The paths a request takes.
  CHECK(Advance(Advance(Advance(P::kPrefilling, P::kHandingOff), P::kDecoding), P::kFinished) ==
        P::kFinished);
  CHECK(Advance(Advance(P::kColocated, P::kCancelling), P::kFinished) == P::kFinished);
  CHECK(Advance(P::kPrefilling, P::kDecoding) == P::kDecoding);  // decode's output overtook
}

}  // namespace
}  // namespace tandem
