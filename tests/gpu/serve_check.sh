#!/usr/bin/env bash
# One `tandem serve` colocated on the GPU (device: cuda, SmolLM2-135M-Instruct, the packaged
# GGUF), asked by curl for a greedy answer that must name Paris. Prints the answer and the time
# of the request on its last line; exit 0 = pass. Used by tests/gpu/run.sh.
#   bash tests/gpu/serve_check.sh TANDEM_BINARY LOG_DIR
set -uo pipefail
bin=$1 logs=$2
port=$((20000 + RANDOM % 20000))
"$bin" serve --router.port="$port" --prefill.instances=0 --decode.instances=0 \
  --colocated.instances=1 --colocated.device=cuda >"$logs/serve-cuda.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 1 240); do
  grep -q "tandem: ready at" "$logs/serve-cuda.log" && break
  kill -0 $pid 2>/dev/null || { echo "tandem serve exited:"; tail -n 20 "$logs/serve-cuda.log"; exit 1; }
  sleep 0.25
done
grep -q "tandem: ready at" "$logs/serve-cuda.log" || { echo "not ready in 60 s"; tail -n 20 "$logs/serve-cuda.log"; exit 1; }
started=$EPOCHREALTIME
reply=$(curl -sS --max-time 30 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"smollm2-135m-instruct","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":32,"temperature":0}')
elapsed=$(python3 -c "print(round($EPOCHREALTIME - $started, 3))")
echo "$reply"
answer=$(printf '%s' "$reply" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' 2>/dev/null)
[[ "$answer" == *Paris* ]] || { echo "answer does not name Paris: $answer"; exit 1; }
echo "\"$answer\" in ${elapsed} s"
