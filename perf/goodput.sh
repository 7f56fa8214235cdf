#!/usr/bin/env bash
# The measurements perf/README.md reports: profile the medium model, sweep the
# disaggregated and colocated layouts of the same 2 cores on two workloads (measured and
# simulated on the same requests), and plan a 16-GPU H100 cluster for OPT-13B.
#
#   bash perf/goodput.sh [profile|sweep|plan|all]    (default all; ~110 minutes on 2 cores:
#   profile 4, sweep ~95 at 80 requests per rate, plan ~10)
#
# Needs an idle machine: the sweep's timings are wall-clock. Results go to perf/results/
# (git-ignored); perf/README.md quotes them.
set -euo pipefail
cd "$(dirname "$0")/.."
TANDEM=${TANDEM:-./build/tandem}
OUT=perf/results
LM=$OUT/lm-cpu-wall.yaml  # what `profile` writes
# The model the sweep's routers place with and its simulation replays with: the committed
# profile of this machine (perf/latency/cpu-medium.yaml, made by `profile`).
SWEEP_LM=${SWEEP_LM:-perf/latency/cpu-medium.yaml}
mkdir -p "$OUT"
step=${1:-all}

if [[ $step == profile || $step == all ]]; then
  # threads 1 beside a neighbour running the other phase (prefill measured while the other core
  # decodes, decode while it prefills: a 1-prefill-core + 1-decode-core cluster), threads 2
  # alone, and threads 1 for colocated instances (below). Transfer: ~5 GB/s over UCX shared memory (perf/README.md, KV transfer) plus ~2 ms of
  # control messages (KvReady, pull, release) per request.
  "$TANDEM" profile --model-preset medium --threads 1 --background-threads 1 \
    --background-kind other \
    --transfer-bytes-per-s 5e9 --transfer-latency-s 0.002 --out "$LM" | tee "$OUT/profile-t1.txt"
  "$TANDEM" profile --model-preset medium --threads 2 \
    --transfer-bytes-per-s 5e9 --transfer-latency-s 0.002 --append --out "$LM" |
    tee "$OUT/profile-t2.txt"
  # threads 1 as a colocated instance of coloc-2x1 sees it: its neighbour is the other colocated
  # instance, which spends most of its time decoding (two cores decoding share the DRAM
  # bandwidth each step streams the weights with).
  "$TANDEM" profile --model-preset medium --threads 1 --background-threads 1 \
    --background-kind decode --role colocated --append --out "$LM" |
    tee "$OUT/profile-t1-colocated.txt"
fi

if [[ $step == sweep || $step == all ]]; then
  clusters=(--cluster coloc-2x1=perf/configs/coloc-2x1.yaml
            --cluster coloc-1x2=perf/configs/coloc-1x2.yaml
            --cluster disagg-1p1d=perf/configs/disagg-1p1d.yaml)
  # --probe-down 1: a layout that misses at the lowest rate is tried at half of it, so that its
  # goodput is bounded more tightly than "below the sweep". (Each halving doubles the run's
  # length: 80 summarization requests at 0.075 req/s take ~18 minutes.)
  # Workload lengths at a 1024-token scale (cluster/workload.h): summarization prompts ~410
  # tokens (~1.2 s of prefill on one core), chatbot ~100 in / ~60 out.
  "$TANDEM" bench sweep "${clusters[@]}" --workload summarization --max-model-len 1024 \
    --slo-ttft 8 --slo-tpot 0.05 --rates 0.15,0.2,0.3,0.4,0.5,0.6,0.8 --num-requests 80 --probe-down 1 \
    --latency-model "$SWEEP_LM" --out-dir "$OUT/sweep-summarization"
  "$TANDEM" bench sweep "${clusters[@]}" --workload chatbot --max-model-len 1024 \
    --slo-ttft 2 --slo-tpot 0.06 --rates 0.4,0.5,0.6,0.8,1,1.2,1.6 --num-requests 80 --probe-down 1 \
    --latency-model "$SWEEP_LM" --out-dir "$OUT/sweep-chatbot"
  # To replay these runs with another latency model:
  #   python3 perf/resimulate.py "$OUT/sweep-W" OTHER.yaml --tandem "$TANDEM"
fi

if [[ $step == plan || $step == all ]]; then
  # OPT-13B on 16 GPUs. chatbot: DistServe's SLOs (TTFT 0.25 s, TPOT 0.1 s) on the H100 and
  # A100 models, both affinities; then tighter SLOs on the H100 (the A100 SLOs scaled by the
  # H100's speed-up, and a tight TPOT). chatbot-history: ShareGPT as DistServe prepared it
  # (conversation histories as prompts, cluster/workload.h) at the same SLOs, and at 0.2 s /
  # 0.1 s (its artifact's scripts). Each plan compares with the colocated baseline under both
  # colocated.scheduling policies (chunked, prefill_first).
  mkdir -p "$OUT/plan"
  for spec in "chatbot h100 0.25 0.1 high" "chatbot h100 0.25 0.1 low" \
              "chatbot a100 0.25 0.1 high" "chatbot a100 0.25 0.1 low" \
              "chatbot h100 0.08 0.06 high" "chatbot h100 0.25 0.05 high" \
              "chatbot h100 0.25 0.03 high" \
              "chatbot-history a100 0.25 0.1 high" "chatbot-history a100 0.2 0.1 high" \
              "chatbot-history h100 0.25 0.1 high"; do
    set -- $spec
    name="$OUT/plan/$1-$2-ttft$3-tpot$4-$5"
    "$TANDEM" plan --latency-model "cluster/gpu/$2-opt13b.yaml" --workload "$1" \
      --slo-ttft "$3" --slo-tpot "$4" --gpus 16 --affinity "$5" --max-model-len 2048 \
      --gpu-memory-gb 80 --weights-gb 26 --out "$name.yaml" | tee "$name.txt"
  done
  # DistServe's own OPT-13B pair of layouts (its prefill tp2 + decode tp1 against vLLM at tp1)
  # on the A100 model, for telling a planner result apart from a latency-model one.
  python3 perf/distserve_layout.py --tandem "$TANDEM" --out "$OUT/plan/distserve_layout.json"
fi
