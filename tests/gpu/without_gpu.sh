#!/usr/bin/env bash
# What a CUDA-on build must do on a machine without a GPU (CI, tests/run.sh): say so everywhere,
# clearly, and lose nothing.
#   bash tests/gpu/without_gpu.sh BUILD_DIR    (a build with -DTANDEM_CUDA=ON -DTANDEM_BUILD_TESTS=ON)
# - `tandem --version` says the CUDA backend is compiled in and why no device is usable;
# - every GPU check exits 2 (skipped) and says why;
# - check-config accepts colocated instances on cuda, and prefill/decode on cuda with
#   transfer.backend cuda_ipc or nccl (the Kubernetes GPU overlay's config among them); it
#   refuses them on cuda with ucx, naming file, line and field;
# - `tandem serve` with instances on cuda (colocated; prefill + decode over cuda_ipc or nccl; an
#   instance given its GPU by S.cuda_devices) stops at start-up naming the missing device.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

version=$("$build/tandem" --version)
echo "$version"
grep -q '^CUDA backend: compiled in' <<<"$version" || fail "--version does not say the CUDA backend is compiled in"
grep -q 'no usable CUDA device' <<<"$version" || fail "--version does not say that no CUDA device is usable"

for check in cuda_kernels_check cuda_forward_check nccl_transfer_check; do
  out=$(timeout 60 "$build/tests/gpu/$check" 2>&1)
  rc=$?
  echo "$check: exit $rc: $out"
  ((rc == 2)) || fail "$check exited $rc without a GPU, want 2 (skipped)"
  grep -qiE 'no usable (CUDA device|GPU)' <<<"$out" || fail "$check does not say why it skipped"
done

printf 'prefill: {instances: 0}\ndecode: {instances: 0}\ncolocated:\n  instances: 1\n  device: cuda\n' >"$work/colocated.yaml"
"$build/tandem" check-config "$work/colocated.yaml" >/dev/null || fail "check-config refused colocated on cuda"
printf 'decode:\n  device: cuda\n' >"$work/decode.yaml"
out=$("$build/tandem" check-config "$work/decode.yaml" 2>&1)
echo "check-config decode on cuda: $out"
grep -q "decode.yaml:2:11: decode.device: cuda on decode instances keeps the KV in GPU memory, and the UCX at hand moves host memory only over transfer.ucx_tls 'tcp,sm,self'" <<<"$out" ||
  fail "check-config did not refuse decode.device cuda with file, line and field"

printf 'transfer: {backend: cuda_ipc}\nprefill: {device: cuda}\ndecode: {device: cuda}\n' >"$work/ipc.yaml"
"$build/tandem" check-config "$work/ipc.yaml" >/dev/null || fail "check-config refused prefill + decode on cuda over cuda_ipc"
printf 'transfer: {backend: nccl}\nprefill: {device: cuda}\ndecode: {device: cuda}\n' >"$work/nccl.yaml"
"$build/tandem" check-config "$work/nccl.yaml" >/dev/null || fail "check-config refused prefill + decode on cuda over nccl"
# The Kubernetes GPU overlay's cluster.yaml, as its ConfigMap carries it.
if command -v kubectl >/dev/null && [[ -x .venv/bin/python ]]; then
  .venv/bin/python - "$work/k8s-gpu.yaml" <<'PY' || fail "cannot render deploy/kubernetes/overlays/gpu"
import sys
sys.path.insert(0, "tests/python")
import k8s_util
_, docs = k8s_util.render("gpu")
config = next(d["data"]["cluster.yaml"] for d in k8s_util.of_kind(docs, "ConfigMap")
              if "cluster.yaml" in d.get("data", {}))
open(sys.argv[1], "w").write(config)
PY
  out=$(TANDEM_CLUSTER_SECRET=$(printf 'x%.0s' {1..32}) "$build/tandem" check-config "$work/k8s-gpu.yaml" 2>&1 >/dev/null)
  (($? == 0)) && echo "check-config: the Kubernetes gpu overlay's cluster.yaml is accepted" ||
    fail "check-config refused the Kubernetes gpu overlay's cluster.yaml: $out"
else
  echo "check-config of the Kubernetes gpu overlay: skipped (no kubectl or .venv)"
fi

serve_without_gpu() {  # NAME ROLE FLAGS...
  local name=$1 role=$2
  shift 2
  out=$(cd "$work" && timeout 120 "$OLDPWD/$build/tandem" serve --router.port=0 "$@" 2>&1)
  rc=$?
  echo "$name: $(echo "$out" | grep -E 'cannot start' | head -n 1)"
  ((rc != 0)) || fail "tandem serve ($name) without a GPU exited 0"
  grep -q "$role .*cannot start: Unavailable: no usable CUDA device" <<<"$out" ||
    fail "tandem serve ($name) did not name the missing CUDA device"
}
serve_without_gpu "colocated on cuda" colocated-0 --prefill.instances=0 --decode.instances=0 \
  --colocated.instances=1 --colocated.device=cuda
serve_without_gpu "prefill + decode over cuda_ipc" "\(prefill\|decode\)-0" \
  --transfer.backend=cuda_ipc --prefill.device=cuda --decode.device=cuda
serve_without_gpu "prefill + decode over nccl" "\(prefill\|decode\)-0" \
  --transfer.backend=nccl --prefill.device=cuda --decode.device=cuda \
  '--prefill.cuda_devices=[0]' '--decode.cuda_devices=[1]'
# NCCL puts no two ranks of a link on one GPU: tandem serve refuses to start them on one.
out=$(cd "$work" && timeout 60 "$OLDPWD/$build/tandem" serve --router.port=0 --transfer.backend=nccl \
  --prefill.device=cuda --decode.device=cuda 2>&1)
echo "nccl on one GPU: $(grep -m1 'transfer.backend' <<<"$out")"
grep -q 'transfer.backend: nccl needs prefill and decode on different GPUs' <<<"$out" ||
  fail "tandem serve started prefill and decode on one GPU over nccl"
# S.cuda_devices: the instance runs under its own CUDA_VISIBLE_DEVICES, and says which.
serve_without_gpu "colocated on cuda_devices [3]" colocated-0 --prefill.instances=0 \
  --decode.instances=0 --colocated.instances=1 --colocated.device=cuda '--colocated.cuda_devices=[3]'
grep -q 'colocated-0 .*no usable CUDA device (CUDA_VISIBLE_DEVICES=3)' <<<"$out" ||
  fail "colocated.cuda_devices [3] did not reach the instance's CUDA_VISIBLE_DEVICES"

((failed == 0)) && echo "without_gpu: ok"
exit $failed
