// `tandem bench sweep`, report: goodput per cluster and workload, SLO-scale curves, sweep.json,
// the plots (data files, gnuplot scripts, PNGs) and the table. perf/sweep_internal.h.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <thread>

#include "perf/bench_report.h"
#include "perf/sweep_internal.h"

namespace tandem::sweep {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// The SLO scales of the SLO-scale curves: both objectives times each.
const std::vector<double> kSloScales = {0.25, 0.354, 0.5, 0.707, 1, 1.414, 2, 2.83, 4};
const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

// Runs `gnuplot SCRIPT` in `dir`, bounded; true on exit 0.
bool RunGnuplot(const std::string& dir, const std::string& script) {
  pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (::chdir(dir.c_str()) != 0) ::_exit(127);
    ::execlp("gnuplot", "gnuplot", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string GnuplotQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

struct GoodputRow {
  std::string cluster, workload;
  GoodputEstimate estimate;
  int cores = 0;
  double per_core = 0;
  double ratio = NAN;  // per-core goodput / the first cluster's
  bool measured = false;
};

std::vector<GoodputRow> GoodputRows(const SweepOptions& options,
                                    const std::vector<SweepPoint>& points) {
  std::vector<GoodputRow> rows;
  for (const std::string& workload : options.workloads) {
    double base_per_core = NAN;
    for (size_t c = 0; c < options.clusters.size(); ++c) {
      std::vector<double> r, a;  // ascending rates (points are kept so)
      for (const SweepPoint& p : points)
        if (p.cluster == options.clusters[c].name && p.workload == workload) {
          r.push_back(p.rate);
          a.push_back(p.measured.attainment);
        }
      GoodputRow row;
      row.cluster = options.clusters[c].name;
      row.workload = workload;
      row.measured = !r.empty();
      row.estimate = EstimateGoodput(r, a, options.target);
      row.cores = options.clusters[c].cores;
      row.per_core = row.cores > 0 ? row.estimate.goodput / row.cores : 0;
      if (c == 0 && row.measured) base_per_core = row.per_core;
      if (row.measured && base_per_core > 0) row.ratio = row.per_core / base_per_core;
      rows.push_back(row);
    }
  }
  return rows;
}

// The rate of a workload's SLO-scale curves: --slo-scale-rate, else the highest rate that every
// cluster which ran the workload measured; 0 when there is none.
double SloScaleRate(const SweepOptions& options, const std::vector<SweepPoint>& points,
                    const std::string& workload) {
  if (options.slo_scale_rate) return *options.slo_scale_rate;
  double chosen = 0;
  for (double rate : options.rates) {
    bool everyone = true, anyone = false;
    for (const ClusterSpec& spec : options.clusters) {
      bool has = false, ran = false;
      for (const SweepPoint& p : points)
        if (p.cluster == spec.name && p.workload == workload) {
          ran = true;
          has = has || p.rate == rate;
        }
      if (ran && !has) everyone = false;
      anyone = anyone || has;
    }
    if (everyone && anyone) chosen = rate;
  }
  return chosen;
}

// Per workload: each cluster's run at one rate rescored with both SLOs scaled.
json SloScaleCurves(const SweepOptions& options, const std::vector<SweepPoint>& points) {
  json slo_scale = json::array();
  for (const std::string& workload : options.workloads) {
    const double chosen = SloScaleRate(options, points, workload);
    if (chosen <= 0) continue;
    json curves = json::object();
    for (const SweepPoint& p : points) {
      if (p.workload != workload || p.rate != chosen) continue;
      json curve = json::array();
      for (double s : kSloScales) {
        RunSummary rescored =
            Summarize(p.outcomes, Slo{options.slo_ttft * s, options.slo_tpot * s});
        curve.push_back({{"scale", s}, {"attainment", rescored.attainment}});
      }
      curves[p.cluster] = curve;
    }
    slo_scale.push_back({{"workload", workload}, {"rate", chosen}, {"curves", curves}});
  }
  return slo_scale;
}

json SweepJson(const SweepResult& result, const std::vector<GoodputRow>& rows,
               const json& slo_scale) {
  json points_json = json::array();
  for (const SweepPoint& p : result.points) {
    json j = {{"cluster", p.cluster},
              {"workload", p.workload},
              {"rate", p.rate},
              {"run_file", p.run_file},
              {"measured", SummaryToJson(p.measured)},
              {"simulated", p.simulated ? SummaryToJson(p.simulated_summary) : json(nullptr)}};
    if (!p.simulated_error.empty()) j["simulated_error"] = p.simulated_error;
    j["measured_speed"] = p.measured_speed > 0 ? json(p.measured_speed) : json(nullptr);
    j["simulated_at_measured_speed"] =
        p.simulated_at_speed ? SummaryToJson(p.simulated_at_speed_summary) : json(nullptr);
    points_json.push_back(j);
  }
  json goodput_json = json::array();
  for (const GoodputRow& row : rows) {
    goodput_json.push_back(
        {{"cluster", row.cluster},
         {"workload", row.workload},
         {"measured", row.measured},
         {"goodput_rps", row.estimate.goodput},
         {"crossing_rps", row.estimate.crossing},
         {"lower_bound", row.estimate.lower_bound},
         {"cores", row.cores},
         {"goodput_per_core", row.per_core},
         {"ratio_vs_first", std::isnan(row.ratio) ? json(nullptr) : json(row.ratio)}});
  }
  return {{"config", result.config},
          {"points", points_json},
          {"goodput", goodput_json},
          {"slo_scale", slo_scale}};
}

std::string SloText(const SweepOptions& options) {
  char text[128];
  std::snprintf(text, sizeof text, "TTFT <= %g s, TPOT <= %g s", options.slo_ttft,
                options.slo_tpot);
  return text;
}

// attainment_W.png: attainment against rate per cluster, measured and simulated. True when
// written (or nothing to plot).
bool PlotAttainment(const SweepOptions& options, const std::vector<SweepPoint>& points,
                    const std::string& workload) {
  bool ok = true;
  std::vector<std::string> plot_items;
  for (size_t c = 0; c < options.clusters.size(); ++c) {
    const std::string& name = options.clusters[c].name;
    std::string data;
    bool any = false, any_sim = false, any_at_speed = false;
    for (const SweepPoint& p : points) {
      if (p.cluster != name || p.workload != workload) continue;
      any = true;
      any_sim = any_sim || p.simulated;
      any_at_speed = any_at_speed || p.simulated_at_speed;
      data += FormatNumber(p.rate) + " " + FormatNumber(p.measured.attainment) + " " +
              FormatNumber(p.simulated ? p.simulated_summary.attainment : NAN) + " " +
              FormatNumber(p.simulated_at_speed ? p.simulated_at_speed_summary.attainment : NAN) +
              "\n";
    }
    if (!any) continue;
    const std::string file = "attainment_" + workload + "_" + name + ".dat";
    if (!WriteTextFile(options.PathIn(file),
                       "# rate measured_attainment simulated_attainment "
                       "simulated_at_measured_speed_attainment\n" +
                           data)
             .ok())
      ok = false;
    const std::string color = kColors[c % std::size(kColors)];
    plot_items.push_back(GnuplotQuote(file) + " using 1:2 with linespoints lw 2 pt 7 lc rgb '" +
                         color + "' title " + GnuplotQuote(name));
    if (any_sim)
      plot_items.push_back(GnuplotQuote(file) +
                           " using 1:3 with linespoints lw 2 dt 2 pt 6 lc rgb '" + color +
                           "' title " + GnuplotQuote(name + " (simulated)"));
    if (any_at_speed)
      plot_items.push_back(GnuplotQuote(file) +
                           " using 1:4 with linespoints lw 1.5 dt 3 pt 4 lc rgb '" + color +
                           "' title " + GnuplotQuote(name + " (simulated at measured speed)"));
  }
  if (plot_items.empty()) return ok;
  std::string script = "set terminal pngcairo size 900,600 enhanced font 'sans,11'\n";
  script += "set output " + GnuplotQuote("attainment_" + workload + ".png") + "\n";
  script += "set title " +
            GnuplotQuote(workload + ": SLO attainment vs rate (" + SloText(options) + ")") +
            " noenhanced\n";
  script += "set xlabel 'rate (requests/s)'\nset ylabel 'SLO attainment'\n";
  script += "set yrange [0:1.05]\nset xrange [0:*]\nset grid\nset key bottom left noenhanced\n";
  script += "plot ";
  for (const std::string& item : plot_items) script += item + ", \\\n     ";
  script +=
      FormatNumber(options.target) + " with lines dt 3 lw 1.5 lc rgb '#555555' title 'target'\n";
  const std::string gp = "attainment_" + workload + ".gp";
  return WriteTextFile(options.PathIn(gp), script).ok() && RunGnuplot(options.out_dir, gp) && ok;
}

// slo_scale_W.png from one workload's entry of SloScaleCurves.
bool PlotSloScale(const SweepOptions& options, const json& entry) {
  const std::string workload = entry["workload"].get<std::string>();
  std::vector<std::string> names;
  for (auto it = entry["curves"].begin(); it != entry["curves"].end(); ++it)
    names.push_back(it.key());
  if (names.empty()) return true;
  // Clusters in --cluster order (json objects are sorted by key).
  std::vector<std::string> ordered;
  for (const ClusterSpec& spec : options.clusters)
    if (std::find(names.begin(), names.end(), spec.name) != names.end())
      ordered.push_back(spec.name);
  std::string data = "# scale";
  for (const std::string& name : ordered) data += " " + name;
  data += "\n";
  for (size_t i = 0; i < kSloScales.size(); ++i) {
    data += FormatNumber(kSloScales[i]);
    for (const std::string& name : ordered)
      data += " " + FormatNumber(entry["curves"][name][i]["attainment"].get<double>());
    data += "\n";
  }
  const std::string file = "slo_scale_" + workload + ".dat";
  bool ok = WriteTextFile(options.PathIn(file), data).ok();
  std::string script = "set terminal pngcairo size 900,600 enhanced font 'sans,11'\n";
  script += "set output " + GnuplotQuote("slo_scale_" + workload + ".png") + "\n";
  script += "set title " +
            GnuplotQuote(workload + ": SLO attainment vs SLO scale at " +
                         RateLabel(entry["rate"].get<double>()) +
                         " req/s (scale 1: " + SloText(options) + ")") +
            " noenhanced\n";
  script +=
      "set xlabel 'SLO scale (TTFT and TPOT objectives x scale)'\n"
      "set ylabel 'SLO attainment'\nset logscale x 2\nset xrange [0.25:4]\n"
      "set yrange [0:1.05]\nset grid\nset key bottom right noenhanced\nplot ";
  for (size_t i = 0; i < ordered.size(); ++i) {
    size_t c = 0;
    while (c < options.clusters.size() && options.clusters[c].name != ordered[i]) ++c;
    script += GnuplotQuote(file) + " using 1:" + std::to_string(i + 2) +
              " with linespoints lw 2 pt 7 lc rgb '" + kColors[c % std::size(kColors)] +
              "' title " + GnuplotQuote(ordered[i]) + ", \\\n     ";
  }
  script +=
      FormatNumber(options.target) + " with lines dt 3 lw 1.5 lc rgb '#555555' title 'target'\n";
  const std::string gp = "slo_scale_" + workload + ".gp";
  return WriteTextFile(options.PathIn(gp), script).ok() && RunGnuplot(options.out_dir, gp) && ok;
}

void PrintGoodputTable(const SweepOptions& options, const std::vector<GoodputRow>& rows) {
  std::printf("\ngoodput at SLO attainment >= %g (%s)\n", options.target, SloText(options).c_str());
  std::printf("%-16s %-14s %12s %13s %6s %15s %9s\n", "cluster", "workload", "goodput_rps",
              "crossing_rps", "cores", "per_core_rps", "vs_first");
  for (const GoodputRow& row : rows) {
    if (!row.measured) {
      std::printf("%-16s %-14s %12s\n", row.cluster.c_str(), row.workload.c_str(), "not run");
      continue;
    }
    char ratio[32] = "-";
    if (!std::isnan(row.ratio)) std::snprintf(ratio, sizeof ratio, "%.2fx", row.ratio);
    const char* plus = row.estimate.lower_bound ? "+" : " ";
    std::printf("%-16s %-14s %11.3f%s %12.3f%s %6d %14.4f%s %9s\n", row.cluster.c_str(),
                row.workload.c_str(), row.estimate.goodput, plus, row.estimate.crossing, plus,
                row.cores, row.per_core, plus, ratio);
  }
  if (std::any_of(rows.begin(), rows.end(),
                  [](const GoodputRow& r) { return r.estimate.lower_bound; }))
    std::printf("+ every rate met the target: goodput is at least this (add higher --rates)\n");
  std::printf("\nwrote %s (sweep.json, per-run JSON, plots)\n", options.out_dir.c_str());
}

}  // namespace

std::string RateLabel(double rate) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", rate);
  return buf;
}

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "NaN";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

bool ReportSweep(const SweepOptions& options, const SweepResult& result) {
  const std::vector<GoodputRow> rows = GoodputRows(options, result.points);
  const json slo_scale = SloScaleCurves(options, result.points);
  bool written = true;
  if (Status s = WriteTextFile(options.PathIn("sweep.json"),
                               SweepJson(result, rows, slo_scale).dump(1) + "\n");
      !s.ok()) {
    std::fprintf(stderr, "tandem bench sweep: %s\n", s.message().c_str());
    written = false;
  }
  bool plots_ok = true;
  for (const std::string& workload : options.workloads)
    plots_ok = PlotAttainment(options, result.points, workload) && plots_ok;
  for (const json& entry : slo_scale) plots_ok = PlotSloScale(options, entry) && plots_ok;
  if (!plots_ok)
    std::fprintf(stderr,
                 "tandem bench sweep: some plots were not made (is gnuplot with the "
                 "pngcairo terminal installed?)\n");
  PrintGoodputTable(options, rows);
  return written && plots_ok;
}

}  // namespace tandem::sweep
