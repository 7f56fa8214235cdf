#include "common/engine/cuda/cuda_forward.h"
#include "common/engine/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <utility>

#include "common/engine/device_memory.h"
#include "common/engine/tensor_parallel.h"
#include "common/engine/tp_forward.h"
#include "common/model/weight_matrix.h"

namespace tandem::cuda {
namespace {

// The device dtype of a model's matrices: fp32 stays fp32, bf16 and f16 become bf16.
DType DeviceDType(WeightDType dtype) {
  return dtype == WeightDType::kF32 ? DType::kF32 : DType::kBF16;
}

size_t DeviceMatrixBytes(const WeightMatrix& w, DType dtype) {
  return size_t{static_cast<size_t>(w.rows)} * w.cols * DTypeSize(dtype);
}

// Writes w's elements as `dtype` into host memory `out` (fp32 -> fp32, bf16 -> bf16 as is,
// f16 -> bf16 through fp32, rounded to nearest even).
void HostMatrixAs(const WeightMatrix& w, DType dtype, void* out) {
  const size_t n = size_t{static_cast<size_t>(w.rows)} * w.cols;
  if ((w.dtype == WeightDType::kF32 && dtype == DType::kF32) ||
      (w.dtype == WeightDType::kBF16 && dtype == DType::kBF16)) {
    std::memcpy(out, w.data, n * DTypeSize(dtype));
    return;
  }
  TANDEM_CHECK(w.dtype == WeightDType::kF16 && dtype == DType::kBF16, "no such weight conversion");
  const auto* in = static_cast<const uint16_t*>(w.data);
  auto* dst = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < n; ++i) dst[i] = F32ToBF16(F16ToF32(in[i]));
}

}  // namespace

CudaForward::CudaForward(const Model& model, const ForwardOptions& options, const CudaRank& where)
    : model_(model), options_(options), where_(where) {}

CudaForward::~CudaForward() {
  // The members go with this rank's device current: a tensor-parallel engine destroys every
  // rank on its own thread, and cuBLAS wants a handle destroyed on the device it was made on.
  (void)SetDevice(where_.device);
  // Work queued on the stream may still read the buffers below (a collective that never ends
  // was aborted by the clique's owner before this runs).
  if (stream_.get() != nullptr) (void)stream_.Synchronize();
}

Status CudaForward::SyncStream() const {
  if (where_.sync_timeout.count() > 0) return stream_.SynchronizeWithin(where_.sync_timeout);
  return stream_.Synchronize();
}

StatusOr<std::unique_ptr<CudaForward>> CudaForward::Create(const Model& model,
                                                           const ForwardOptions& options,
                                                           const CudaRank& where) {
  const ModelConfig& c = model.config();
  if (options.max_batch_tokens < 1 || options.max_batch_sequences < 1)
    return InvalidArgument("forward: max_batch_tokens and max_batch_sequences must be positive");
  if (c.head_dim > 256 || c.head_dim % 2 != 0)
    return InvalidArgument("forward (cuda): head_dim " + std::to_string(c.head_dim) +
                           " must be even and at most 256");
  TANDEM_ASSIGN_OR_RETURN(int visible, DeviceCount());
  if (where.device < 0 || where.device >= visible)
    return InvalidArgument("forward (cuda): device " + std::to_string(where.device) + " of " +
                           std::to_string(visible) + " visible");
  TANDEM_RETURN_IF_ERROR(SetDevice(where.device));
  auto f = std::unique_ptr<CudaForward>(new CudaForward(model, options, where));
  TANDEM_ASSIGN_OR_RETURN(std::string name, DeviceName());
  f->description_ = "cuda:" + std::to_string(where.device) + " (" + name + ")";
  f->wdtype_ = DeviceDType(model.dtype());
  TANDEM_ASSIGN_OR_RETURN(f->stream_, CudaStream::Create());
  TANDEM_ASSIGN_OR_RETURN(f->cublas_, CublasHandle::Create());
  TANDEM_RETURN_IF_ERROR(f->cublas_.SetStream(f->stream_.get()));
  TANDEM_ASSIGN_OR_RETURN(f->cublas_workspace_, DeviceBuffer::Allocate(kCublasWorkspaceBytes));
  TANDEM_RETURN_IF_ERROR(
      f->cublas_.SetWorkspace(f->cublas_workspace_.data(), f->cublas_workspace_.size()));
  TANDEM_RETURN_IF_ERROR(f->UploadWeights());
  TANDEM_RETURN_IF_ERROR(f->AllocateWorkspaces());
  if (options.cuda_graphs && where.clique == nullptr)
    f->graph_sizes_ = DecodeGraphSizes(options.max_batch_sequences);
  TANDEM_RETURN_IF_ERROR(f->stream_.Synchronize());
  return f;
}

Status CudaForward::UploadWeights() {
  const ModelConfig& c = model_.config();
  const bool tied = model_.lm_head().data == model_.embed_tokens().data;
  // One allocation; every tensor at a 256-byte aligned offset. First the plan, then the copy.
  struct Piece {
    const WeightMatrix* matrix = nullptr;  // or
    const float* vector = nullptr;
    size_t floats = 0;
    size_t offset = 0;
  };
  std::vector<Piece> pieces;
  size_t total = 0;
  auto add_matrix = [&](const WeightMatrix& w) {
    pieces.push_back({&w, nullptr, 0, total});
    total += AlignUpCuda(DeviceMatrixBytes(w, wdtype_));
    return pieces.size() - 1;
  };
  auto add_vector = [&](const float* v, size_t n) -> size_t {
    if (v == nullptr) return SIZE_MAX;
    pieces.push_back({nullptr, v, n, total});
    total += AlignUpCuda(n * sizeof(float));
    return pieces.size() - 1;
  };
  const size_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  struct LayerPieces {
    size_t input_norm, qkv, qkv_bias, o, o_bias, post_norm, gate_up, down;
  };
  std::vector<LayerPieces> lp(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    lp[l] = {add_vector(w.input_norm, c.hidden_size), add_matrix(w.qkv_proj),
             add_vector(w.qkv_bias, qkv_dim),         add_matrix(w.o_proj),
             add_vector(w.o_bias, c.hidden_size),     add_vector(w.post_norm, c.hidden_size),
             add_matrix(w.gate_up),                   add_matrix(w.down_proj)};
  }
  const size_t embed = add_matrix(model_.embed_tokens());
  const size_t lm_head = tied ? embed : add_matrix(model_.lm_head());
  const size_t final_norm = add_vector(model_.final_norm(), c.hidden_size);
  const size_t inv_freq_bytes = size_t(c.head_dim / 2) * sizeof(float);

  TANDEM_ASSIGN_OR_RETURN(weights_, DeviceBuffer::Allocate(total));
  // Staged through one page-locked buffer of the largest tensor, a tensor at a time.
  size_t largest = inv_freq_bytes;
  for (const Piece& p : pieces)
    largest = std::max(largest, p.matrix != nullptr ? DeviceMatrixBytes(*p.matrix, wdtype_)
                                                    : p.floats * sizeof(float));
  TANDEM_ASSIGN_OR_RETURN(PinnedHostBuffer staging, PinnedHostBuffer::Allocate(largest));
  for (const Piece& p : pieces) {
    size_t bytes = 0;
    if (p.matrix != nullptr) {
      HostMatrixAs(*p.matrix, wdtype_, staging.data());
      bytes = DeviceMatrixBytes(*p.matrix, wdtype_);
    } else {
      std::memcpy(staging.data(), p.vector, p.floats * sizeof(float));
      bytes = p.floats * sizeof(float);
    }
    TANDEM_RETURN_IF_ERROR(weights_.CopyFromHost(staging.data(), bytes, stream_.get(), p.offset));
    TANDEM_RETURN_IF_ERROR(stream_.Synchronize());  // the staging buffer is reused next
  }
  auto at = [&](size_t piece) -> const void* {
    if (piece == SIZE_MAX) return nullptr;
    return static_cast<const std::byte*>(weights_.data()) + pieces[piece].offset;
  };
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    DeviceLayer& d = layers_[l];
    d.input_norm = static_cast<const float*>(at(lp[l].input_norm));
    d.qkv = at(lp[l].qkv);
    d.qkv_bias = static_cast<const float*>(at(lp[l].qkv_bias));
    d.o = at(lp[l].o);
    d.o_bias = static_cast<const float*>(at(lp[l].o_bias));
    d.post_norm = static_cast<const float*>(at(lp[l].post_norm));
    d.gate_up = at(lp[l].gate_up);
    d.down = at(lp[l].down);
  }
  embed_ = at(embed);
  lm_head_ = at(lm_head);
  final_norm_ = static_cast<const float*>(at(final_norm));

  const std::vector<float> inv_freq = RopeInvFreq(c);
  TANDEM_ASSIGN_OR_RETURN(inv_freq_, DeviceBuffer::Allocate(inv_freq_bytes));
  std::memcpy(staging.data(), inv_freq.data(), inv_freq_bytes);
  TANDEM_RETURN_IF_ERROR(inv_freq_.CopyFromHost(staging.data(), inv_freq_bytes, stream_.get()));
  return stream_.Synchronize();
}

Status CudaForward::AllocateWorkspaces() {
  // The plan InstanceKvPools sized the KV pool against (common/engine/device_memory.h).
  const CudaWorkspacePlan p =
      PlanCudaWorkspaces(model_.config(), options_, wdtype_ != DType::kF32, where_.returns_logits);
  const size_t s = options_.max_batch_sequences;
  graph_partitions_ = p.decode_partitions;
  const std::pair<DeviceBuffer*, size_t> activations[] = {
      {&x_, p.x},     {&xn_, p.xn},     {&qkv_, p.qkv},   {&attn_, p.attn},        {&mlp_, p.mlp},
      {&act_, p.act}, {&lowp_, p.lowp}, {&last_, p.last}, {&partials_, p.partials}};
  for (auto [buffer, bytes] : activations) {
    if (bytes == 0) continue;  // lowp_: fp32 weights need no bf16 staging
    TANDEM_ASSIGN_OR_RETURN(*buffer, DeviceBuffer::Allocate(bytes));
  }
  if (where_.returns_logits) {  // a rank whose logits nobody reads has no LM head output
    logits_rows_capacity_ = s;
    const std::tuple<DeviceBuffer*, PinnedHostBuffer*, size_t> outputs[] = {
        {&logits_, &logits_host_, p.logits},
        {&argmax_, &argmax_host_, p.argmax},
        {&draws_, &draws_host_, p.draws},
        {&logprobs_, &logprobs_host_, p.logprobs},
        {&edit_begin_, &edit_begin_host_, p.edit_begin}};
    for (auto [device, host, bytes] : outputs) {
      TANDEM_ASSIGN_OR_RETURN(*device, DeviceBuffer::Allocate(bytes));
      TANDEM_ASSIGN_OR_RETURN(*host, PinnedHostBuffer::Allocate(bytes));
    }
  }
  slots_ = p.inputs;
  TANDEM_ASSIGN_OR_RETURN(inputs_, DeviceBuffer::Allocate(slots_.bytes));
  TANDEM_ASSIGN_OR_RETURN(inputs_host_, PinnedHostBuffer::Allocate(slots_.bytes));
  return Status::Ok();
}

KvLayout CudaForward::MakeKvLayout(int block_size) const {
  const ModelConfig& c = model_.config();
  return KvLayout{c.num_layers, c.num_kv_heads, c.head_dim, block_size, options_.kv_dtype};
}

StatusOr<KvPoolMemory> CudaForward::AllocateKvPool(size_t bytes) {
  return AllocateCudaKvPool(bytes, where_.device);
}

StatusOr<KvPoolMemory> AllocateCudaKvPool(size_t bytes, int device) {
  TANDEM_RETURN_IF_ERROR(DeviceCount().status());
  TANDEM_RETURN_IF_ERROR(SetDevice(device));
  TANDEM_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(bytes));
  TANDEM_RETURN_IF_ERROR(buffer.Zero());
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  auto owner = std::make_shared<DeviceBuffer>(std::move(buffer));
  KvPoolMemory memory;
  memory.base = static_cast<std::byte*>(owner->data());
  memory.bytes = owner->size();
  memory.kind = KvMemoryKind::kCudaDevice;
  memory.owner = std::move(owner);
  return memory;
}

Status CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyDefault));
  return Status();
}

Status CudaForward::UploadInputs() {
  const DeviceBatch& b = batch_;
  const size_t tables_bytes = b.block_tables.size() * sizeof(int32_t);
  if (slots_.block_tables + tables_bytes > slots_.bytes ||
      b.tiles.size() * sizeof(int32_t) > slots_.block_tables - slots_.tiles)
    return TooLarge("forward (cuda): the batch's block tables exceed what max_model_len sized");
  auto put = [&](size_t offset, const auto& v) {
    std::memcpy(static_cast<std::byte*>(inputs_host_.data()) + offset, v.data(),
                v.size() * sizeof(v[0]));
  };
  put(slots_.token_ids, b.token_ids);
  put(slots_.positions, b.positions);
  put(slots_.slot_mapping, b.slot_mapping);
  put(slots_.block_tables, b.block_tables);
  put(slots_.seq_lens, b.seq_lens);
  put(slots_.last_token, b.last_token);
  put(slots_.tiles, b.tiles);
  // One copy of everything: the slots are small, and the page-locked mirror makes it async.
  const size_t used = slots_.block_tables + tables_bytes;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(inputs_.data(), inputs_host_.data(), used,
                                              cudaMemcpyHostToDevice, stream_.get()));
  return Status::Ok();
}

StatusOr<const void*> CudaForward::ToWeightDType(const float* src, int64_t n) {
  if (wdtype_ == DType::kF32) return static_cast<const void*>(src);
  TANDEM_RETURN_IF_ERROR(Convert(DType::kF32, src, wdtype_, lowp_.data(), n, stream_.get()));
  return static_cast<const void*>(lowp_.data());
}

Status CudaForward::EnqueuePass(KvCache& cache, LogitsMode mode, const ForwardHooks* hooks,
                                int32_t partitions) {
  const ModelConfig& c = model_.config();
  const KvLayout& layout = cache.layout();
  cudaStream_t stream = stream_.get();
  const int32_t T = batch_.num_tokens, S = batch_.num_seqs;
  const int32_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int32_t q_dim = c.q_dim(), kv_dim = c.kv_dim(), qkv_dim = q_dim + 2 * kv_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* x = x_.as<float>();
  float* xn = xn_.as<float>();
  float* qkv = qkv_.as<float>();
  const int32_t* token_ids = Input<int32_t>(slots_.token_ids);
  const int32_t* positions = Input<int32_t>(slots_.positions);

  // Embeddings: gathered in the table's dtype, widened into the fp32 residual stream.
  if (wdtype_ == DType::kF32) {
    TANDEM_RETURN_IF_ERROR(EmbeddingGather(DType::kF32, embed_, token_ids, x, T, h, c.vocab_size,
                                           stream));
  } else {
    TANDEM_RETURN_IF_ERROR(EmbeddingGather(wdtype_, embed_, token_ids, lowp_.data(), T, h,
                                           c.vocab_size, stream));
    TANDEM_RETURN_IF_ERROR(Convert(wdtype_, lowp_.data(), DType::kF32, x, int64_t{T} * h, stream));
  }

  PagedAttentionArgs attn;
  attn.q = qkv;
  attn.q_stride = qkv_dim;
  // The pool's values: fp32, or bf16 (kv_cache.dtype); the kernels convert on write and read.
  attn.kv_dtype = layout.dtype == KvDType::kBFloat16 ? DType::kBF16 : DType::kF32;
  attn.shape = PagedKvShape{layout.num_kv_heads, layout.head_dim, layout.block_size};
  attn.block_tables = Input<int32_t>(slots_.block_tables);
  attn.max_blocks_per_seq = batch_.max_blocks_per_seq;
  attn.num_heads = c.num_heads;
  attn.sliding_window = c.sliding_window;
  attn.scale = 1.0f / std::sqrt(static_cast<float>(d));
  attn.out = attn_.as<float>();
  attn.out_stride = q_dim;
  const size_t layer_bytes = cache.block_bytes() * static_cast<size_t>(cache.num_blocks());

  for (int layer = 0; layer < c.num_layers; ++layer) {
    const DeviceLayer& w = layers_[layer];
    if (hooks != nullptr && hooks->before_layer) hooks->before_layer(layer);
    void* layer_base = cache.data() + layer * layer_bytes;
    // Attention block.
    TANDEM_RETURN_IF_ERROR(RmsNorm(DType::kF32, x, w.input_norm, xn, T, h, eps, stream));
    TANDEM_ASSIGN_OR_RETURN(const void* in, ToWeightDType(xn, int64_t{T} * h));
    TANDEM_RETURN_IF_ERROR(Gemm(cublas_, wdtype_, in, w.qkv, DType::kF32, qkv, T, qkv_dim, h));
    if (w.qkv_bias != nullptr)
      TANDEM_RETURN_IF_ERROR(AddRowBias(qkv, w.qkv_bias, T, qkv_dim, stream));
    TANDEM_RETURN_IF_ERROR(Rope(DType::kF32, qkv, qkv + q_dim, positions, inv_freq_.as<float>(), T,
                                c.num_heads, c.num_kv_heads, d, qkv_dim, qkv_dim, stream));
    TANDEM_RETURN_IF_ERROR(WriteKvCache(DType::kF32, qkv + q_dim, qkv + q_dim + kv_dim, qkv_dim,
                                        attn.kv_dtype, layer_base, attn.shape,
                                        Input<int64_t>(slots_.slot_mapping), T, stream));
    attn.layer_base = layer_base;
    if (batch_.decode_only) {
      TANDEM_RETURN_IF_ERROR(PagedAttentionDecode(attn, Input<int32_t>(slots_.seq_lens), S,
                                                  partitions, partials_.as<float>(), stream));
    } else {
      TANDEM_RETURN_IF_ERROR(PagedAttentionPrefill(attn, positions, Input<int32_t>(slots_.tiles),
                                                   batch_.num_tiles(), stream));
    }
    TANDEM_ASSIGN_OR_RETURN(in, ToWeightDType(attn_.as<float>(), int64_t{T} * q_dim));
    TANDEM_RETURN_IF_ERROR(AddProjection(in, w.o, q_dim, T));
    if (w.o_bias != nullptr) TANDEM_RETURN_IF_ERROR(AddRowBias(x, w.o_bias, T, h, stream));
    if (hooks != nullptr && hooks->after_layer) {
      TANDEM_RETURN_IF_ERROR(SyncStream());  // the layer's K/V (every rank's) are in the pool
      hooks->after_layer(layer);
    }
    // MLP block: down(silu(gate(x)) * up(x)), added into the residual.
    TANDEM_RETURN_IF_ERROR(RmsNorm(DType::kF32, x, w.post_norm, xn, T, h, eps, stream));
    TANDEM_ASSIGN_OR_RETURN(in, ToWeightDType(xn, int64_t{T} * h));
    TANDEM_RETURN_IF_ERROR(
        Gemm(cublas_, wdtype_, in, w.gate_up, DType::kF32, mlp_.data(), T, 2 * inter, h));
    TANDEM_RETURN_IF_ERROR(SiluAndMul(DType::kF32, mlp_.as<float>(), mlp_.as<float>() + inter,
                                      act_.data(), T, inter, 2 * inter, stream));
    TANDEM_ASSIGN_OR_RETURN(in, ToWeightDType(act_.as<float>(), int64_t{T} * inter));
    TANDEM_RETURN_IF_ERROR(AddProjection(in, w.down, inter, T));
  }
  if (!where_.returns_logits) return Status::Ok();

  // Final norm and LM head on the rows that need logits.
  const float* normed = xn;
  int32_t rows = T;
  if (mode == LogitsMode::kLastToken) {
    rows = S;
    // The last token of each sequence: a gather over the rows of x (vocab = T rows).
    TANDEM_RETURN_IF_ERROR(EmbeddingGather(DType::kF32, x, Input<int32_t>(slots_.last_token),
                                           last_.data(), S, h, T, stream));
    TANDEM_RETURN_IF_ERROR(
        RmsNorm(DType::kF32, last_.data(), final_norm_, last_.data(), S, h, eps, stream));
    normed = last_.as<float>();
  } else {
    TANDEM_RETURN_IF_ERROR(RmsNorm(DType::kF32, x, final_norm_, xn, T, h, eps, stream));
  }
  TANDEM_ASSIGN_OR_RETURN(const void* in, ToWeightDType(normed, int64_t{rows} * h));
  TANDEM_RETURN_IF_ERROR(
      Gemm(cublas_, wdtype_, in, lm_head_, DType::kF32, logits_.data(), rows, c.vocab_size, h));
  if (mode != LogitsMode::kLastToken) return Status::Ok();
  // Greedy rows need only this (GreedyRows); S ids, cheap next to the LM head.
  return ArgmaxRows(logits_.as<float>(), rows, c.vocab_size, argmax_.as<int32_t>(), stream);
}

Status CudaForward::AddProjection(const void* in, const void* w, int32_t k, int32_t tokens) {
  const int32_t h = model_.config().hidden_size;
  float* x = x_.as<float>();
  if (where_.clique == nullptr)  // one GEMM that adds into the residual
    return Gemm(cublas_, wdtype_, in, w, DType::kF32, x, tokens, h, k, 1.0f);
  // This rank's partial sum into xn_ (free here: its reader, the GEMM before, is queued
  // ahead), summed over the ranks, then added.
  float* partial = xn_.as<float>();
  const int64_t n = int64_t{tokens} * h;
  TANDEM_RETURN_IF_ERROR(Gemm(cublas_, wdtype_, in, w, DType::kF32, partial, tokens, h, k));
  TANDEM_RETURN_IF_ERROR(
      where_.clique->AllReduceSum(where_.rank, partial, static_cast<size_t>(n), stream_.get()));
  return Add(DType::kF32, x, partial, x, n, stream_.get());
}

Status CudaForward::EnqueueScoreEdits(const GreedyRows& greedy, int32_t rows) {
  const int32_t vocab = model_.config().vocab_size;
  const size_t count = greedy.edits.size();
  if (count > edits_capacity_) {  // the last reader of the old buffers finished (SyncStream)
    const size_t capacity = std::max(count, 2 * edits_capacity_);
    TANDEM_ASSIGN_OR_RETURN(edits_, DeviceBuffer::Allocate(capacity * sizeof(ScoreEdit)));
    TANDEM_ASSIGN_OR_RETURN(edits_host_, PinnedHostBuffer::Allocate(capacity * sizeof(ScoreEdit)));
    edits_capacity_ = capacity;
  }
  std::copy(greedy.edits.begin(), greedy.edits.end(), edits_host_.as<ScoreEdit>());
  std::copy(greedy.edit_begin.begin(), greedy.edit_begin.end(), edit_begin_host_.as<int32_t>());
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(edits_.data(), edits_host_.data(),
                                              count * sizeof(ScoreEdit), cudaMemcpyHostToDevice,
                                              stream_.get()));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(edit_begin_.data(), edit_begin_host_.data(),
                                              (rows + 1) * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream_.get()));
  TANDEM_RETURN_IF_ERROR(ApplyScoreEdits(logits_.as<float>(), rows, vocab, edits_.as<ScoreEdit>(),
                                         edit_begin_.as<int32_t>(), stream_.get()));
  // The pass took every row's argmax before the edits; the edited greedy rows need it after.
  return ArgmaxRows(logits_.as<float>(), rows, vocab, argmax_.as<int32_t>(), stream_.get());
}

Status CudaForward::RunGraph(int32_t graph_size, int32_t partitions, KvCache& cache) {
  Graph& graph = graphs_[{graph_size, partitions}];
  if (graph.exec.empty() || graph.pool != cache.data() || graph.num_blocks != cache.num_blocks()) {
    // A size's first pass runs once eagerly before its capture (as PyTorch and vLLM warm up):
    // cuBLAS picks its kernels for these shapes, and CUDA loads the modules they use (lazily,
    // by default), outside the capture. The graph then redoes the same pass: the same KV
    // writes and outputs.
    if (!graph.warmed) {
      TANDEM_RETURN_IF_ERROR(EnqueuePass(cache, LogitsMode::kLastToken, nullptr, partitions));
      graph.warmed = true;
    }
    // Captured over this pool's addresses and the fixed input slots; replayed from now on.
    TANDEM_RETURN_IF_ERROR(CudaGraph::BeginCapture(stream_.get()));
    Status queued = EnqueuePass(cache, LogitsMode::kLastToken, nullptr, partitions);
    StatusOr<CudaGraph> exec = CudaGraph::EndCapture(stream_.get());
    TANDEM_RETURN_IF_ERROR(queued);
    TANDEM_RETURN_IF_ERROR(exec.status());
    graph.exec = std::move(exec).value();
    graph.pool = cache.data();
    graph.num_blocks = cache.num_blocks();  // the per-layer offsets baked into the graph
  }
  return graph.exec.Launch(stream_.get());
}

StatusOr<std::span<const float>> CudaForward::Forward(std::span<const SequenceInput> batch,
                                                      KvCache& cache, LogitsMode mode,
                                                      const ForwardHooks* hooks,
                                                      GreedyRows* greedy) {
  TANDEM_RETURN_IF_ERROR(ValidateForwardBatch(model_.config(), options_, batch, cache.layout(),
                                              cache.num_blocks()));
  TANDEM_RETURN_IF_ERROR(
      ValidateGreedyRows(greedy, batch.size(), mode, model_.config().vocab_size));
  if (cache.memory_kind() != KvMemoryKind::kCudaDevice)
    return InvalidArgument("forward (cuda): the KV pool is in host memory (allocate it with "
                           "AllocateKvPool)");
  // The block tables of graph passes and the decode partials are sized for max_model_len.
  const int64_t max_len = options_.max_model_len > 0 ? options_.max_model_len
                                                     : model_.config().max_position_embeddings;
  for (const SequenceInput& seq : batch)
    if (seq.start_position + static_cast<int64_t>(seq.tokens.size()) > max_len)
      return TooLarge("forward (cuda): a sequence of " +
                      std::to_string(seq.start_position + seq.tokens.size()) +
                      " tokens exceeds max_model_len " + std::to_string(max_len));
  if (hooks != nullptr && hooks->all_reduce)
    return InvalidArgument("forward (cuda): all_reduce hooks reduce host buffers (the CPU "
                           "backend's tensor parallelism); the CUDA backend has none");
  StatusOr<std::span<const float>> out = RunOnDevice(batch, cache, mode, hooks, greedy, max_len);
  // Work queued before an error may still read the page-locked mirrors and device buffers
  // that the next call rewrites (or frees, when they grow): wait for it here, bounded as every
  // wait of this class, unless the error was that wait running out.
  if (!out.ok() && out.status().code() != StatusCode::kDeadlineExceeded) (void)SyncStream();
  return out;
}

StatusOr<std::span<const float>> CudaForward::RunOnDevice(std::span<const SequenceInput> batch,
                                                          KvCache& cache, LogitsMode mode,
                                                          const ForwardHooks* hooks,
                                                          GreedyRows* greedy, int64_t max_len) {
  TANDEM_RETURN_IF_ERROR(SetDevice(where_.device));
  const ModelConfig& c = model_.config();
  const int32_t block_size = cache.layout().block_size;
  const bool no_hooks = hooks == nullptr || (!hooks->before_layer && !hooks->after_layer);
  bool decode_only = true;
  for (const SequenceInput& seq : batch) decode_only = decode_only && seq.tokens.size() == 1;
  const int32_t graph_size =
      decode_only && no_hooks && mode == LogitsMode::kLastToken
          ? GraphBatchSize(graph_sizes_, static_cast<int32_t>(batch.size()))
          : 0;
  last_pass_used_graph_ = graph_size > 0;

  int32_t rows = static_cast<int32_t>(batch.size());
  if (graph_size > 0) {
    if (block_size != block_size_) {  // a pool of another block size: new table rows, new graphs
      block_size_ = block_size;
      graphs_.clear();
    }
    int64_t longest = 0;  // decode: each sequence's context ends at its one new token
    for (const SequenceInput& seq : batch)
      longest = std::max<int64_t>(longest, int64_t{seq.start_position} + 1);
    const DecodeGraphShape shape =
        DecodeGraphShapeFor(longest, max_len, block_size, kDecodePartitionTokens);
    TANDEM_CHECK(shape.partitions <= graph_partitions_, "more partitions than partials hold");
    BuildDeviceBatch(batch, block_size, shape.max_blocks_per_seq, graph_size, kPrefillTileTokens,
                     &batch_);
    TANDEM_RETURN_IF_ERROR(UploadInputs());
    TANDEM_RETURN_IF_ERROR(RunGraph(graph_size, shape.partitions, cache));
  } else {
    BuildDeviceBatch(batch, block_size, 0, 0, kPrefillTileTokens, &batch_);
    if (mode == LogitsMode::kAllTokens) rows = batch_.num_tokens;
    if (where_.returns_logits && static_cast<size_t>(rows) > logits_rows_capacity_) {
      TANDEM_RETURN_IF_ERROR(stream_.Synchronize());
      TANDEM_ASSIGN_OR_RETURN(logits_, DeviceBuffer::Allocate(size_t(rows) * c.vocab_size * 4));
      TANDEM_ASSIGN_OR_RETURN(logits_host_,
                              PinnedHostBuffer::Allocate(size_t(rows) * c.vocab_size * 4));
      logits_rows_capacity_ = rows;
      graphs_.clear();  // they wrote the old logits buffer
    }
    TANDEM_RETURN_IF_ERROR(UploadInputs());
    TANDEM_RETURN_IF_ERROR(
        EnqueuePass(cache, mode, hooks, DecodePartitions(batch_.max_context)));
  }
  if (!where_.returns_logits) {
    TANDEM_RETURN_IF_ERROR(SyncStream());
    return std::span<const float>();
  }
  if (greedy != nullptr && !greedy->edits.empty())  // before the argmax and draws read them
    TANDEM_RETURN_IF_ERROR(EnqueueScoreEdits(*greedy, static_cast<int32_t>(batch.size())));
  bool any_drawn = false, any_logprobs = false;
  for (size_t i = 0; greedy != nullptr && i < batch.size(); ++i) {
    any_drawn = any_drawn || greedy->drawn(i);
    any_logprobs = any_logprobs || greedy->wants_logprobs(i);
  }
  if (any_drawn) {  // over the argmax ids of those rows, from the logits still on the device
    std::copy(greedy->draws.begin(), greedy->draws.end(), draws_host_.as<RowDraw>());
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(draws_.data(), draws_host_.data(),
                                                batch.size() * sizeof(RowDraw),
                                                cudaMemcpyHostToDevice, stream_.get()));
    TANDEM_RETURN_IF_ERROR(DrawRows(logits_.as<float>(), static_cast<int32_t>(batch.size()),
                                    c.vocab_size, draws_.as<RowDraw>(), argmax_.as<int32_t>(),
                                    logprobs_.as<RowLogprobs>(), stream_.get()));
  }
  if (any_logprobs)
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logprobs_host_.data(), logprobs_.data(),
                                                batch.size() * sizeof(RowLogprobs),
                                                cudaMemcpyDeviceToHost, stream_.get()));
  if (greedy != nullptr)
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(argmax_host_.data(), argmax_.data(),
                                                batch.size() * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, stream_.get()));
  const bool logits_needed = greedy == nullptr || !greedy->all_wanted();
  const size_t bytes = logits_needed ? size_t(rows) * c.vocab_size * sizeof(float) : 0;
  if (bytes > 0)
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits_host_.data(), logits_.data(), bytes,
                                                cudaMemcpyDeviceToHost, stream_.get()));
  TANDEM_RETURN_IF_ERROR(SyncStream());
  if (greedy != nullptr)
    for (size_t i = 0; i < batch.size(); ++i) {
      if (greedy->wanted[i]) greedy->argmax[i] = argmax_host_.as<int32_t>()[i];
      if (greedy->wanted[i] && greedy->wants_logprobs(i))  // other entries are left alone
        greedy->logprobs[i] = logprobs_host_.as<RowLogprobs>()[i];
    }
  return std::span<const float>(logits_host_.as<float>(), bytes / sizeof(float));
}

StatusOr<std::unique_ptr<ForwardBackend>> CreateCudaBackend(const Model& model,
                                                            const ForwardOptions& options) {
  if (options.tensor_parallel <= 1) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CudaForward> gpu, CudaForward::Create(model, options));
    return std::unique_ptr<ForwardBackend>(std::move(gpu));
  }
  const int t = options.tensor_parallel;
  TANDEM_ASSIGN_OR_RETURN(TpPlan plan, MakeTpPlan(model.config(), t));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<NcclClique> made, NcclClique::Create(t));
  std::shared_ptr<NcclClique> clique = std::move(made);
  std::vector<TpForward::Rank> ranks;
  for (int r = 0; r < t; ++r) {
    TpForward::Rank rank;
    TANDEM_ASSIGN_OR_RETURN(rank.shard, ShardModel(model, plan, r));
    CudaRank where;
    where.device = r;
    where.clique = clique.get();
    where.rank = r;
    where.returns_logits = r == 0;  // the LM head is replicated: rank 0's logits are the pass's
    where.sync_timeout = options.collective_timeout;
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CudaForward> forward,
                            CudaForward::Create(*rank.shard, options, where));
    rank.forward = std::move(forward);
    ranks.push_back(std::move(rank));
  }
  TANDEM_RETURN_IF_ERROR(SetDevice(0));
  TANDEM_ASSIGN_OR_RETURN(std::string name, DeviceName());
  TpCollective collective;
  collective.abort = [c = clique.get()] { c->Abort(); };
  collective.keep_alive = clique;
  TANDEM_ASSIGN_OR_RETURN(
      std::unique_ptr<TpForward> tp,
      TpForward::Create(model, std::move(plan), std::move(ranks), std::move(collective),
                        options.collective_timeout,
                        "cuda:0-" + std::to_string(t - 1) + " tensor_parallel " +
                            std::to_string(t) + " (" + name + ")"));
  return std::unique_ptr<ForwardBackend>(std::move(tp));
}

StatusOr<uint64_t> CudaDeviceMemoryBytes() {
  TANDEM_RETURN_IF_ERROR(DeviceCount().status());
  TANDEM_RETURN_IF_ERROR(SetDevice(0));
  return DeviceMemoryBytes();
}

StatusOr<std::pair<uint64_t, uint64_t>> CudaDeviceFreeAndTotalBytes(int device) {
  TANDEM_ASSIGN_OR_RETURN(int visible, DeviceCount());
  if (device < 0 || device >= visible)
    return InvalidArgument("GPU " + std::to_string(device) + " of " + std::to_string(visible) +
                           " visible");
  TANDEM_RETURN_IF_ERROR(SetDevice(device));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaFree(nullptr));  // makes the context if there is none yet
  TANDEM_ASSIGN_OR_RETURN(uint64_t free_bytes, DeviceFreeMemoryBytes());
  TANDEM_ASSIGN_OR_RETURN(uint64_t total_bytes, DeviceMemoryBytes());
  TANDEM_RETURN_IF_ERROR(SetDevice(0));
  return std::pair{free_bytes, total_bytes};
}

std::string DescribeCudaDevices() {
  StatusOr<int> count = DeviceCount();
  if (!count.ok()) return count.status().message();
  std::string out = std::to_string(*count) + (*count == 1 ? " device: " : " devices: ");
  for (int d = 0; d < *count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) return out + "(properties unreadable)";
    char line[320];
    std::snprintf(line, sizeof line, "%s%s (%.1f GiB, sm_%d%d)", d > 0 ? ", " : "", prop.name,
                  static_cast<double>(prop.totalGlobalMem) / (1 << 30), prop.major, prop.minor);
    out += line;
  }
  return out;
}

}  // namespace tandem::cuda
