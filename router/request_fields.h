// The request fields each OpenAI endpoint of the router accepts: an explicit allowlist, so that
// no field is accepted and silently ignored (DESIGN.md: "A value the config or the API accepts
// has its effect"). Every top-level field of a body is one of:
//   - implemented: ParseApiRequest (router/openai_api.cc) reads it and gives it its effect;
//   - refused: a feature Tandem does not have (beam search, guided decoding, tools, prompt
//     logprobs, ...). null, or the one value that asks for nothing (false, "", [], "none",
//     {"type": "text"}, best_of == n), is accepted; anything else is a 400 naming the field;
//   - unknown (or the other endpoint's field, e.g. "prompt" on chat): a 400 "Unrecognized
//     request argument supplied: <field>", as OpenAI answers.
// The names follow OpenAI's API and vLLM's extensions to it. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/base/status.h"
#include "router/openai_api.h"

namespace tandem {

// Checks the top-level fields of `body` (a JSON object) against `kind`'s allowlist. On error
// returns InvalidArgument and sets *param to the offending field.
Status CheckRequestFields(ApiKind kind, const nlohmann::json& body, std::string* param);

// Checks the keys of messages[index] (an object): role and content are read; a null value is
// "not given"; tool_calls (unless empty), tool_call_id, function_call and name are refused;
// any other key is unrecognized. On error sets *param to "messages" (the message names the
// key, e.g. "'messages[1].tool_calls' is not supported").
Status CheckMessageFields(const nlohmann::json& message, size_t index, std::string* param);

// The fields `kind` implements (read and given their effect), sorted; for tests and docs.
std::vector<std::string> ImplementedFields(ApiKind kind);

}  // namespace tandem
