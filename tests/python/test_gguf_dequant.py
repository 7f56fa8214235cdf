"""GGUF dequantization against the reference: the Python `gguf` package (gguf.quants.dequantize).

For every tensor type Tandem loads (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) a GGUF file
is written with the package's GGUFWriter: types the package can quantize get quantized random
matrices, and every quantized type also gets random blocks (random bits, with the fp16 scale
fields set to random finite values so that every bit pattern of the quants occurs); F16 and BF16
get random bit patterns (infinities, NaNs and subnormals included). `tandem gguf FILE --tensor NAME
--out F` writes Tandem's fp32 values; they must equal the package's bit for bit (NaN where NaN).
`tandem gguf FILE` must list every tensor with its type and shape.

Run: TANDEM_BINARY=build/tandem .venv/bin/python tests/python/test_gguf_dequant.py
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

from cluster_util import FAILURES, report

try:
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize
except ImportError:
    print("skip: the gguf package is not installed (bash deploy/install-deps.sh)")
    sys.exit(77)

BINARY = os.environ.get("TANDEM_BINARY", "build/tandem")


# Byte offsets of the fp16 scale fields in each block (d, m, dmin).
SCALE_FIELDS = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2],
                Q.Q6_K: [208]}


def random_blocks(rng, qtype, rows, cols):
    """Random raw blocks of `qtype` for a [rows, cols] matrix, fp16 scales finite."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        scales = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-4, 2, n_blocks))
        raw[:, off:off + 2] = scales.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, cols // block * size)


def cases(rng):
    """(name, qtype, raw numpy array as GGUFWriter takes it)."""
    out = []
    data = (rng.standard_normal((24, 512)) * rng.uniform(0.01, 3, (24, 1))).astype(np.float32)
    out.append(("f32", Q.F32, data))
    out.append(("f16_values", Q.F16, data.astype(np.float16)))
    out.append(("f16_bits", Q.F16, rng.integers(0, 1 << 16, (16, 256), dtype=np.uint16)
                .view(np.float16)))
    out.append(("bf16_values", Q.BF16, quantize(data, Q.BF16)))
    out.append(("bf16_bits", Q.BF16, rng.integers(0, 256, (16, 512), dtype=np.uint8)))
    for qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1):
        name = qtype.name.lower()
        out.append((name + "_quantized", qtype, quantize(data, qtype)))
        out.append((name + "_blocks", qtype, random_blocks(rng, qtype, 16, 512)))
    for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        out.append((qtype.name.lower() + "_blocks", qtype, random_blocks(rng, qtype, 32, 512)))
    return out


def tandem_values(path, name, tmp):
    out = os.path.join(tmp, name + ".f32")
    proc = subprocess.run([BINARY, "gguf", path, "--tensor", name, "--out", out],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr.strip()
    return np.fromfile(out, dtype=np.float32), ""


def main():
    rng = np.random.default_rng(19)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "types.gguf")
        writer = gguf.GGUFWriter(path, "llama")
        all_cases = cases(rng)
        for name, qtype, raw in all_cases:
            if qtype in (Q.F32, Q.F16):
                writer.add_tensor(name, raw)
            else:
                writer.add_tensor(name, raw, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

        reader = gguf.GGUFReader(path)
        listing = subprocess.run([BINARY, "gguf", path], capture_output=True, text=True)
        report(listing.returncode == 0, f"tandem gguf lists the file {listing.stderr.strip()}")
        lines = listing.stdout.splitlines()
        for t in reader.tensors:
            shape = "[" + ", ".join(str(int(d)) for d in reversed(t.shape.tolist())) + "]"
            listed = any(l.split()[:2] == [t.name, t.tensor_type.name] and
                         shape.replace(" ", "") in l.replace(" ", "") for l in lines)
            report(listed, f"listing shows {t.name} {t.tensor_type.name} {shape}")

            ref = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
            ours, error = tandem_values(path, t.name, tmp)
            if ours is None:
                report(False, f"{t.name} ({t.tensor_type.name}): tandem failed: {error}")
                continue
            same_shape = ours.shape == ref.shape
            nan_same = same_shape and np.array_equal(np.isnan(ours), np.isnan(ref))
            finite = ~np.isnan(ref) if same_shape else None
            exact = nan_same and np.array_equal(ours[finite], ref[finite])
            diff = float(np.max(np.abs(ours[finite] - ref[finite]), initial=0.0)) \
                if nan_same else float("inf")
            report(exact, f"{t.name} ({t.tensor_type.name}, {ref.size} values, "
                         f"{int(np.isnan(ref).sum())} NaN): bit-exact, max |diff| {diff:.3g}")

        # A type Tandem does not dequantize is refused by name.
        q5 = os.path.join(tmp, "q5.gguf")
        writer = gguf.GGUFWriter(q5, "llama")
        writer.add_tensor("w", quantize(np.ones((2, 64), np.float32), Q.Q5_0), raw_dtype=Q.Q5_0)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        ours, error = tandem_values(q5, "w", tmp)
        report(ours is None and "has type Q5_0, which Tandem cannot dequantize" in error,
              f"Q5_0 is refused naming the type: {error}")

    if FAILURES:
        print(f"{len(FAILURES)} report(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
