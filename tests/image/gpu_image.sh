#!/usr/bin/env bash
# CTest image/gpu (opt-in: TANDEM_IMAGE_GPU=1 ctest --test-dir build -R image/gpu): builds the GPU
# image with deploy/image/build.sh --variant gpu (the CUDA toolkit bind-mounted from
# /usr/local/cuda; it compiles the whole binary with nvcc on, about 7 minutes on 2 cores, so CI
# does not run it), exports it to BUILD/image/rootfs-gpu and checks there, with chroot (no GPU
# needed): no compiler or toolkit in the runtime filesystem; every CUDA library the build
# stage's ldd listed (libs.txt) is in /opt/tandem/cuda/lib and in the linker cache; every library
# of the binary resolves; `tandem --version` runs as uid 10001; the binary is a CUDA build
# (check-config accepts transfer.backend nccl, which a CPU build refuses). Removes the export
# and the podman storage at the end. Exit 77 = skipped.
set -euo pipefail
build_dir="$1"
source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ "${TANDEM_IMAGE_GPU:-}" != 1 ]]; then
  echo "skipped: opt-in (TANDEM_IMAGE_GPU=1 ctest -R image/gpu; ~7 min of nvcc build)"; exit 77
fi
if [[ $EUID -ne 0 ]]; then echo "skipped: needs root"; exit 77; fi
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [[ ! -x "$cuda_home/bin/nvcc" ]]; then echo "skipped: no CUDA toolkit at $cuda_home"; exit 77; fi
for tool in mmdebstrap podman chroot; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool missing (bash deploy/install-deps.sh)"; exit 77; }
done
work="$build_dir/image"
rootfs="$work/rootfs-gpu"
trap 'rm -rf "$rootfs"' EXIT
started=$SECONDS
bash "$source_dir/deploy/image/build.sh" --variant gpu --work "$work" --export "$rootfs" \
  --inspect "$work/image-gpu.json" --clean-storage

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
for tool in gcc cc c++ g++ cmake ninja make ld nvcc; do
  for d in usr/bin usr/local/bin usr/sbin; do
    [[ -e "$rootfs/$d/$tool" || -L "$rootfs/$d/$tool" ]] && fail "build tool in the runtime image: /$d/$tool"
  done
done
# (podman build -v mounts the toolkit for every RUN of both stages, which leaves an empty mount
# point /usr/local/cuda behind in the runtime image: empty is fine, content is not.)
[[ -n "$(ls -A "$rootfs/usr/local/cuda" 2>/dev/null)" ]] && fail "the CUDA toolkit is in the runtime image"
grep -q '^/opt/tandem/cuda/lib$' "$rootfs/etc/ld.so.conf.d/tandem-cuda.conf" ||
  fail "/etc/ld.so.conf.d/tandem-cuda.conf does not name /opt/tandem/cuda/lib"
echo "CUDA libraries the binary links (build stage's ldd):"
cat "$rootfs/opt/tandem/cuda/libs.txt"
[[ -s "$rootfs/opt/tandem/cuda/libs.txt" ]] ||
  echo "NOTE: none: nothing in tandem references the CUDA backend yet, so the linker drops them"
cache="$(chroot "$rootfs" ldconfig -p)"
while read -r soname _; do
  [[ -f "$rootfs/opt/tandem/cuda/lib/$soname" ]] || fail "$soname not in /opt/tandem/cuda/lib"
  grep -q "$soname .*=> /opt/tandem/cuda/lib/$soname" <<<"$cache" || fail "$soname not in the linker cache"
done < "$rootfs/opt/tandem/cuda/libs.txt"
ldd_out="$(chroot "$rootfs" ldd /usr/local/bin/tandem)"
grep -q "not found" <<<"$ldd_out" && fail "unresolved libraries: $ldd_out"
version="$(chroot --userspec=10001:10001 "$rootfs" /usr/local/bin/tandem --version 2>/dev/null)" ||
  fail "tandem --version as 10001 failed"
grep -q '^tandem ' <<<"$version" || fail "tandem --version printed: $version"
# A CPU build refuses transfer.backend nccl ("needs a build with CUDA"); this one must accept it.
printf 'transfer:\n  backend: nccl\n' > "$rootfs/tmp/nccl.yaml"
chroot --userspec=10001:10001 "$rootfs" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp TMPDIR=/tmp \
  TANDEM_CACHE_DIR=/tmp/tandem-cache /usr/local/bin/tandem check-config /tmp/nccl.yaml \
  >/dev/null 2>"$work/gpu-check-config.err" || fail "not a CUDA build: $(cat "$work/gpu-check-config.err")"
rm -f "$rootfs/tmp/nccl.yaml" "$work/gpu-check-config.err"
echo "== image/gpu: $((SECONDS - started)) s, $failures failure(s)"
((failures == 0))
