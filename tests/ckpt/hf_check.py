"""What check_llama_hf.py and check_gpt2_hf.py share: the tokens both sides see, starpipe's
logits of a file (hf_logits), the comparison with transformers' and the failures list.
Imported after torch and numpy (the scripts exit 77 without them)."""
import os
import subprocess

import numpy as np
import torch

failed = []


def tokens_of(c):
    """3 rows of T tokens below V, the same on both sides"""
    k = np.arange(3 * c["T"], dtype=np.int64)
    return ((k * 37 + 11) % c["V"]).astype(np.int32).reshape(3, c["T"])


def starpipe_logits(tool, arch, keys, path, c, d):
    """hf_logits ARCH PATH TOKENS OUT and the config's keys, in order: (3, T, V) floats,
    or None with the failure recorded"""
    tok = tokens_of(c)
    tok.tofile(os.path.join(d, "tokens.bin"))
    out = os.path.join(d, "logits.bin")
    args = [tool, arch, path, os.path.join(d, "tokens.bin"), out] + [str(c[k]) for k in keys]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode:
        failed.append(f"hf_logits on {path}: {r.stderr.strip()}")
        return None
    return np.fromfile(out, dtype=np.float32).reshape(3, c["T"], c["V"])


def hf_logits(model, c):
    with torch.no_grad():
        return model(torch.tensor(tokens_of(c), dtype=torch.long)).logits.float().numpy()


def compare(what, mine, model, c, tol):
    """mine within tol of transformers' largest logit (at least 1), and not a weak check"""
    if mine is None:
        return
    ref = hf_logits(model, c)
    err = float(np.max(np.abs(mine - ref)))
    scale = float(np.max(np.abs(ref)))
    print(f"{what}: logits within {err:.2e} of transformers' (largest |logit| {scale:.3g})")
    if not err <= tol * max(scale, 1.0):
        failed.append(f"{what}: logits differ from transformers' by {err:.3g}")
    if float(np.std(ref)) < 1e-3:
        failed.append(f"{what}: logits nearly constant ({np.std(ref):.2g}): too weak a check")


def finish():
    for f in failed:
        print("FAIL:", f)
    return 1 if failed else 0
