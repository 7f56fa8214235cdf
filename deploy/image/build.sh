#!/usr/bin/env bash
# Builds the Tandem container image without a registry or a container runtime:
#   1. a Debian 12 (bookworm) base root filesystem made with mmdebstrap from deb.debian.org (the
#      sources this machine uses), cached as a tarball while its inputs are unchanged;
#   2. `podman import` of that tarball as localhost/tandem-base:bookworm;
#   3. `podman --storage-driver vfs build --isolation chroot` of deploy/image/Containerfile (or
#      Containerfile.gpu) with the repository as context;
#   4. optionally (--export DIR) the image's filesystem unpacked into DIR, to run it with chroot
#      (containers cannot be run through crun here).
# Run as root on Debian 12 (deploy/install-deps.sh installs mmdebstrap and podman).
#
#   bash deploy/image/build.sh [--variant cpu|gpu] [--work DIR] [--export DIR] [--tag TAG]
#                              [--inspect FILE] [--clean-storage]
#
# --work DIR     where the base tarball, its stamp and podman's storage live (default
#                build/image); the base is reused across runs, the storage too unless
#                --clean-storage removes it after the build (and export).
# --inspect FILE writes the image's config (`podman image inspect`: user, entrypoint, env,
#                volumes, labels) to FILE, for tests that run the exported filesystem as podman would.
# --variant gpu  builds Containerfile.gpu with the CUDA toolkit bind-mounted read-only from
#                $CUDA_HOME (default /usr/local/cuda) into the build stage.
# Prints one line per phase with its duration, and the image size.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

variant=cpu
work="$repo_root/build/image"
export_dir=""
tag=""
inspect_file=""
clean_storage=0
while (($#)); do
  case "$1" in
    --variant) variant="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --export) export_dir="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --inspect) inspect_file="$2"; shift 2 ;;
    --clean-storage) clean_storage=1; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$variant" in
  cpu) containerfile="$repo_root/deploy/image/Containerfile" ;;
  gpu) containerfile="$repo_root/deploy/image/Containerfile.gpu" ;;
  *) echo "build.sh: --variant must be cpu or gpu" >&2; exit 2 ;;
esac
tag="${tag:-localhost/tandem:$variant}"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [[ "$variant" == gpu && ! -x "$cuda_home/bin/nvcc" ]]; then
  echo "build.sh: --variant gpu needs the CUDA toolkit at $cuda_home (set CUDA_HOME)" >&2
  exit 1
fi
for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool missing (bash deploy/install-deps.sh)" >&2; exit 1; }
done

mkdir -p "$work"
work="$(cd "$work" && pwd)"
store="$work/storage"
# podman with its own storage (vfs: no overlay or fuse needed), no systemd, no journald; its
# temporary files (layer blobs during build/commit) next to the storage rather than in /var/tmp.
export TMPDIR="$store/tmp"
pod() {
  podman --root "$store/root" --runroot "$store/run" --storage-driver vfs \
    --cgroup-manager cgroupfs --events-backend file "$@"
}
phase_start=$SECONDS
phase() {  # phase NAME: prints how long the previous phase took
  echo "== image: $1 ($((SECONDS - phase_start)) s)"
  phase_start=$SECONDS
}
cleanup() {
  if ((clean_storage)); then
    # vfs layers belong to root and may be read-only directories: podman removes them best.
    pod rm -a -f >/dev/null 2>&1 || true
    pod rmi -a -f >/dev/null 2>&1 || true
    rm -rf "$store"
  fi
}
# A storage left by a run that was killed (a test timeout) would hold its layers: start clean.
cleanup
mkdir -p "$store/root" "$store/run" "$store/tmp"
trap cleanup EXIT

# ---- 1. the base root filesystem ---------------------------------------------------------------
# The same suites and mirrors as the host's /etc/apt/sources.list.d/debian.sources.
suite=bookworm
mirrors=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
mmdebstrap_args=(--variant=minbase --format=tar --aptopt='Acquire::Retries "3"' "$suite")
base_tar="$work/base/tandem-base-$suite.tar"
# The stamp holds the inputs (arguments and mirrors) and the week: the base is remade when
# either changes, so that it picks up security updates at least weekly.
want_stamp="$(printf '%s\n' "${mmdebstrap_args[@]}" "${mirrors[@]}" "$(date -u +%G-W%V)" | sha256sum | cut -d' ' -f1)"
mkdir -p "$work/base"
if [[ -f "$base_tar" && "$(cat "$base_tar.stamp" 2>/dev/null)" == "$want_stamp" ]]; then
  phase "base $base_tar reused (inputs unchanged)"
else
  rm -f "$base_tar" "$base_tar.stamp"
  mmdebstrap --quiet "${mmdebstrap_args[@]}" "$base_tar.partial" "${mirrors[@]}"
  mv "$base_tar.partial" "$base_tar"
  echo "$want_stamp" > "$base_tar.stamp"
  phase "base made with mmdebstrap: $base_tar ($(du -h "$base_tar" | cut -f1))"
fi

# ---- 2. import it ------------------------------------------------------------------------------
base_image=localhost/tandem-base:$suite
base_sum="$(sha256sum "$base_tar" | cut -d' ' -f1)"
if [[ "$(pod image inspect --format '{{index .Labels "tandem.base.sha256"}}' "$base_image" 2>/dev/null)" == "$base_sum" ]]; then
  phase "base image $base_image already imported"
else
  pod import --quiet --change "LABEL tandem.base.sha256=$base_sum" \
    --change 'CMD ["/bin/bash"]' "$base_tar" "$base_image" >/dev/null
  phase "base imported as $base_image"
fi

# ---- 3. build ----------------------------------------------------------------------------------
build_args=(--build-arg "BASE=$base_image"
            --build-arg "REVISION=$(git -C "$repo_root" rev-parse HEAD 2>/dev/null || echo unknown)")
volumes=()
if [[ "$variant" == gpu ]]; then
  # The toolkit is not in Debian's registry: the build stage sees the host's, read-only.
  volumes=(-v "$cuda_home:/usr/local/cuda:ro")
fi
# With vfs every committed layer is a full copy of the filesystem, and podman commits one per
# instruction: cache layers (for the next run) only when the storage is kept.
layers=true
((clean_storage)) && layers=false
pod build --isolation chroot --network host --layers="$layers" \
  "${build_args[@]}" "${volumes[@]}" \
  -f "$containerfile" -t "$tag" "$repo_root"
size_bytes="$(pod image inspect --format '{{.Size}}' "$tag")"
phase "built $tag ($((size_bytes / 1048576)) MiB)"
if [[ -n "$inspect_file" ]]; then
  pod image inspect "$tag" > "$inspect_file"
fi

# ---- 4. export its filesystem ------------------------------------------------------------------
if [[ -n "$export_dir" ]]; then
  rm -rf "$export_dir"
  mkdir -p "$export_dir"
  container="$(pod create "$tag")"
  pod export "$container" | tar -x --numeric-owner -C "$export_dir"
  pod rm -f "$container" >/dev/null
  phase "exported to $export_dir ($(du -sh "$export_dir" | cut -f1))"
fi
# Intermediate images (the build stage) take most of the storage; keep them only for reuse.
echo "== image: $tag ready; storage $store ($(du -sh "$store" 2>/dev/null | cut -f1))"
