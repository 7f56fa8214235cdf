// `tandem bench`: the OpenAI-API load generator, and `tandem bench sweep` (perf/sweep.h).
//
//   tandem bench --url http://127.0.0.1:8000
//       (--workload chatbot|chatbot-history|code|summarization [--seed S] [--num-requests N] | --trace FILE)
//       (--rate R | --concurrency C) [--duration-s D] --slo-ttft X --slo-tpot Y
//       [--model NAME] [--max-model-len L] [--out results.json] [--quiet]
//
// Sends the workload (cluster/workload.h) to the server (perf/bench_client.h: streaming
// /v1/completions, one connection per request, open loop at the arrival times with --rate,
// closed loop with --concurrency), scores it with Summarize and prints the table. --out writes
//   {"config": {...flags, model, max_model_len, started_at},
//    "summary": {RunSummary fields},
//    "requests": [{RequestOutcome fields, "max_tokens"}, ...]}
// --model / --max-model-len default to what GET /v1/models says. With a trace, --rate replaces
// the trace's arrival times by seeded Poisson arrivals; without it they are replayed.
// Exit codes: 0 after a run in which some request completed, 1 when none did or the server
// cannot be reached, 2 for a bad flag (the message names it).
#pragma once

#include <string>
#include <vector>

namespace tandem {

int BenchMain(const std::vector<std::string>& args);

}  // namespace tandem
