#!/usr/bin/env bash
# CTest fixture `tandem_image` (test image/build): builds the CPU image with
# deploy/image/build.sh on a scratch podman storage, exports its filesystem to BUILD/image/rootfs
# and writes that path to BUILD/image/rootfs.path (the image config, as `podman image inspect`
# prints it, to BUILD/image/image-cpu.json) for the tests that run it (python/test_image, and
# any test with FIXTURES_REQUIRED tandem_image). The podman storage is removed after the export;
# the base tarball stays (build/image/base) and is reused while its inputs are unchanged.
# Exit 77 = skipped (not root, or mmdebstrap/podman missing).
set -euo pipefail
build_dir="$1"
source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$build_dir/image"
rm -f "$work/rootfs.path"
if [[ $EUID -ne 0 ]]; then echo "skipped: building and running the image needs root"; exit 77; fi
for tool in mmdebstrap podman chroot unshare ip; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool missing (bash deploy/install-deps.sh)"; exit 77; }
done
started=$SECONDS
bash "$source_dir/deploy/image/build.sh" --variant cpu --work "$work" --export "$work/rootfs" \
  --inspect "$work/image-cpu.json" --clean-storage
echo "$work/rootfs" > "$work/rootfs.path"
echo "== image/build: $((SECONDS - started)) s"
