#include "router/request_phase.h"

#include <string>

#include "common/base/status.h"

namespace tandem {

const char* RequestPhaseName(RequestPhase phase) {
  switch (phase) {
    case RequestPhase::kPrefilling: return "prefilling";
    case RequestPhase::kHandingOff: return "handing_off";
    case RequestPhase::kDecoding: return "decoding";
    case RequestPhase::kColocated: return "colocated";
    case RequestPhase::kCancelling: return "cancelling";
    case RequestPhase::kFinished: return "finished";
  }
  return "?";
}

bool IsLegalTransition(RequestPhase from, RequestPhase to) {
  using P = RequestPhase;
  if (from == P::kFinished) return false;
  if (to == P::kFinished) return true;
  switch (to) {
    case P::kHandingOff: return from == P::kPrefilling;
    case P::kDecoding:
      return from == P::kPrefilling || from == P::kHandingOff || from == P::kDecoding;
    case P::kCancelling: return from != P::kCancelling;
    case P::kPrefilling:
    case P::kColocated:
    case P::kFinished:
      return false;  // initial phases are set at placement, never entered again
  }
  return false;
}

RequestPhase Advance(RequestPhase from, RequestPhase to) {
  TANDEM_CHECK(IsLegalTransition(from, to), std::string("illegal request transition ") +
                                                RequestPhaseName(from) + " -> " +
                                                RequestPhaseName(to));
  return to;
}

}  // namespace tandem
