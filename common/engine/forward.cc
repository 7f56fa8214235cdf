#include "common/engine/forward.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/engine/sampling.h"

namespace tandem {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kTileRows = 8;        // query rows (token, head) processed together
constexpr int kKeyChunk = 64;       // keys scored at once (a block is split into such chunks)
constexpr int kTokensPerTask = 32;  // query tokens of one sequence per attention task
// Up to this many rows (decode batches), linear layers run the streaming kernels of
// linear_kernels.h on the pool; above, sgemm (prefill), which packs the weights first.
constexpr int kSmallBatchRows = 64;
// bf16/f16 weights reach sgemm widened to fp32 a panel of rows at a time, about this many
// bytes: it stays in cache while sgemm reads it.
constexpr size_t kPanelBytes = size_t{1} << 20;

// y[m, n] = x[m, k] W[n, k]^T + beta y through OpenBLAS, W fp32 with leading dimension k and
// y with leading dimension ldy.
void BlasLinear(const float* x, int m, int k, const float* w, int n, float* y, int ldy,
                float beta) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, beta, y, ldy);
}

// out = x * rsqrt(mean(x^2) + eps) * weight, in the order HF's LlamaRMSNorm computes it.
void RmsNorm(const float* x, const float* weight, int n, float eps, float* out) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += x[i] * x[i];
  float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

// HF rotate_half convention: pairs (i, i + half).
void ApplyRope(float* x, const float* cos, const float* sin, int half) {
  for (int i = 0; i < half; ++i) {
    float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i] + a * sin[i];
  }
}

// ---- attention kernels -------------------------------------------------------------------------

struct AvxOps {
  [[gnu::target("avx2,fma")]] static inline float Dot(const float* a, const float* b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    float out = _mm_cvtss_f32(s);
    for (; i < n; ++i) out += a[i] * b[i];
    return out;
  }
  [[gnu::target("avx2,fma")]] static inline void Axpy(float* y, float p, const float* x, int n) {
    __m256 vp = _mm256_set1_ps(p);
    int i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += p * x[i];
  }

  // exp(x) for x <= 0 (Cephes polynomial, ~2 ulp), 8 lanes.
  [[gnu::target("avx2,fma")]] static inline __m256 Exp(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                                _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  }
  // s[j] = q . k[j] * scale for j in [j0, j1); four keys share one horizontal reduction.
  [[gnu::target("avx2,fma")]] static inline void Scores(const float* q, const float* k, int j0,
                                                       int j1, int d, float scale, float* s) {
    int j = j0;
    if (d % 8 == 0) {
      for (; j + 4 <= j1; j += 4) {
        const float* k0 = k + static_cast<size_t>(j) * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < d; i += 8) {
          const __m256 vq = _mm256_loadu_ps(q + i);
          a0 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k0 + i), a0);
          a1 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k0 + d + i), a1);
          a2 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k0 + 2 * d + i), a2);
          a3 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k0 + 3 * d + i), a3);
        }
        // [a0 a1 a2 a3] -> four sums in one register.
        __m256 h01 = _mm256_hadd_ps(a0, a1), h23 = _mm256_hadd_ps(a2, a3);
        __m256 h = _mm256_hadd_ps(h01, h23);
        __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(s + j, _mm_mul_ps(sum, _mm_set1_ps(scale)));
      }
    }
    for (; j < j1; ++j) s[j] = Dot(q, k + static_cast<size_t>(j) * d, d) * scale;
  }
  // s[j] = exp(s[j] - m); returns the sum.
  [[gnu::target("avx2,fma")]] static inline float ExpSum(float* s, int j0, int j1, float m) {
    __m256 vm = _mm256_set1_ps(m), total = _mm256_setzero_ps();
    int j = j0;
    for (; j + 8 <= j1; j += 8) {
      __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
      _mm256_storeu_ps(s + j, e);
      total = _mm256_add_ps(total, e);
    }
    float out = HorizontalSum8(total);
    for (; j < j1; ++j) {
      s[j] = std::exp(s[j] - m);
      out += s[j];
    }
    return out;
  }
  // acc = acc * factor + sum_j p[j] v[j]; acc stays in a register per 8 lanes across keys.
  [[gnu::target("avx2,fma")]] static inline void AccumulateV(float* acc, float factor,
                                                            const float* p, const float* v, int j0,
                                                            int j1, int d) {
    int i = 0;
    const __m256 vf = _mm256_set1_ps(factor);
    for (; i + 8 <= d; i += 8) {
      __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + i), vf);
      for (int j = j0; j < j1; ++j)
        a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + static_cast<size_t>(j) * d + i), a);
      _mm256_storeu_ps(acc + i, a);
    }
    for (; i < d; ++i) {
      float a = acc[i] * factor;
      for (int j = j0; j < j1; ++j) a += p[j] * v[static_cast<size_t>(j) * d + i];
      acc[i] = a;
    }
  }
  [[gnu::target("avx2,fma")]] static inline float HorizontalSum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
  }
};

struct ScalarOps {
  static inline float Dot(const float* a, const float* b, int n) {
    float s[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; ++k) s[k] += a[i + k] * b[i + k];
    float out = (s[0] + s[1]) + (s[2] + s[3]);
    for (; i < n; ++i) out += a[i] * b[i];
    return out;
  }
  static inline void Axpy(float* y, float p, const float* x, int n) {
    for (int i = 0; i < n; ++i) y[i] += p * x[i];
  }
  static inline void Scores(const float* q, const float* k, int j0, int j1, int d, float scale,
                            float* s) {
    for (int j = j0; j < j1; ++j) s[j] = Dot(q, k + static_cast<size_t>(j) * d, d) * scale;
  }
  static inline float ExpSum(float* s, int j0, int j1, float m) {
    float sum = 0.0f;
    for (int j = j0; j < j1; ++j) {
      s[j] = std::exp(s[j] - m);
      sum += s[j];
    }
    return sum;
  }
  static inline void AccumulateV(float* acc, float factor, const float* p, const float* v, int j0,
                                 int j1, int d) {
    for (int i = 0; i < d; ++i) acc[i] *= factor;
    for (int j = j0; j < j1; ++j) Axpy(acc, p[j], v + static_cast<size_t>(j) * d, d);
  }
};

struct AttentionArgs {
  const KvCache* cache;
  int layer;
  int kv_head;
  int group;  // query heads per kv head
  int head_dim;
  int block_size;
  int sliding_window;  // 0 = none
  float scale;
  std::span<const int32_t> block_table;
  const float* qkv;  // [T, qkv_dim]
  int qkv_dim;
  float* out;  // [T, q_dim]
  int q_dim;
  const int32_t* token_pos;
  int token_begin, token_end;
};

// Online-softmax attention for the query rows (token, head in group) of one task, a tile of
// kTileRows rows at a time, streaming the sequence's K/V blocks once per tile.
template <typename Ops>
[[gnu::always_inline]] inline void AttendBody(const AttentionArgs& a) {
  const int d = a.head_dim, bs = a.block_size;
  const int num_rows = (a.token_end - a.token_begin) * a.group;
  float acc[kTileRows][kMaxHeadDim];
  float scores[kKeyChunk];
  for (int row0 = 0; row0 < num_rows; row0 += kTileRows) {
    const int rows = std::min(kTileRows, num_rows - row0);
    const float* q[kTileRows];
    float* out[kTileRows];
    int hi[kTileRows], lo[kTileRows];
    float m[kTileRows], l[kTileRows];
    int tile_lo = std::numeric_limits<int>::max(), tile_hi = -1;
    for (int r = 0; r < rows; ++r) {
      int token = a.token_begin + (row0 + r) / a.group;
      int head = a.kv_head * a.group + (row0 + r) % a.group;
      q[r] = a.qkv + static_cast<size_t>(token) * a.qkv_dim + head * d;
      out[r] = a.out + static_cast<size_t>(token) * a.q_dim + head * d;
      hi[r] = a.token_pos[token];
      lo[r] = a.sliding_window > 0 ? std::max(0, hi[r] - a.sliding_window + 1) : 0;
      tile_lo = std::min(tile_lo, lo[r]);
      tile_hi = std::max(tile_hi, hi[r]);
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.0f;
      std::memset(acc[r], 0, sizeof(float) * d);
    }
    for (int b = tile_lo / bs; b <= tile_hi / bs; ++b) {
      const int32_t block = a.block_table[b];
      const float* k_block = a.cache->HeadData(a.layer, block, 0, a.kv_head);
      const float* v_block = a.cache->HeadData(a.layer, block, 1, a.kv_head);
      for (int c0 = 0; c0 < bs; c0 += kKeyChunk) {
        const int base = b * bs + c0;  // position of slot c0
        const int chunk = std::min(kKeyChunk, bs - c0);
        for (int r = 0; r < rows; ++r) {
          const int j0 = std::max(0, lo[r] - base);
          const int j1 = std::min(chunk, hi[r] - base + 1);
          if (j0 >= j1) continue;
          const float* k_chunk = k_block + static_cast<size_t>(c0) * d;
          const float* v_chunk = v_block + static_cast<size_t>(c0) * d;
          Ops::Scores(q[r], k_chunk, j0, j1, d, a.scale, scores);
          float chunk_max = scores[j0];
          for (int j = j0 + 1; j < j1; ++j) chunk_max = std::max(chunk_max, scores[j]);
          // Rescale what was accumulated under the old maximum (exp(-inf) = 0 at the start).
          float factor = 1.0f;
          if (chunk_max > m[r]) {
            factor = std::exp(m[r] - chunk_max);
            m[r] = chunk_max;
          }
          l[r] = l[r] * factor + Ops::ExpSum(scores, j0, j1, m[r]);
          Ops::AccumulateV(acc[r], factor, scores, v_chunk, j0, j1, d);
        }
      }
    }
    for (int r = 0; r < rows; ++r) {
      const float inv = 1.0f / l[r];
      for (int i = 0; i < d; ++i) out[r][i] = acc[r][i] * inv;
    }
  }
}

[[gnu::target("avx2,fma")]] void AttendAvx2(const AttentionArgs& a) { AttendBody<AvxOps>(a); }
void AttendScalar(const AttentionArgs& a) { AttendBody<ScalarOps>(a); }

}  // namespace

// ---- CpuForward ----------------------------------------------------------------------------------

void CpuForward::Buffer::Free::operator()(float* p) const { std::free(p); }

void CpuForward::Buffer::Resize(size_t n) {
  if (n <= size) return;
  size_t bytes = (std::max<size_t>(n, 16) * sizeof(float) + 63) / 64 * 64;
  float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  TANDEM_CHECK(p != nullptr, "out of memory allocating the forward workspace");
  data.reset(p);
  size = n;
}

CpuForward::CpuForward(const Model& model, const ForwardOptions& options)
    : model_(model), options_(options), pool_(options.num_threads) {}

StatusOr<std::unique_ptr<CpuForward>> CpuForward::Create(const Model& model,
                                                         const ForwardOptions& options) {
  const ModelConfig& c = model.config();
  if (options.num_threads < 1 || options.num_threads > 1024)
    return InvalidArgument("forward: num_threads must be in [1, 1024]");
  if (options.max_batch_tokens < 1 || options.max_batch_sequences < 1)
    return InvalidArgument("forward: max_batch_tokens and max_batch_sequences must be positive");
  if (c.head_dim > kMaxHeadDim)
    return InvalidArgument("forward: head_dim " + std::to_string(c.head_dim) +
                           " exceeds the CPU backend's limit of " + std::to_string(kMaxHeadDim));
  auto f = std::unique_ptr<CpuForward>(new CpuForward(model, options));
  openblas_set_num_threads(options.num_threads);
  TANDEM_ASSIGN_OR_RETURN(f->isa_, KernelIsaFromEnv());
  f->use_avx2_ = f->isa_ != KernelIsa::kScalar;
  if (model.dtype() != WeightDType::kF32) {
    const int max_cols = std::max({c.hidden_size, c.q_dim(), c.intermediate_size});
    f->panel_rows_ = std::max<int>(16, static_cast<int>(kPanelBytes / sizeof(float) / max_cols) / 16 * 16);
    f->panel_.Resize(static_cast<size_t>(f->panel_rows_) * max_cols);
  }

  const int half = c.head_dim / 2;
  f->inv_freq_ = RopeInvFreq(c);

  const size_t t = options.max_batch_tokens, s = options.max_batch_sequences;
  const size_t h = c.hidden_size;
  f->x_.Resize(t * h);
  f->xn_.Resize(t * h);
  f->qkv_.Resize(t * (c.q_dim() + 2 * c.kv_dim()));
  f->attn_.Resize(t * c.q_dim());
  f->mlp_.Resize(t * 2 * c.intermediate_size);
  f->act_.Resize(t * c.intermediate_size);
  f->cos_.Resize(t * half);
  f->sin_.Resize(t * half);
  f->last_.Resize(std::min(s, t) * h);
  f->logits_.Resize(std::min(s, t) * c.vocab_size);
  f->token_seq_.resize(t);
  f->token_pos_.resize(t);
  f->seq_first_token_.resize(s + 1);
  f->tasks_.reserve((t / kTokensPerTask + s) * c.num_kv_heads);
  return f;
}

StatusOr<KvPoolMemory> CpuForward::AllocateKvPool(size_t bytes) {
  return AllocateKvPoolMemory(bytes);
}

KvLayout CpuForward::MakeKvLayout(int block_size) const {
  const ModelConfig& c = model_.config();
  return KvLayout{c.num_layers, c.num_kv_heads, c.head_dim, block_size};
}


void CpuForward::Linear(const float* x, int m, const WeightMatrix& w, float* y, float beta) {
  const int n = w.rows, k = w.cols;
  if (m > kSmallBatchRows) {
    if (w.dtype == WeightDType::kF32) {
      BlasLinear(x, m, k, static_cast<const float*>(w.data), n, y, n, beta);
      return;
    }
    for (int j = 0; j < n; j += panel_rows_) {
      const int rows = std::min(panel_rows_, n - j);
      WidenRows(isa_, w, j, j + rows, panel_.get());
      BlasLinear(x, m, k, panel_.get(), rows, y + j, n, beta);
    }
    return;
  }
  // Output rows split into chunks of 8 (the kernels' widest tile) over the pool: a few chunks per
  // thread, so a thread that the OS delays leaves its work to the others.
  const int threads = pool_.num_threads();
  const int chunk = threads == 1 ? n : std::max(32, (n / (4 * threads) + 7) / 8 * 8);
  const int num_chunks = (n + chunk - 1) / chunk;
  auto task = [&](int i) {
    LinearRows(isa_, x, m, w, i * chunk, std::min(n, (i + 1) * chunk), y, n, beta);
  };
  pool_.ParallelFor(num_chunks, task);
}

void CpuForward::Attention(int layer, std::span<const SequenceInput> batch, KvCache& cache) {
  const ModelConfig& c = model_.config();
  const KvLayout& layout = cache.layout();
  const int qkv_dim = c.q_dim() + 2 * c.kv_dim();
  auto task_fn = [&](int i) {
    const AttentionTask& task = tasks_[i];
    AttentionArgs args{&cache,
                       layer,
                       task.kv_head,
                       c.num_heads / c.num_kv_heads,
                       c.head_dim,
                       layout.block_size,
                       c.sliding_window,
                       1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                       batch[task.seq].block_table,
                       qkv_.get(),
                       qkv_dim,
                       attn_.get(),
                       c.q_dim(),
                       token_pos_.data(),
                       task.token_begin,
                       task.token_end};
    if (use_avx2_) {
      AttendAvx2(args);
    } else {
      AttendScalar(args);
    }
  };
  pool_.ParallelFor(static_cast<int>(tasks_.size()), task_fn);
}

int CpuForward::PrepareBatch(std::span<const SequenceInput> batch) {
  const ModelConfig& c = model_.config();
  const int h = c.hidden_size, half = c.head_dim / 2;
  const int num_seqs = static_cast<int>(batch.size());
  int num_tokens = 0;
  tasks_.clear();
  for (int s = 0; s < num_seqs; ++s) {
    const SequenceInput& seq = batch[s];
    seq_first_token_[s] = num_tokens;
    const int n = static_cast<int>(seq.tokens.size());
    for (int i = 0; i < n; ++i) {
      const int t = num_tokens + i;
      token_seq_[t] = s;
      token_pos_[t] = seq.start_position + i;
      WidenRows(isa_, model_.embed_tokens(), seq.tokens[i], seq.tokens[i] + 1,
                x_.get() + static_cast<size_t>(t) * h);
      const float pos = static_cast<float>(token_pos_[t]);
      for (int j = 0; j < half; ++j) {
        const float angle = pos * inv_freq_[j];  // fp32 product, as HF's matmul does
        cos_.get()[static_cast<size_t>(t) * half + j] = static_cast<float>(std::cos(double{angle}));
        sin_.get()[static_cast<size_t>(t) * half + j] = static_cast<float>(std::sin(double{angle}));
      }
    }
    for (int kvh = 0; kvh < c.num_kv_heads; ++kvh) {
      for (int b = 0; b < n; b += kTokensPerTask)
        tasks_.push_back(AttentionTask{s, kvh, num_tokens + b,
                                       num_tokens + std::min(n, b + kTokensPerTask)});
    }
    num_tokens += n;
  }
  seq_first_token_[num_seqs] = num_tokens;

  return num_tokens;
}

void CpuForward::ResidualLinear(const float* in, int m, const WeightMatrix& w,
                                const ForwardHooks* hooks) {
  float* x = x_.get();
  if (hooks == nullptr || !hooks->all_reduce) {
    Linear(in, m, w, x, 1.0f);  // residual add via beta = 1
    return;
  }
  float* partial = xn_.get();
  Linear(in, m, w, partial, 0.0f);
  const size_t n = static_cast<size_t>(m) * w.rows;
  hooks->all_reduce(partial, n);
  for (size_t i = 0; i < n; ++i) x[i] += partial[i];
}

StatusOr<std::span<const float>> CpuForward::Forward(std::span<const SequenceInput> batch,
                                                     KvCache& cache, LogitsMode mode,
                                                     const ForwardHooks* hooks,
                                                     GreedyRows* greedy) {
  TANDEM_RETURN_IF_ERROR(ValidateForwardBatch(model_.config(), options_, batch, cache.layout(),
                                               cache.num_blocks()));
  TANDEM_RETURN_IF_ERROR(
      ValidateGreedyRows(greedy, batch.size(), mode, model_.config().vocab_size));
  if (cache.memory_kind() != KvMemoryKind::kHost)
    return InvalidArgument("forward (cpu): the KV pool is in device memory");
  const ModelConfig& c = model_.config();
  const KvLayout& layout = cache.layout();
  const int h = c.hidden_size, d = c.head_dim, half = d / 2;
  const int q_dim = c.q_dim(), kv_dim = c.kv_dim(), qkv_dim = q_dim + 2 * kv_dim;
  const int inter = c.intermediate_size;
  const int num_seqs = static_cast<int>(batch.size());
  const float eps = static_cast<float>(c.rms_norm_eps);

  const int num_tokens = PrepareBatch(batch);

  float* x = x_.get();
  float* xn = xn_.get();
  float* qkv = qkv_.get();
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = model_.layer(layer);
    if (hooks != nullptr && hooks->before_layer) hooks->before_layer(layer);
    // Attention block.
    for (int t = 0; t < num_tokens; ++t)
      RmsNorm(x + static_cast<size_t>(t) * h, w.input_norm, h, eps, xn + static_cast<size_t>(t) * h);
    Linear(xn, num_tokens, w.qkv_proj, qkv, 0.0f);
    for (int t = 0; t < num_tokens; ++t) {
      float* row = qkv + static_cast<size_t>(t) * qkv_dim;
      if (w.qkv_bias != nullptr)
        for (int i = 0; i < qkv_dim; ++i) row[i] += w.qkv_bias[i];
      const float* cs = cos_.get() + static_cast<size_t>(t) * half;
      const float* sn = sin_.get() + static_cast<size_t>(t) * half;
      for (int head = 0; head < c.num_heads + c.num_kv_heads; ++head)
        ApplyRope(row + head * d, cs, sn, half);  // q heads then k heads are adjacent
      // Store K and V at the token's slot.
      const SequenceInput& seq = batch[token_seq_[t]];
      const int pos = token_pos_[t];
      const int32_t block = seq.block_table[pos / layout.block_size];
      const int slot = pos % layout.block_size;
      for (int kvh = 0; kvh < c.num_kv_heads; ++kvh) {
        std::memcpy(cache.HeadData(layer, block, 0, kvh) + static_cast<size_t>(slot) * d,
                    row + q_dim + kvh * d, sizeof(float) * d);
        std::memcpy(cache.HeadData(layer, block, 1, kvh) + static_cast<size_t>(slot) * d,
                    row + q_dim + kv_dim + kvh * d, sizeof(float) * d);
      }
    }
    Attention(layer, batch, cache);
    // Every K/V of this layer is written (above) and read (Attention): the cache's layer is done.
    if (hooks != nullptr && hooks->after_layer) hooks->after_layer(layer);
    ResidualLinear(attn_.get(), num_tokens, w.o_proj, hooks);
    if (w.o_bias != nullptr) {
      for (int t = 0; t < num_tokens; ++t)
        for (int i = 0; i < h; ++i) x[static_cast<size_t>(t) * h + i] += w.o_bias[i];
    }
    // MLP block: down(silu(gate(x)) * up(x)).
    for (int t = 0; t < num_tokens; ++t)
      RmsNorm(x + static_cast<size_t>(t) * h, w.post_norm, h, eps, xn + static_cast<size_t>(t) * h);
    Linear(xn, num_tokens, w.gate_up, mlp_.get(), 0.0f);
    for (int t = 0; t < num_tokens; ++t) {
      const float* gate = mlp_.get() + static_cast<size_t>(t) * 2 * inter;
      const float* up = gate + inter;
      float* out = act_.get() + static_cast<size_t>(t) * inter;
      for (int i = 0; i < inter; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    }
    ResidualLinear(act_.get(), num_tokens, w.down_proj, hooks);
  }

  // Final norm and LM head on the rows that need logits.
  int rows = 0;
  float* normed;
  if (mode == LogitsMode::kAllTokens) {
    rows = num_tokens;
    normed = xn;
    for (int t = 0; t < num_tokens; ++t)
      RmsNorm(x + static_cast<size_t>(t) * h, model_.final_norm(), h, eps, xn + static_cast<size_t>(t) * h);
  } else {
    rows = num_seqs;
    normed = last_.get();
    for (int s = 0; s < num_seqs; ++s) {
      const int t = seq_first_token_[s + 1] - 1;
      RmsNorm(x + static_cast<size_t>(t) * h, model_.final_norm(), h, eps,
              normed + static_cast<size_t>(s) * h);
    }
  }
  logits_.Resize(static_cast<size_t>(rows) * c.vocab_size);  // no-op except for kAllTokens
  Linear(normed, rows, model_.lm_head(), logits_.get(), 0.0f);
  const std::span<const float> logits(logits_.get(), static_cast<size_t>(rows) * c.vocab_size);
  if (greedy != nullptr)  // the token here, as the engine would: the logits are on the host
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!greedy->wanted[i]) continue;
      const std::span<float> row(logits_.get() + i * c.vocab_size, c.vocab_size);
      TANDEM_RETURN_IF_ERROR(ApplyScoreEdits(row, greedy->edits_of(i)));  // ids checked above
      greedy->argmax[i] =
          greedy->drawn(i) ? DrawRow(row, greedy->draws[i],
                                     greedy->wants_logprobs(i) ? &greedy->logprobs[i] : nullptr)
                           : ArgmaxRow(row);
    }
  return logits;
}

}  // namespace tandem
