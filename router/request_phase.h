// Where one router request stands between placement and its final event: one enum and one
// transition function (ClusterBackend's per-request state; router/cluster_backend.h).
//
//   kPrefilling --first token--> kHandingOff --decode output--> kDecoding
//        |   (decode output that overtook the first token is held back; when the first token
//        |    comes after some, the request goes straight to kDecoding)
//   kColocated (on a colocated instance from placement to the end)
//   kPrefilling | kHandingOff | kDecoding | kColocated --Cancel--> kCancelling
//   any phase but kFinished --final event queued--> kFinished
//
// Which instances hold a request (and fail it when their connection drops): kPrefilling: the
// prefill and the decode instance; kHandingOff, kDecoding: the decode instance; kColocated: the
// colocated one; kCancelling: every instance of the request; kFinished: none.
//
// Pure; any thread.
#pragma once

#include <cstdint>

namespace tandem {

enum class RequestPhase : uint8_t {
  kPrefilling,   // sent to prefill; its first token has not reached the router
  kHandingOff,   // the first token came; the decode instance has sent nothing yet
  kDecoding,     // the decode instance has sent tokens
  kColocated,    // placed on a colocated instance
  kCancelling,   // Cancel sent to its instances; waiting for a Finish (bounded by a grace)
  kFinished,     // its final event is queued; no other event follows
};

const char* RequestPhaseName(RequestPhase phase);

// True when `from` -> `to` is one of the arrows above (staying in kDecoding is allowed: every
// decode output is an arrow into it).
bool IsLegalTransition(RequestPhase from, RequestPhase to);

// Returns `to`; aborts (TANDEM_CHECK) naming both phases when the transition is illegal.
RequestPhase Advance(RequestPhase from, RequestPhase to);

}  // namespace tandem
