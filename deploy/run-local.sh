#!/usr/bin/env bash
# The README's first command: installs dependencies, builds Tandem, and starts the main job.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j2 --target tandem
# The local cluster (`tandem serve`) arrives with the servers (issue #5); until then, the CLI.
exec ./build/tandem --help
