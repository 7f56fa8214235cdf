#!/usr/bin/env bash
# Runs every fuzz target for a bounded time on a scratch copy of its seed corpus (the repository
# is not modified) and fails if any finds a crash, a leak, a timeout or a broken property.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET] [TARGET...]
# A failing input is kept in BUILD_DIR/fuzz-artifacts/ and printed (hex) in the log; replay it
# with BUILD_DIR/tests/fuzz/fuzz_TARGET FILE.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR [SECONDS] [TARGET...]}
seconds=${2:-20}
shift $(( $# >= 2 ? 2 : 1 ))
targets=("$@")
if (( ${#targets[@]} == 0 )); then
  targets=(openai_request http_request control_wire kv_wire config_yaml model_config safetensors_header
           gguf_file jinja_template)
fi
artifacts=$build/fuzz-artifacts
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$artifacts"
failed=()
for target in "${targets[@]}"; do
  mkdir -p "$scratch/$target"
  started=$SECONDS
  # New inputs go to the scratch dir (the first); the seeds are read only.
  "$build/tests/fuzz/fuzz_$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/$target-" \
    "$scratch/$target" "tests/fuzz/corpus/$target" >"$scratch/$target.log" 2>&1
  rc=$?
  stats=$(grep -E '^stat::number_of_executed_units' "$scratch/$target.log" | awk '{print $2}')
  echo "== fuzz $target: rc $rc, ${stats:-?} runs in $((SECONDS - started)) s"
  if (( rc != 0 )); then
    failed+=("$target")
    tail -n 60 "$scratch/$target.log"
    for crash in "$artifacts/$target"-*; do
      [[ -f $crash ]] || continue
      echo "-- $crash:"
      od -A d -t x1z -v "$crash" | head -n 40
    done
  fi
done
if (( ${#failed[@]} > 0 )); then
  echo "== fuzz FAILED: ${failed[*]}"
  exit 1
fi
