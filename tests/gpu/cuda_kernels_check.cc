// cuda_kernels_check: compares every kernel of common/engine/cuda/kernels.h (and the cuBLAS
// Gemm; the KV transfer's strided copies in kv_copies_check.cc, the device draw in
// draw_rows_check.cc) against a straightforward CPU reference on seeded random inputs, prints
// the max error of each against its tolerance, and exits 0 only when all pass. Needs a CUDA device (run it on the GPU machine: `build-cuda/tests/gpu/cuda_kernels_check`);
// exits 2 when none is visible.
//
// References are deliberately naive (double accumulation, one loop per formula). bf16 cases
// round the inputs on the host first, so the tolerance only covers output rounding and
// summation order.
#include <algorithm>
#include <limits>
#include <numeric>

#include "tests/gpu/check_util.h"

namespace tandem::cuda {
namespace {

// ---- checks --------------------------------------------------------------------------------

void CheckConvert(cudaStream_t s) {
  std::vector<float> x = Random(10007, 3.0f);
  DeviceBuffer in = Upload(x), mid = Scratch(x.size() * 2), out = Scratch(x.size() * 4);
  Must(Convert(DType::kF32, in.data(), DType::kBF16, mid.data(), x.size(), s), "Convert");
  Must(Convert(DType::kBF16, mid.data(), DType::kF32, out.data(), x.size(), s), "Convert");
  std::vector<float> got = Download<float>(out, x.size());
  std::vector<float> want = RoundBf16(x);
  std::vector<double> w(want.begin(), want.end());
  Report("Convert f32->bf16->f32 (vs host RNE)", MaxAbsDiff(got, w), 0.0);
}

void CheckRmsNorm(DType dt, cudaStream_t s) {
  const int tokens = 7, hidden = 1000;
  const float eps = 1e-5f;
  std::vector<float> x = Random(tokens * hidden, 2.0f), w = Random(hidden);
  if (dt == DType::kBF16) x = RoundBf16(x), w = RoundBf16(w);
  DeviceBuffer dx = UploadAs(dt, x), dw = UploadAs(dt, w), dout = Scratch(x.size() * 4);
  Must(RmsNorm(dt, dx.data(), dw.data(), dout.data(), tokens, hidden, eps, s), "RmsNorm");
  std::vector<float> got = DownloadAs(dt, dout, x.size());
  std::vector<double> want(x.size());
  double max_abs = 0;
  for (int t = 0; t < tokens; ++t) {
    double ss = 0;
    for (int i = 0; i < hidden; ++i) ss += double{x[t * hidden + i]} * x[t * hidden + i];
    double inv = 1.0 / std::sqrt(ss / hidden + eps);
    for (int i = 0; i < hidden; ++i) {
      want[t * hidden + i] = x[t * hidden + i] * inv * w[i];
      max_abs = std::max(max_abs, std::abs(want[t * hidden + i]));
    }
  }
  Report(std::string("RmsNorm ") + Name(dt), MaxAbsDiff(got, want),
         dt == DType::kF32 ? 1e-5 * max_abs : 8e-3 * max_abs);
}

void CheckAdd(DType dt, cudaStream_t s) {
  std::vector<float> a = Random(5000), b = Random(5000);
  if (dt == DType::kBF16) a = RoundBf16(a), b = RoundBf16(b);
  DeviceBuffer da = UploadAs(dt, a), db = UploadAs(dt, b);
  Must(Add(dt, da.data(), db.data(), da.data(), a.size(), s), "Add");  // in place
  std::vector<float> got = DownloadAs(dt, da, a.size());
  std::vector<double> want(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    want[i] = dt == DType::kF32 ? double{a[i] + b[i]} : double{FromBf16(ToBf16(a[i] + b[i]))};
  }
  Report(std::string("Add (in place) ") + Name(dt), MaxAbsDiff(got, want), 0.0);
}

void CheckSiluAndMul(DType dt, cudaStream_t s) {
  const int tokens = 5, inter = 700;
  std::vector<float> gu = Random(tokens * 2 * inter, 2.0f);  // fused [gate | up] rows
  if (dt == DType::kBF16) gu = RoundBf16(gu);
  DeviceBuffer dgu = UploadAs(dt, gu), dout = Scratch(tokens * inter * 4);
  const char* base = static_cast<const char*>(dgu.data());
  Must(SiluAndMul(dt, base, base + inter * DTypeSize(dt), dout.data(), tokens, inter, 2 * inter,
                  s),
       "SiluAndMul");
  std::vector<float> got = DownloadAs(dt, dout, tokens * inter);
  std::vector<double> want(tokens * inter);
  double max_abs = 0;
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < inter; ++i) {
      double g = gu[t * 2 * inter + i], u = gu[t * 2 * inter + inter + i];
      want[t * inter + i] = g / (1 + std::exp(-g)) * u;
      max_abs = std::max(max_abs, std::abs(want[t * inter + i]));
    }
  }
  Report(std::string("SiluAndMul (fused gate|up) ") + Name(dt), MaxAbsDiff(got, want),
         dt == DType::kF32 ? 1e-6 * max_abs : 8e-3 * max_abs);
}

void CheckEmbedding(DType dt, cudaStream_t s) {
  const int vocab = 300, hidden = 96;
  std::vector<float> table = Random(vocab * hidden);
  if (dt == DType::kBF16) table = RoundBf16(table);
  std::vector<int32_t> ids = {0, 299, 17, 17, 5, -1, 300};  // the last two are out of range
  DeviceBuffer dt_table = UploadAs(dt, table), dids = Upload(ids);
  DeviceBuffer dout = Scratch(ids.size() * hidden * 4);
  Must(EmbeddingGather(dt, dt_table.data(), dids.as<int32_t>(), dout.data(), ids.size(), hidden,
                       vocab, s),
       "EmbeddingGather");
  std::vector<float> got = DownloadAs(dt, dout, ids.size() * hidden);
  std::vector<double> want(got.size(), 0.0);
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) continue;
    for (int i = 0; i < hidden; ++i) want[t * hidden + i] = table[ids[t] * hidden + i];
  }
  Report(std::string("EmbeddingGather (+ out-of-range ids) ") + Name(dt), MaxAbsDiff(got, want),
         0.0);
}

// llama3 rope scaling of HF's _compute_llama3_parameters, in fp32 like the CPU backend.
std::vector<float> Llama3InvFreq(int head_dim, double theta) {
  const int half = head_dim / 2;
  const float factor = 8, low = 1, high = 4, old_ctx = 8192;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    float f = 1.0f / static_cast<float>(std::pow(theta, double(2 * i) / head_dim));
    const float wavelen = 2 * static_cast<float>(M_PI) / f;
    if (wavelen > old_ctx / low) {
      f /= factor;
    } else if (wavelen >= old_ctx / high) {
      float smooth = (old_ctx / wavelen - low) / (high - low);
      f = (1 - smooth) * f / factor + smooth * f;
    }
    inv[i] = f;
  }
  return inv;
}

void CheckRope(DType dt, cudaStream_t s) {
  const int tokens = 6, heads = 8, kv_heads = 2, head_dim = 128, half = head_dim / 2;
  const int row = (heads + 2 * kv_heads) * head_dim;  // fused qkv rows: q, k, v
  std::vector<float> qkv = Random(tokens * row);
  if (dt == DType::kBF16) qkv = RoundBf16(qkv);
  std::vector<int32_t> pos = {0, 1, 7, 4095, 8191, 131071};
  std::vector<float> inv = Llama3InvFreq(head_dim, 500000.0);
  DeviceBuffer dqkv = UploadAs(dt, qkv), dpos = Upload(pos), dinv = Upload(inv);
  char* base = static_cast<char*>(dqkv.data());
  Must(Rope(dt, base, base + heads * head_dim * DTypeSize(dt), dpos.as<int32_t>(),
            dinv.as<float>(), tokens, heads, kv_heads, head_dim, row, row, s),
       "Rope");
  std::vector<float> got = DownloadAs(dt, dqkv, qkv.size());
  std::vector<double> want(qkv.begin(), qkv.end());  // V must be untouched
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads + kv_heads; ++h) {
      float* x = &qkv[t * row + h * head_dim];
      for (int i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos[t]) * inv[i];
        const float c = static_cast<float>(std::cos(double{angle}));
        const float sn = static_cast<float>(std::sin(double{angle}));
        const float a = x[i], b = x[i + half];
        float r0 = a * c - b * sn, r1 = b * c + a * sn;
        if (dt == DType::kBF16) r0 = FromBf16(ToBf16(r0)), r1 = FromBf16(ToBf16(r1));
        want[t * row + h * head_dim + i] = r0;
        want[t * row + h * head_dim + i + half] = r1;
      }
    }
  }
  Report(std::string("Rope llama3, fused qkv, pos up to 131071 ") + Name(dt),
         MaxAbsDiff(got, want), dt == DType::kF32 ? 1e-6 : 1e-2);
}

// softmax(q . K[lo..hi]^T * scale) V[lo..hi] in double, over one sequence's rows of k and v
// (row stride kv_row, the kv head's columns at col), added into out[head_dim].
void RefAttend(const float* q, const std::vector<float>& k, const std::vector<float>& v,
               size_t first_row, int lo, int hi, int kv_row, int col, int head_dim, float scale,
               double* out) {
  if (hi < lo) return;
  std::vector<double> score(hi - lo + 1);
  double mx = -1e300;
  for (int t = lo; t <= hi; ++t) {
    const float* kr = &k[(first_row + t) * kv_row + col];
    double dot = 0;
    for (int d = 0; d < head_dim; ++d) dot += double{q[d]} * kr[d];
    score[t - lo] = dot * scale;
    mx = std::max(mx, score[t - lo]);
  }
  double z = 0;
  for (double& sc : score) z += (sc = std::exp(sc - mx));
  for (int t = lo; t <= hi; ++t) {
    const float* vr = &v[(first_row + t) * kv_row + col];
    for (int d = 0; d < head_dim; ++d) out[d] += score[t - lo] / z * vr[d];
  }
}

// One paged cache of sequences of different lengths, in shuffled blocks, written through
// WriteKvCache, with the host copies of its K/V that the references read.
struct AttentionFixture {
  int heads = 8, kv_heads = 2, block_size = 16, head_dim = 0, kv_row = 0, max_len = 0;
  int total_tokens = 0;
  float scale = 0;
  std::vector<int32_t> lens = {1, 17, 100, 1100, 0, 16, 513};
  std::vector<int32_t> positions, first_row;  // every token's position; each sequence's first row
  std::vector<float> k, v;                    // [total_tokens][kv_row], rounded as stored
  DeviceBuffer cache, dtables, dlens;
  PagedAttentionArgs args;  // everything but q, out and the window
  int num_seqs() const { return static_cast<int>(lens.size()); }
  int q_stride() const { return heads * head_dim + 2 * kv_row; }  // padded, as in qkv
};

AttentionFixture MakeAttentionFixture(DType kv_dt, int head_dim, cudaStream_t s) {
  AttentionFixture f;
  // Emulated: still past one decode partition (512), a fifth of the prefill work.
  if (Emulated()) f.lens = {1, 17, 100, 530, 0, 16, 300};
  f.head_dim = head_dim;
  f.kv_row = f.kv_heads * head_dim;
  const int num_seqs = f.num_seqs(), block_size = f.block_size;
  f.max_len = *std::max_element(f.lens.begin(), f.lens.end());
  const int max_blocks = (f.max_len + block_size - 1) / block_size;
  const PagedKvShape shape{f.kv_heads, head_dim, block_size};
  int total_blocks = 0;
  for (int len : f.lens) total_blocks += (len + block_size - 1) / block_size;
  total_blocks += 3;  // spare blocks, never referenced
  // Block tables: a shuffled assignment, so that sequences are not contiguous.
  std::vector<int32_t> free_blocks(total_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), g_rng);
  std::vector<int32_t> tables(num_seqs * max_blocks, 0);
  size_t next = 0;
  for (int sq = 0; sq < num_seqs; ++sq) {
    for (int b = 0; b < (f.lens[sq] + block_size - 1) / block_size; ++b) {
      tables[sq * max_blocks + b] = free_blocks[next++];
    }
  }
  // K/V of every token of every sequence, written through WriteKvCache (fp32 source).
  f.total_tokens = std::accumulate(f.lens.begin(), f.lens.end(), 0);
  f.k = Random(size_t(f.total_tokens) * f.kv_row);
  f.v = Random(size_t(f.total_tokens) * f.kv_row);
  std::vector<int64_t> slots;
  f.first_row.resize(num_seqs);
  for (int sq = 0; sq < num_seqs; ++sq) {
    f.first_row[sq] = slots.size();
    for (int t = 0; t < f.lens[sq]; ++t) {
      slots.push_back(int64_t{tables[sq * max_blocks + t / block_size]} * block_size + t % block_size);
      f.positions.push_back(t);
    }
  }
  DeviceBuffer dk = Upload(f.k), dv = Upload(f.v), dslots = Upload(slots);
  f.cache = Scratch(size_t(total_blocks) * shape.BlockElements() * DTypeSize(kv_dt));
  Must(f.cache.Zero(g_stream), "memset");
  Must(WriteKvCache(DType::kF32, dk.data(), dv.data(), f.kv_row, kv_dt, f.cache.data(), shape,
                    dslots.as<int64_t>(), f.total_tokens, s),
       "WriteKvCache");
  // dk, dv and dslots are freed on return: the writes must be done.
  Must(cudaStreamSynchronize(s) == cudaSuccess ? Status::Ok() : Internal("stream failed"),
       "WriteKvCache");
  if (kv_dt == DType::kBF16) f.k = RoundBf16(f.k), f.v = RoundBf16(f.v);
  f.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  f.dtables = Upload(tables);
  f.dlens = Upload(f.lens);
  f.args.kv_dtype = kv_dt;
  f.args.layer_base = f.cache.data();
  f.args.shape = shape;
  f.args.block_tables = f.dtables.as<int32_t>();
  f.args.max_blocks_per_seq = max_blocks;
  f.args.num_heads = f.heads;
  f.args.scale = f.scale;
  return f;
}

// The reference attention of query row `q` (head h) over rows [lo, hi] of sequence sq.
void RefHead(const AttentionFixture& f, const float* q, int sq, int h, int lo, int hi,
             double* out) {
  RefAttend(q, f.k, f.v, f.first_row[sq], lo, hi, f.kv_row, (h / (f.heads / f.kv_heads)) * f.head_dim,
            f.head_dim, f.scale, out);
}

// Decode: one query per sequence over its whole context, split over the partitions it needs
// and over one more (a captured graph's count, fixed for a longer context), and in one
// partition where the sliding window (300 keys) fits in it. Fewer partitions than the context
// needs are outside the kernel's contract (it covers kDecodePartitionTokens keys each).
void CheckDecodeAttention(AttentionFixture& f, const std::string& what, cudaStream_t s) {
  const int num_seqs = f.num_seqs(), heads = f.heads, head_dim = f.head_dim;
  PagedAttentionArgs args = f.args;
  const int need = DecodePartitions(f.max_len);
  for (int window : {0, 300}) {
    for (int partitions : {window > 0 ? 1 : need, need + 1}) {
      std::vector<float> q = Random(size_t(num_seqs) * f.q_stride());
      DeviceBuffer dq = Upload(q);
      DeviceBuffer dout = Scratch(size_t(num_seqs) * heads * head_dim * 4);
      DeviceBuffer dpartials =
          Scratch(DecodePartialFloats(num_seqs, heads, head_dim, partitions) * 4);
      args.q = dq.as<float>();
      args.q_stride = f.q_stride();
      args.out = dout.as<float>();
      args.out_stride = heads * head_dim;
      args.sliding_window = window;
      Must(PagedAttentionDecode(args, f.dlens.as<int32_t>(), num_seqs, partitions,
                                dpartials.as<float>(), s),
           "PagedAttentionDecode");
      std::vector<float> got = Download<float>(dout, size_t(num_seqs) * heads * head_dim);
      std::vector<double> want(got.size(), 0.0);
      for (int sq = 0; sq < num_seqs; ++sq) {
        const int hi = f.lens[sq] - 1, lo = window > 0 ? std::max(0, hi - window + 1) : 0;
        for (int h = 0; h < heads; ++h)
          RefHead(f, &q[size_t(sq) * f.q_stride() + h * head_dim], sq, h, lo, hi,
                  &want[(size_t(sq) * heads + h) * head_dim]);
      }
      Report("PagedAttentionDecode " + what + " parts " + std::to_string(partitions) +
                 " window " + std::to_string(window),
             MaxAbsDiff(got, want), 2e-5);
    }
  }
}

// Prefill: every token of every sequence is a query (tiles of up to kPrefillTileTokens).
void CheckPrefillAttention(AttentionFixture& f, const std::string& what, cudaStream_t s) {
  const int heads = f.heads, head_dim = f.head_dim;
  std::vector<int32_t> tiles;
  for (int sq = 0; sq < f.num_seqs(); ++sq) {
    for (int t = 0; t < f.lens[sq]; t += kPrefillTileTokens) {
      tiles.insert(tiles.end(),
                   {sq, f.first_row[sq] + t, std::min(kPrefillTileTokens, f.lens[sq] - t)});
    }
  }
  PagedAttentionArgs args = f.args;
  for (int window : {0, 37}) {
    std::vector<float> q = Random(size_t(f.total_tokens) * f.q_stride());
    DeviceBuffer dq = Upload(q), dpos = Upload(f.positions), dtiles = Upload(tiles);
    DeviceBuffer dout = Scratch(size_t(f.total_tokens) * heads * head_dim * 4);
    args.q = dq.as<float>();
    args.q_stride = f.q_stride();
    args.out = dout.as<float>();
    args.out_stride = heads * head_dim;
    args.sliding_window = window;
    Must(PagedAttentionPrefill(args, dpos.as<int32_t>(), dtiles.as<int32_t>(),
                               static_cast<int32_t>(tiles.size() / 3), s),
         "PagedAttentionPrefill");
    std::vector<float> got = Download<float>(dout, size_t(f.total_tokens) * heads * head_dim);
    std::vector<double> want(got.size(), 0.0);
    for (int sq = 0; sq < f.num_seqs(); ++sq) {
      for (int t = 0; t < f.lens[sq]; ++t) {
        const size_t row = f.first_row[sq] + t;
        const int lo = window > 0 ? std::max(0, t - window + 1) : 0;
        for (int h = 0; h < heads; ++h)
          RefHead(f, &q[row * f.q_stride() + h * head_dim], sq, h, lo, t,
                  &want[(row * heads + h) * head_dim]);
      }
    }
    Report("PagedAttentionPrefill " + what + " window " + std::to_string(window),
           MaxAbsDiff(got, want), 2e-5);
  }
}

void CheckAttention(DType kv_dt, int head_dim, cudaStream_t s) {
  AttentionFixture f = MakeAttentionFixture(kv_dt, head_dim, s);
  const std::string what = "GQA 8/2 d" + std::to_string(head_dim) + " kv " + Name(kv_dt);
  CheckDecodeAttention(f, what, s);
  CheckPrefillAttention(f, what, s);
}

void CheckArgmax(cudaStream_t s) {
  const int vocab = 5000;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits;
  std::vector<int32_t> want;
  for (int r = 0; r < 4; ++r) {
    std::vector<float> row = Random(vocab);
    logits.insert(logits.end(), row.begin(), row.end());
    want.push_back(std::max_element(row.begin(), row.end()) - row.begin());
  }
  std::vector<float> tie(vocab, -1.0f);  // ties: the lowest id wins
  tie[4000] = tie[123] = tie[2500] = 3.0f;
  tie[7] = nan;
  logits.insert(logits.end(), tie.begin(), tie.end());
  want.push_back(123);
  std::vector<float> masked(vocab, -inf);  // nothing usable: -1 (ArgmaxRow's answer)
  logits.insert(logits.end(), masked.begin(), masked.end());
  want.push_back(-1);
  DeviceBuffer dl = Upload(logits), dids = Scratch(want.size() * 4);
  Must(ArgmaxRows(dl.as<float>(), want.size(), vocab, dids.as<int32_t>(), s), "ArgmaxRows");
  std::vector<int32_t> got = Download<int32_t>(dids, want.size());
  int wrong = 0;
  for (size_t r = 0; r < want.size(); ++r) wrong += got[r] != want[r];
  Report("ArgmaxRows (ties, NaN, all -inf): wrong rows", wrong, 0);
}

void CheckGemm(const CublasHandle& handle, DType in_dt, DType out_dt) {
  const int m = 5, n = 300, k = 256;
  std::vector<float> x = Random(m * k), w = Random(n * k, 0.05f);
  if (in_dt == DType::kBF16) x = RoundBf16(x), w = RoundBf16(w);
  DeviceBuffer dx = UploadAs(in_dt, x), dw = UploadAs(in_dt, w), dy = Scratch(m * n * 4);
  Must(Gemm(handle, in_dt, dx.data(), dw.data(), out_dt, dy.data(), m, n, k), "Gemm");
  std::vector<float> got = DownloadAs(out_dt, dy, m * n);
  std::vector<double> want(m * n);
  double max_abs = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int p = 0; p < k; ++p) acc += double{x[i * k + p]} * w[j * k + p];
      want[i * n + j] = acc;
      max_abs = std::max(max_abs, std::abs(acc));
    }
  }
  const double tol = out_dt == DType::kF32 ? 1e-5 * max_abs * 10 : 8e-3 * max_abs;
  Report(std::string("Gemm x[5x256] w[300x256]^T in ") + Name(in_dt) + " out " + Name(out_dt),
         MaxAbsDiff(got, want), tol);
  if (out_dt != DType::kF32) return;
  // beta = 1 adds into y (the residual): y = 2 x w^T now.
  Must(Gemm(handle, in_dt, dx.data(), dw.data(), out_dt, dy.data(), m, n, k, 1.0f), "Gemm");
  got = DownloadAs(out_dt, dy, m * n);
  for (double& w2 : want) w2 *= 2;
  Report(std::string("Gemm beta 1 (residual add) in ") + Name(in_dt), MaxAbsDiff(got, want),
         2 * tol);
}

void CheckAddRowBias(cudaStream_t s) {
  const int rows = 7, cols = 1000;
  std::vector<float> y = Random(rows * cols), bias = Random(cols);
  DeviceBuffer dy = Upload(y), db = Upload(bias);
  Must(AddRowBias(dy.as<float>(), db.as<float>(), rows, cols, s), "AddRowBias");
  std::vector<float> got = Download<float>(dy, y.size());
  std::vector<double> want(y.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) want[r * cols + c] = y[r * cols + c] + bias[c];
  Report("AddRowBias", MaxAbsDiff(got, want), 1e-6);
}


int Main() {
  StatusOr<int> devices = DeviceCount();
  if (!devices.ok()) {
    std::fprintf(stderr, "cuda_kernels_check: no CUDA device: %s\n",
                 devices.status().ToString().c_str());
    return 2;
  }
  CudaStream stream = Must(CudaStream::Create(), "stream");
  CublasHandle cublas = Must(CublasHandle::Create(), "cublas");
  Must(cublas.SetStream(stream.get()), "cublasSetStream");
  cudaStream_t s = stream.get();
  g_stream = s;

  CheckConvert(s);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CheckRmsNorm(dt, s);
    CheckAdd(dt, s);
    CheckSiluAndMul(dt, s);
    CheckEmbedding(dt, s);
    CheckRope(dt, s);
  }
  for (int head_dim : {128, 64, 80, 256}) CheckAttention(DType::kF32, head_dim, s);
  CheckAttention(DType::kBF16, 128, s);
  CheckArgmax(s);
  CheckAddRowBias(s);
  CheckStridedCopies(s);
  CheckRowCopies(s);
  if (!Emulated()) TimeStridedCopies(s);
  CheckDrawRows(s);
  CheckScoreEdits(s);
  if (!Emulated()) TimeDrawRows(s);
  CheckGemm(cublas, DType::kF32, DType::kF32);
  CheckGemm(cublas, DType::kBF16, DType::kF32);
  CheckGemm(cublas, DType::kBF16, DType::kBF16);
  Must(stream.Synchronize(), "synchronize");
  std::printf("%s: %d failure(s)\n", g_failures ? "FAIL" : "PASS", g_failures);
  return g_failures ? 1 : 0;
}

}  // namespace
}  // namespace tandem::cuda

int main() { return tandem::cuda::Main(); }
