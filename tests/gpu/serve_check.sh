#!/usr/bin/env bash
# One `tandem serve` colocated on the GPU (device: cuda, SmolLM2-135M-Instruct, the packaged
# GGUF), asked over HTTP for a greedy answer that must name Paris. Prints the answer and the time
# of the request on its last line; on a failure, the reason on its last line. Exit 0 = pass.
# Used by tests/gpu/run.sh. The request is made with python3's urllib (a GPU node may lack curl).
#   bash tests/gpu/serve_check.sh TANDEM_BINARY LOG_DIR
set -uo pipefail
bin=$1 logs=$2
port=$((20000 + RANDOM % 20000))
"$bin" serve --router.port="$port" --prefill.instances=0 --decode.instances=0 \
  --colocated.instances=1 --colocated.device=cuda >"$logs/serve-cuda.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
fail() { tail -n 20 "$logs/serve-cuda.log"; echo "$1"; exit 1; }
for _ in $(seq 1 240); do
  grep -q "tandem: ready at" "$logs/serve-cuda.log" && break
  kill -0 $pid 2>/dev/null ||
    fail "tandem serve exited before ready: $(grep -m1 -E ' (ERROR|FATAL) ' "$logs/serve-cuda.log")"
  sleep 0.25
done
grep -q "tandem: ready at" "$logs/serve-cuda.log" || fail "not ready in 60 s"
reply=$(python3 - "$port" <<'PY'
import json, sys, time, urllib.request
body = {"model": "smollm2-135m-instruct", "max_tokens": 32, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]}
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy for loopback
started = time.time()
try:
    reply = json.load(opener.open(request, timeout=30))
    print(json.dumps(reply))
    print(f'"{reply["choices"][0]["message"]["content"]}" in {time.time() - started:.3f} s')
except Exception as e:  # noqa: BLE001 - reported as the last line
    print(f"the request failed: {type(e).__name__}: {e}")
PY
)
echo "$reply"
last=$(tail -n 1 <<<"$reply")
[[ "$last" == \"*Paris*\"\ in\ * ]] || { echo "no answer naming Paris: $last"; exit 1; }
