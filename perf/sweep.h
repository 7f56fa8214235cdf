// `tandem bench sweep`: goodput of local clusters, measured (and simulated beside it).
//
//   tandem bench sweep --cluster NAME=CONFIG.yaml [--cluster ...] --workload W[,W2]
//       --slo-ttft X --slo-tpot Y [--rates R1,R2,...] [--num-requests N | --duration-s D]
//       [--target 0.9] [--cores-per NAME=K] [--latency-model LM.yaml] [--out-dir DIR]
//       [--binary PATH] [--seed S] [--slo-scale-rate R] [--max-model-len L]
//
// --max-model-len sets the scale of the workload lengths (cluster/workload.h), default each
// config's model.max_model_len.
//
// For each cluster, in order: starts `BINARY up CONFIG --slo.ttft_s=X --slo.tpot_s=Y
// [--router.latency_model=LM.yaml]` (the router admits and places by the sweep's SLOs, and by
// the latency model the simulator uses; own process group, stdout and stderr
// to DIR/NAME.log, SIGTERM to it should the sweep die), waits (bounded) for its line
// "tandem: ready at http://HOST:PORT (model NAME)", then for each workload runs the rates in
// increasing order (the same seed at every rate: every cluster sees the same requests at a
// given rate) until the first rate whose SLO attainment is below the target; then SIGTERM to
// the cluster, SIGKILL after --stop-timeout-s. With --latency-model every measured run is also
// simulated (cluster/simulator.h) on the same requests and the cluster's config; a simulator
// error is printed and the sweep goes on. During each run the sweep also reads the router's
// /metrics once a second for tandem_router_decode_model_correction (measured / modelled decode
// forward pass): the machine's speed against its profile during that run, "measured_speed"
// (null when no decode step was measured). With a latency model the run is simulated a second
// time with decode at that speed and prefill as profiled (SimulationOptions::decode_time_scale;
// the simulated router keeps the profile and corrects for it as the real one does):
// "simulated_at_measured_speed".
// The first simulation predicts from the profile alone; the second tells a wrong model of the
// cluster (both miss) from a machine that ran faster or slower than when it was profiled.
//
// Goodput = the highest measured rate with attainment >= target (0 when the first fails);
// "crossing" = the rate where attainment crosses the target, interpolated linearly between the
// last passing and the first failing point (the last rate when none failed, 0 when the first
// rate already failed). Per-core goodput =
// goodput / cores, cores = sum over instance sections of instances * threads, or --cores-per.
// When every rate met the target the goodput is a lower bound (marked "+" and "lower_bound").
//
// DIR gets: NAME_WORKLOAD_rRATE.json per run (as `tandem bench --out`, plus "simulated",
// "measured_speed" and "simulated_at_measured_speed"), sweep.json (every point, goodput rows,
// SLO-scale curves), NAME.log per cluster, and for each workload attainment_W.{gp,png} (+ one
// .dat per cluster: rate, measured, simulated, simulated at measured speed) and
// slo_scale_W.{dat,gp,png}: attainment when both SLOs are scaled by 0.25..4, rescored from each
// cluster's run at the highest rate every cluster ran (or --slo-scale-rate). `gnuplot X.gp`
// in DIR remakes a plot. A table (cluster x workload: goodput, crossing, cores, per-core
// goodput, ratio to the first cluster) ends the output.
//
// Exit codes: 0 when every cluster ran and the plots were made, 1 otherwise (after writing
// what there is), 2 for a bad flag.
#pragma once

#include <string>
#include <vector>

namespace tandem {

int SweepMain(const std::vector<std::string>& args);

// The goodput of one (cluster, workload) from its measured points, rates ascending.
struct GoodputEstimate {
  double goodput = 0;        // highest rate with attainment >= target, 0 if none
  double crossing = 0;       // interpolated crossing of the target
  bool lower_bound = false;  // no rate fell below the target: goodput is at least this
};
GoodputEstimate EstimateGoodput(const std::vector<double>& rates,
                                const std::vector<double>& attainments, double target);

}  // namespace tandem
