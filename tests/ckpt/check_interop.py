#!/usr/bin/env python3
"""Interop with the Python safetensors package, driven by test_interop.

  check_interop.py check FILE   load FILE (written by the C writer) with
                                safetensors.numpy.load_file and compare every tensor and
                                metadata entry with the values recomputed here
  check_interop.py make FILE    write FILE with safetensors.numpy.save_file, for the C
                                reader to check

Exits non-zero, naming what differs, on any mismatch."""
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

# Keep in step with fx_specs in fixture.h: name, numpy dtype, shape, seed.
SPECS = [
    ("wte", "float32", (7, 13), 1),
    ("h.0.ln.bias", "float64", (3, 1, 5), 2),
    ("tokens", "int32", (37,), 3),
    ("scale", "float32", (), 4),
    ("empty", "float32", (0, 4), 5),
    ('h.1/qkv "\u00fc"\n', "int32", (2, 3, 2, 1), 6),
    ("bytes", "uint8", (3,), 7),
    ("late.f64", "float64", (4,), 8),
    ("steps", "int64", (1, 5), 9),
]
META = {"step": "1200", "note": 'line\nwith "quotes", a tab\t and \u00fc', "empty": ""}
# Python-written extras the C side also checks (see test_interop.c).
EXTRA = [("half", "float16", (5, 3), 10), ("mask", "bool", (2, 5), 11)]


def values(dtype, shape, seed):
    k = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    if dtype.startswith("float"):
        v = (k % 17 - 8) * 0.375 + seed
    elif dtype.startswith("int"):
        v = k * 7 - 100 + seed
    elif dtype == "uint8":
        v = (k * 13 + seed) & 255
    else:  # bool
        v = (k + seed) % 3 == 0
    return v.astype(dtype).reshape(shape)


def check(path):
    got = load_file(path)
    bad = []
    if set(got) != {s[0] for s in SPECS}:
        bad.append(f"names {sorted(got)} != {sorted(s[0] for s in SPECS)}")
    for name, dtype, shape, seed in SPECS:
        a = got.get(name)
        if a is None:
            continue
        want = values(dtype, shape, seed)
        if a.dtype != want.dtype or a.shape != want.shape:
            bad.append(f"{name!r}: {a.dtype}{a.shape}, want {want.dtype}{want.shape}")
        elif a.tobytes() != want.tobytes():
            bad.append(f"{name!r}: {int((a != want).sum())} elements differ")
    with safe_open(path, "np") as f:
        meta = f.metadata() or {}
    for k, v in META.items():
        if meta.get(k) != v:
            bad.append(f"metadata {k!r} = {meta.get(k)!r}, want {v!r}")
    if not all(k in meta for k in ("starpipe.crc32", "starpipe.header_crc32")):
        bad.append("checksum entries missing from the metadata")
    try:  # torch is optional: check it too when it is there
        import safetensors.torch
        t = safetensors.torch.load_file(path)
        if set(t) != set(got):
            bad.append("safetensors.torch.load_file: different names")
        else:
            print("also loaded with safetensors.torch.load_file")
    except ImportError:
        pass
    for b in bad:
        print("MISMATCH:", b, file=sys.stderr)
    print(f"check_interop: {len(SPECS)} tensors, {len(META)} metadata entries, "
          f"{len(bad)} mismatches")
    return 1 if bad else 0


def make(path):
    save_file({n: values(d, s, seed) for n, d, s, seed in SPECS + EXTRA}, path, metadata=META)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "make"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(check(sys.argv[2]) if sys.argv[1] == "check" else make(sys.argv[2]))
