#!/usr/bin/env python3
"""starpipe-gpt's checkpoints against Hugging Face transformers' GPT2LMHeadModel, driven by
ctest (ckpt.gpt2_hf; exit 77, skipped, when torch or transformers is not importable).

  check_gpt2_hf.py STARPIPE_GPT HF_LOGITS

For two configs:
  1. starpipe -> transformers: a checkpoint written by `starpipe-gpt --reference` after 3
     steps loads into GPT2LMHeadModel with load_state_dict(strict=True) (its AdamW moments
     and, where a transformers version keeps them in the state dict, the causal-mask
     buffers set aside), and transformers' logits on 3 x T tokens equal starpipe's
     (hf_logits: the reference interpreter on that file) within 1e-5 of the largest; the
     same file with c_attn's weight read in the other layout ((out, in) where Conv1D's is
     (in, out)) must give other logits, or the comparison could not see a layout error;
  2. transformers -> starpipe: a randomly initialised GPT2LMHeadModel saved with
     save_pretrained, in float32, bfloat16 and float16, gives starpipe the logits
     transformers computes from those weights; `starpipe-gpt --init` trains from it.
Exits non-zero, naming what differs, on any mismatch."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from safetensors import safe_open
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_check import failed, finish, hf_logits  # noqa: E402
from hf_check import compare as compare_tol, starpipe_logits as logits_of  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)
CONFIGS = [dict(V=256, T=16, L=2, H=4, C=32), dict(V=300, T=12, L=3, H=2, C=16)]
TOL = 1e-5


def compare(what, mine, model, c):
    compare_tol(what, mine, model, c, TOL)


def hf_model(c, init_std=0.02):
    cfg = GPT2Config(vocab_size=c["V"], n_positions=c["T"], n_embd=c["C"], n_layer=c["L"],
                     n_head=c["H"], layer_norm_epsilon=1e-5, activation_function="gelu_new",
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                     initializer_range=init_std)
    cfg._attn_implementation = "eager"
    return GPT2LMHeadModel(cfg).float().eval()


def starpipe_logits(tool, path, c, d):
    return logits_of(tool, "gpt", ("V", "T", "L", "H", "C"), path, c, d)


def strict_load(model, sd, tag):
    """load_state_dict(strict=True), the causal-mask buffers (where a transformers version
    keeps them) taken from the model itself: they are not weights."""
    own = model.state_dict()
    for k, v in own.items():
        if k.endswith((".attn.bias", ".attn.masked_bias")) and k not in sd:
            sd[k] = v
    try:
        model.load_state_dict(sd, strict=True)
        return True
    except RuntimeError as e:
        failed.append(f"{tag}: transformers refuses starpipe's checkpoint: {e}")
        return False


def main():
    app, tool = sys.argv[1], sys.argv[2]
    for n, c in enumerate(CONFIGS):
        with tempfile.TemporaryDirectory() as d:
            tag = f"config {n} (V {c['V']}, L {c['L']}, H {c['H']}, C {c['C']})"
            flags = ["--vocab", str(c["V"]), "--layers", str(c["L"]), "--heads", str(c["H"]),
                     "--channels", str(c["C"]), "--context", str(c["T"]), "--batch", "2",
                     "--microbatches", "2"]
            # 1. starpipe -> transformers
            ck = os.path.join(d, "sp.safetensors")
            data = ["--data", os.path.join(d, "bytes.bin")] if c["V"] != 256 else []
            if data:  # byte shards: tokens below 256 in a vocabulary of V
                subprocess.run([os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                                             "make-shards"), "/usr/share/common-licenses/GPL-3",
                                os.path.join(d, "bytes")], check=True, capture_output=True)
                data = ["--data", os.path.join(d, "bytes_000000.bin")]
            r = subprocess.run([app, "--reference", "--steps", "3", "--lr", "3e-3", "--save", ck]
                               + flags + data, capture_output=True, text=True)
            if r.returncode:
                failed.append(f"{tag}: starpipe-gpt failed: {r.stderr.strip()}")
                continue
            with safe_open(ck, "pt") as f:
                sd = {k: f.get_tensor(k) for k in f.keys() if not k.endswith((".adam_m", ".adam_v"))}
            model = hf_model(c)
            if not strict_load(model, dict(sd), tag):
                continue
            mine = starpipe_logits(tool, ck, c, d)
            compare(f"{tag}, starpipe's checkpoint", mine, model, c)
            # the negative control: c_attn read as (out, in)
            wrong = dict(sd)
            for k in wrong:
                if k.endswith("attn.c_attn.weight"):
                    w = wrong[k]
                    wrong[k] = w.reshape(w.shape[1], w.shape[0]).t().contiguous()
            bad = hf_model(c)
            strict_load(bad, wrong, tag + " (c_attn transposed)")
            if mine is not None:
                err = float(np.max(np.abs(mine - hf_logits(bad, c))))
                print(f"{tag}, c_attn in the other layout: logits off by {err:.3g}")
                if err <= 100 * TOL:
                    failed.append(f"{tag}: c_attn's layout does not change the logits")
            # 2. transformers -> starpipe, float32, bfloat16, float16
            src = hf_model(c, init_std=0.2)
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                out = os.path.join(d, f"hf-{dtype}".replace("torch.", ""))
                src.to(dtype).save_pretrained(out, safe_serialization=True)
                path = os.path.join(out, "model.safetensors")
                widened = hf_model(c)
                widened.load_state_dict({k: v.float() for k, v in src.state_dict().items()})
                compare(f"{tag}, transformers' {dtype} file", starpipe_logits(tool, path, c, d),
                        widened, c)
            src.float()
            path = os.path.join(d, "hf-float32", "model.safetensors")
            r = subprocess.run([app, "--reference", "--steps", "1", "--init", path] + flags + data,
                               capture_output=True, text=True)
            if r.returncode or "step 1 loss" not in r.stdout:
                failed.append(f"{tag}: starpipe-gpt --init {path}: {r.stderr.strip()}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
