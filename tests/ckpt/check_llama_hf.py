#!/usr/bin/env python3
"""starpipe-llama's checkpoints against Hugging Face transformers, driven by ctest
(ckpt.llama_hf; exit 77, skipped, when torch or transformers is not importable).

  check_llama_hf.py STARPIPE_LLAMA HF_LOGITS

For two configs (grouped-query attention with Llama's theta; multi-head attention with a
small theta, which makes the rotation's convention and theta's plumbing matter):
  1. starpipe -> transformers: a checkpoint written by `starpipe-llama --reference` after 3
     steps loads into LlamaForCausalLM with load_state_dict(strict=True) (its AdamW
     moments set aside), and transformers' logits on 3 x T tokens equal starpipe's
     (hf_logits: the reference interpreter on that file) within 1e-4 of the largest;
  2. transformers -> starpipe: a randomly initialised LlamaForCausalLM saved with
     save_pretrained, in float32 and in bfloat16, gives starpipe the logits transformers
     computes from those weights; `starpipe-llama --init` trains from it.
Exits non-zero, naming what differs, on any mismatch."""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors import safe_open
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_check import compare, failed, finish, starpipe_logits as logits_of  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)
CONFIGS = [
    dict(V=256, T=16, L=2, H=4, KV=2, C=32, I=64, theta=10000.0),
    dict(V=256, T=12, L=3, H=2, KV=2, C=16, I=40, theta=100.0),
]
KEYS = ("V", "T", "L", "H", "KV", "C", "I", "theta")


def starpipe_logits(tool, path, c, d):
    return logits_of(tool, "llama", KEYS, path, c, d)


def hf_model(c, init_std=0.02):
    cfg = LlamaConfig(vocab_size=c["V"], hidden_size=c["C"], intermediate_size=c["I"],
                      num_hidden_layers=c["L"], num_attention_heads=c["H"],
                      num_key_value_heads=c["KV"], max_position_embeddings=c["T"],
                      rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
                      mlp_bias=False, initializer_range=init_std)
    cfg.rope_theta = c["theta"]  # transformers 4.x reads this
    if getattr(cfg, "rope_parameters", None):  # 5.x reads this
        cfg.rope_parameters["rope_theta"] = c["theta"]
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg).float().eval()


def main():
    app, tool = sys.argv[1], sys.argv[2]
    for n, c in enumerate(CONFIGS):
        with tempfile.TemporaryDirectory() as d:
            tag = f"config {n} (H {c['H']}, KV {c['KV']}, theta {c['theta']:g})"
            flags = ["--layers", str(c["L"]), "--heads", str(c["H"]), "--kv-heads", str(c["KV"]),
                     "--channels", str(c["C"]), "--hidden", str(c["I"]), "--context", str(c["T"]),
                     "--rope-theta", str(c["theta"]), "--batch", "2", "--microbatches", "2"]
            # 1. starpipe -> transformers
            ck = os.path.join(d, "sp.safetensors")
            r = subprocess.run([app, "--reference", "--steps", "3", "--lr", "3e-3", "--save", ck]
                               + flags, capture_output=True, text=True)
            if r.returncode:
                failed.append(f"{tag}: starpipe-llama failed: {r.stderr.strip()}")
                continue
            with safe_open(ck, "pt") as f:
                sd = {k: f.get_tensor(k) for k in f.keys() if not k.endswith((".adam_m", ".adam_v"))}
            model = hf_model(c)
            try:
                model.load_state_dict(sd, strict=True)
            except RuntimeError as e:
                failed.append(f"{tag}: transformers refuses starpipe's checkpoint: {e}")
                continue
            compare(f"{tag}, starpipe's checkpoint", starpipe_logits(tool, ck, c, d), model, c,
                    1e-4)
            # 2. transformers -> starpipe, float32 then bfloat16
            src = hf_model(c, init_std=0.2)
            for dtype in (torch.float32, torch.bfloat16):
                out = os.path.join(d, f"hf-{dtype}".replace("torch.", ""))
                src.to(dtype).save_pretrained(out, safe_serialization=True)
                path = os.path.join(out, "model.safetensors")
                widened = hf_model(c)
                widened.load_state_dict({k: v.float() for k, v in src.state_dict().items()})
                compare(f"{tag}, transformers' {dtype} file", starpipe_logits(tool, path, c, d),
                        widened, c, 1e-4)
            src.float()
            r = subprocess.run([app, "--reference", "--steps", "1", "--init", path] + flags,
                               capture_output=True, text=True)
            if r.returncode or "step 1 loss" not in r.stdout:
                failed.append(f"{tag}: starpipe-llama --init {path}: {r.stderr.strip()}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
