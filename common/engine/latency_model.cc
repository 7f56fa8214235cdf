#include "common/engine/latency_model.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "common/config/yaml_fields.h"

namespace tandem {

double LatencyModel::PrefillSeconds(std::span<const int64_t> prompt_lengths) const {
  double sum = 0, sum_sq = 0;
  for (int64_t l : prompt_lengths) {
    sum += static_cast<double>(l);
    sum_sq += static_cast<double>(l) * static_cast<double>(l);
  }
  return PrefillSeconds(sum, sum_sq);
}

double LatencyModel::PrefillSeconds(double sum_tokens, double sum_tokens_squared) const {
  return std::max(0.0, c1 + c2 * sum_tokens + c3 * sum_tokens_squared);
}

double LatencyModel::DecodeStepSeconds(double batch, double sum_context) const {
  return std::max(0.0, c4 + c5 * batch + c6 * sum_context);
}

double LatencyModel::MixedStepSeconds(std::span<const int64_t> chunk_new,
                                      std::span<const int64_t> chunk_past, int64_t decode_batch,
                                      double sum_context) const {
  double tokens = 0, attention = 0;
  for (size_t j = 0; j < chunk_new.size(); ++j) {
    double n = static_cast<double>(chunk_new[j]);
    double p = j < chunk_past.size() ? static_cast<double>(chunk_past[j]) : 0.0;
    tokens += n;
    attention += n * (n + 2.0 * p);
  }
  double fixed = chunk_new.empty() ? c4 : (decode_batch > 0 ? std::max(c1, c4) : c1);
  return std::max(0.0, fixed + c2 * tokens + c3 * attention +
                           c5 * static_cast<double>(decode_batch) + c6 * sum_context);
}

double TransferModel::Seconds(double bytes) const {
  return latency_s + (bytes_per_s > 0 ? bytes / bytes_per_s : 0.0);
}

bool IsLatencyModelRole(const std::string& role) {
  return role == "prefill" || role == "decode" || role == "colocated";
}

const LatencyModel* LatencyModelFile::Find(const std::string& device, int threads,
                                           int tensor_parallel, int pipeline_parallel,
                                           const std::string& role) const {
  for (const LatencyModel& m : entries) {
    if (!device.empty() && m.device != device) continue;
    if (m.role != role) continue;
    if (m.threads == threads && m.tensor_parallel == tensor_parallel &&
        m.pipeline_parallel == pipeline_parallel)
      return &m;
  }
  return nullptr;
}
const LatencyModel* LatencyModelFile::ForInstance(const std::string& device, int threads,
                                                  int tensor_parallel, int pipeline_parallel,
                                                  const std::string& role) const {
  const LatencyModel* any_role = nullptr;
  for (const LatencyModel& m : entries) {
    const bool same_device = device == "cuda" ? m.device != "cpu" : m.device == device;
    if (!same_device || m.tensor_parallel != tensor_parallel ||
        m.pipeline_parallel != pipeline_parallel)
      continue;
    if (m.device == "cpu" && m.threads != threads) continue;
    if (!role.empty() && m.role == role) return &m;
    if (m.role.empty() && any_role == nullptr) any_role = &m;
  }
  return any_role;
}

namespace {

// ---- YAML reading: every error names file:line:column and the dotted field ----------------

void ReadEntry(YamlErrors* errors, const YAML::Node& node, const std::string& prefix,
               LatencyModel* m) {
  YamlFields f(errors, node, prefix, /*must_exist=*/true);
  if (!f.valid()) return;
  constexpr double kAny = -std::numeric_limits<double>::infinity();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  f.String("model", &m->model);
  f.String("device", &m->device);
  if (m->device.empty()) errors->Add(node["device"], f.Field("device"), "must not be empty");
  f.Int("threads", &m->threads, 1, 1 << 16);
  f.Int("tensor_parallel", &m->tensor_parallel, 1, 1 << 16);
  f.Int("pipeline_parallel", &m->pipeline_parallel, 1, 1 << 16);
  f.String("role", &m->role);
  if (!m->role.empty() && !IsLatencyModelRole(m->role))
    errors->Add(node["role"], f.Field("role"),
                "must be prefill|decode|colocated (or absent: any role), got '" + m->role + "'");
  if (YAML::Node p = f.Child("prefill", true)) {
    YamlFields pf(errors, p, f.Field("prefill"));
    pf.Double("c1", &m->c1, kAny, kInf, true);
    pf.Double("c2", &m->c2, kAny, kInf, true);
    pf.Double("c3", &m->c3, kAny, kInf, true);
  }
  if (YAML::Node d = f.Child("decode", true)) {
    YamlFields df(errors, d, f.Field("decode"));
    df.Double("c4", &m->c4, kAny, kInf, true);
    df.Double("c5", &m->c5, kAny, kInf, true);
    df.Double("c6", &m->c6, kAny, kInf, true);
  }
  f.Double("kv_bytes_per_token", &m->kv_bytes_per_token, 0, kInf);
  f.Int("max_batch_size", &m->max_batch_size, 0, 1 << 20);
  if (YAML::Node q = f.Child("fit", false)) {
    YamlFields qf(errors, q, f.Field("fit"));
    qf.Double("prefill_r2", &m->fit.prefill_r2, kAny, kInf);
    qf.Double("decode_r2", &m->fit.decode_r2, kAny, kInf);
    qf.Double("prefill_max_rel_error", &m->fit.prefill_max_rel_error, 0, kInf);
    qf.Double("decode_max_rel_error", &m->fit.decode_max_rel_error, 0, kInf);
  }
}

// ---- YAML writing -------------------------------------------------------------------------

// Plain when it cannot be mistaken for anything but a string of safe characters.
std::string QuoteString(const std::string& s) {
  bool plain = !s.empty() && (std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_' ||
                              s[0] == '/');
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '/')) plain = false;
  }
  static const std::set<std::string> kReserved = {"true", "false", "yes", "no", "on", "off",
                                                   "null", "True", "False", "Null", "NULL",
                                                   "TRUE", "FALSE", "Yes", "No", "Y", "N", "y",
                                                   "n", "On", "Off"};
  if (plain && !kReserved.count(s)) return s;
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\x%02x", c);
      out += buffer;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// ---- Least squares ------------------------------------------------------------------------

// Solves min sum_i w_i^2 (x_i . beta - y_i)^2 for 3 coefficients (prefill: w = 1, ordinary
// least squares; decode: w = 1 / seconds, see FitDecode): rows scaled by w_i, columns
// scaled to unit norm (the columns differ by up to 10 orders of magnitude: 1, tokens, tokens^2),
// then the 3x3 normal equations in long double with partial pivoting.
Status Solve3(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
              const std::vector<double>& w, std::array<double, 3>* beta) {
  std::array<long double, 3> scale{};
  for (size_t i = 0; i < x.size(); ++i)
    for (int j = 0; j < 3; ++j) scale[j] += static_cast<long double>(x[i][j] * w[i]) * x[i][j] * w[i];
  for (int j = 0; j < 3; ++j) {
    if (scale[j] <= 0) return InvalidArgument("singular fit: a column is all zeros");
    scale[j] = std::sqrt(scale[j]);
  }
  long double a[3][4] = {};
  for (size_t i = 0; i < x.size(); ++i) {
    long double row[3];
    for (int j = 0; j < 3; ++j) row[j] = x[i][j] * w[i] / scale[j];
    long double yi = static_cast<long double>(y[i]) * w[i];
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 3; ++c) a[r][c] += row[r] * row[c];
      a[r][3] += row[r] * yi;
    }
  }
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    // Unit-norm columns make the diagonal 1; a pivot this small means dependent columns.
    if (std::fabs(a[pivot][col]) < 1e-12L)
      return InvalidArgument("singular fit: the samples do not separate the coefficients");
    if (pivot != col)
      for (int c = 0; c < 4; ++c) std::swap(a[col][c], a[pivot][c]);
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      long double f = a[r][col] / a[col][col];
      for (int c = col; c < 4; ++c) a[r][c] -= f * a[col][c];
    }
  }
  for (int j = 0; j < 3; ++j) (*beta)[j] = static_cast<double>(a[j][3] / a[j][j] / scale[j]);
  return Status::Ok();
}

struct Quality {
  double r2 = 0;
  double max_rel_error = 0;
};

Quality Measure(const std::vector<double>& measured, const std::vector<double>& predicted) {
  double mean = 0;
  for (double y : measured) mean += y;
  mean /= static_cast<double>(measured.size());
  double ss_res = 0, ss_tot = 0;
  Quality q;
  for (size_t i = 0; i < measured.size(); ++i) {
    ss_res += (measured[i] - predicted[i]) * (measured[i] - predicted[i]);
    ss_tot += (measured[i] - mean) * (measured[i] - mean);
    q.max_rel_error =
        std::max(q.max_rel_error, std::fabs(predicted[i] - measured[i]) / measured[i]);
  }
  q.r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : (ss_res == 0 ? 1.0 : 0.0);
  return q;
}

Status CheckSamples(size_t n, const auto& samples, const char* what) {
  if (n < 3)
    return InvalidArgument(std::string(what) + " fit needs at least 3 samples, got " +
                           std::to_string(n));
  for (const auto& s : samples) {
    if (!(s.seconds > 0) || !std::isfinite(s.seconds))
      return InvalidArgument(std::string(what) + " fit: every sample needs seconds > 0");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<LatencyModelFile> ParseLatencyModel(const std::string& yaml_text,
                                             const std::string& source_name) {
  TANDEM_ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(yaml_text, source_name));
  LatencyModelFile file;
  file.source = source_name;
  YamlErrors errors(source_name);
  if (!root.IsDefined() || root.IsNull()) {
    return InvalidArgument(source_name + ": latency_model: is required (the file is empty)");
  }
  {
    YamlFields top(&errors, root, "");
    if (top.valid()) {
      YAML::Node list = top.Child("latency_model", true);
      if (list && !list.IsSequence()) {
        errors.Add(list, "latency_model", "must be a list, got " + DescribeYaml(list));
      } else if (list) {
        if (list.size() == 0) errors.Add(list, "latency_model", "must have at least one entry");
        for (size_t i = 0; i < list.size(); ++i) {
          std::string prefix = "latency_model[" + std::to_string(i) + "]";
          LatencyModel m;
          ReadEntry(&errors, list[i], prefix, &m);
          if (file.Find(m.device, m.threads, m.tensor_parallel, m.pipeline_parallel, m.role) !=
              nullptr)
            errors.Add(list[i], prefix,
                       "a second entry for device " + m.device + ", threads " +
                           std::to_string(m.threads) + ", tensor_parallel " +
                           std::to_string(m.tensor_parallel) + ", pipeline_parallel " +
                           std::to_string(m.pipeline_parallel) +
                           (m.role.empty() ? std::string() : ", role " + m.role));
          file.entries.push_back(std::move(m));
        }
      }
      if (YAML::Node t = top.Child("transfer", false)) {
        YamlFields tf(&errors, t, "transfer");
        constexpr double kNoMax = std::numeric_limits<double>::infinity();
        tf.Double("latency_s", &file.transfer.latency_s, 0, kNoMax);
        tf.Double("bytes_per_s", &file.transfer.bytes_per_s, 0, kNoMax);
      }
    }
  }
  TANDEM_RETURN_IF_ERROR(errors.ToStatus());
  return file;
}

StatusOr<LatencyModelFile> LoadLatencyModel(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open latency model file");
  std::stringstream text;
  text << in.rdbuf();
  return ParseLatencyModel(text.str(), path);
}

std::string LatencyModelToYaml(const LatencyModelFile& file, const std::string& comment) {
  std::string out;
  if (!comment.empty()) {
    std::stringstream lines(comment);
    for (std::string line; std::getline(lines, line);) out += line.empty() ? "#\n" : "# " + line + "\n";
  }
  auto num = [](double v) { return YamlNumber(v); };  // written files round-trip exactly
  out += "latency_model:\n";
  for (const LatencyModel& m : file.entries) {
    out += "  - model: " + QuoteString(m.model) + "\n";
    out += "    device: " + QuoteString(m.device) + "\n";
    out += "    threads: " + std::to_string(m.threads) + "\n";
    out += "    tensor_parallel: " + std::to_string(m.tensor_parallel) + "\n";
    out += "    pipeline_parallel: " + std::to_string(m.pipeline_parallel) + "\n";
    if (!m.role.empty()) out += "    role: " + QuoteString(m.role) + "\n";
    out += "    prefill: {c1: " + num(m.c1) + ", c2: " + num(m.c2) + ", c3: " + num(m.c3) + "}\n";
    out += "    decode: {c4: " + num(m.c4) + ", c5: " + num(m.c5) + ", c6: " + num(m.c6) + "}\n";
    out += "    kv_bytes_per_token: " + num(m.kv_bytes_per_token) + "\n";
    if (m.max_batch_size > 0) out += "    max_batch_size: " + std::to_string(m.max_batch_size) + "\n";
    out += "    fit: {prefill_r2: " + num(m.fit.prefill_r2) + ", decode_r2: " +
           num(m.fit.decode_r2) + ", prefill_max_rel_error: " + num(m.fit.prefill_max_rel_error) +
           ", decode_max_rel_error: " + num(m.fit.decode_max_rel_error) + "}\n";
  }
  out += "transfer:\n";
  out += "  latency_s: " + num(file.transfer.latency_s) + "\n";
  out += "  bytes_per_s: " + num(file.transfer.bytes_per_s) + "\n";
  return out;
}

Status FitPrefill(std::span<const PrefillSample> samples, LatencyModel* model) {
  TANDEM_RETURN_IF_ERROR(CheckSamples(samples.size(), samples, "prefill"));
  std::vector<std::array<double, 3>> x;
  std::vector<double> y, w;
  for (const PrefillSample& s : samples) {
    x.push_back({1.0, s.sum_tokens, s.sum_tokens_squared});
    y.push_back(s.seconds);
    w.push_back(1.0);
  }
  std::array<double, 3> beta{};
  TANDEM_RETURN_IF_ERROR(Solve3(x, y, w, &beta));
  model->c1 = beta[0];
  model->c2 = beta[1];
  model->c3 = beta[2];
  std::vector<double> predicted;
  for (const PrefillSample& s : samples)
    predicted.push_back(model->PrefillSeconds(s.sum_tokens, s.sum_tokens_squared));
  Quality q = Measure(y, predicted);
  model->fit.prefill_r2 = q.r2;
  model->fit.prefill_max_rel_error = q.max_rel_error;
  return Status::Ok();
}

Status FitDecode(std::span<const DecodeSample> samples, LatencyModel* model) {
  TANDEM_RETURN_IF_ERROR(CheckSamples(samples.size(), samples, "decode"));
  std::vector<std::array<double, 3>> x;
  std::vector<double> y, w;
  // Relative errors: decode steps span more than 10x over a profile (batch 1 to 64), and with
  // equal weights the residuals of the longest steps set the line, which then misses batch 1-2
  // (the batches decode instances mostly run) by 10-15% on this CPU. Weighting by 1 / seconds
  // gives every grid point the same say in relative error, the quantity SLO slack is made of.
  // (Prefill keeps w = 1: its steps above 64 tokens are fitted within ~1% either way, and the
  // weights would let the few-token batches, the noisiest, pull c1.)
  for (const DecodeSample& s : samples) {
    x.push_back({1.0, s.batch, s.sum_context});
    y.push_back(s.seconds);
    w.push_back(s.seconds > 0 ? 1.0 / s.seconds : 1.0);
  }
  std::array<double, 3> beta{};
  TANDEM_RETURN_IF_ERROR(Solve3(x, y, w, &beta));
  model->c4 = beta[0];
  model->c5 = beta[1];
  model->c6 = beta[2];
  std::vector<double> predicted;
  for (const DecodeSample& s : samples)
    predicted.push_back(
        model->DecodeStepSeconds(static_cast<int64_t>(std::llround(s.batch)), s.sum_context));
  Quality q = Measure(y, predicted);
  model->fit.decode_r2 = q.r2;
  model->fit.decode_max_rel_error = q.max_rel_error;
  return Status::Ok();
}

}  // namespace tandem
