#!/usr/bin/env python3
"""Reference models and logits for the converter tests (tests/data/hf), made with transformers.

    hf_reference.py OUT_DIR [--tokenizer DIR] [--prompt FILE]

Builds two tiny random models with transformers' own classes, Qwen3MoeForCausalLM (qwen3_moe) and
Qwen3_5MoeForCausalLM (qwen3_5_moe_text: Gated DeltaNet + gated attention + shared expert), saves
each with save_pretrained (bf16 safetensors + config.json) next to the tokenizer, and writes the
logits of every position of a fixed prompt:

    OUT_DIR/<name>/            config.json, model.safetensors, tokenizer.json, tokenizer_config.json
    OUT_DIR/<name>.logits.f32  [n_prompt][vocab] little-endian float32 (the float64 run, rounded)
    OUT_DIR/<name>.prompt.ids  the prompt's token ids, space separated
    OUT_DIR/<name>.meta.json   versions, shapes and names of the saved tensors, and how far
                               transformers' own float32 logits are from its float64 ones

Weights are random (seeded) with larger spreads than the default initialisation so that every
tensor matters to the logits (norm weights away from their 0/1 init, so that a missed or extra
"+1" shows; decays, dt biases and conv taps spread out), and rounded to bf16 before anything is
computed: the saved bf16 file then holds exactly the numbers the reference used. The reference
runs on the CPU in float64 (transformers casts to float32 in a few places: RMSNorm statistics and
the Gated DeltaNet kernels), with eager attention.

Dimensions are multiples of 256 where a K-quant test needs them (hidden 256), the vocabulary is
the 1024-token BPE of tests/data/hf/tokenizer (trained on the KJV corpus by tools/train/bpe.py).
"""
import argparse
import inspect
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "train"))
import bpe  # noqa: E402

VOCAB = 1024
EOS = 1023


def make_config(cls, rope, **kw):
    """Build a transformers config with the RoPE settings in whichever form this version takes
    (rope_parameters in transformers 5, rope_theta / partial_rotary_factor before)."""
    params = inspect.signature(cls).parameters
    fields = getattr(cls, "__dataclass_fields__", {})
    if "rope_parameters" in params or "rope_parameters" in fields:
        kw["rope_parameters"] = dict(rope_type="default", **rope)
    else:
        kw["rope_theta"] = rope["rope_theta"]
        for k in ("partial_rotary_factor",):
            if k in rope:
                kw[k] = rope[k]
        if "mrope_section" in rope:
            kw["rope_scaling"] = {"rope_type": "default", "mrope_section": rope["mrope_section"],
                                  "mrope_interleaved": True}
    return cls(**kw)


def qwen3moe(transformers):
    cfg = make_config(transformers.Qwen3MoeConfig, {"rope_theta": 1e6},
                      vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                      moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, num_experts=4, num_experts_per_tok=2,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                      rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=False,
                      bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    return cfg, transformers.Qwen3MoeForCausalLM


def qwen35moe(transformers):
    # head_dim 128 with partial rotary 0.25: 32 rotated dims, 16 frequencies = mrope 6+5+5
    cfg = make_config(transformers.Qwen3_5MoeTextConfig,
                      {"rope_theta": 1e7, "partial_rotary_factor": 0.25,
                       "mrope_section": [6, 5, 5], "mrope_interleaved": True},
                      vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2,
                      layer_types=["linear_attention", "full_attention"],
                      num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                      linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
                      linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=128,
                      shared_expert_intermediate_size=128, rms_norm_eps=1e-6,
                      max_position_embeddings=512, tie_word_embeddings=True,
                      bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    return cfg, getattr(transformers, "Qwen3_5MoeForCausalLM", None)


@torch.no_grad()
def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        shape = p.shape
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith("A_log"):
            v = torch.log(torch.rand(shape, generator=g, dtype=torch.float64) * 7 + 1)
        elif name.endswith("dt_bias"):
            v = 0.5 * r
        elif "conv1d" in name:
            v = 0.4 * r
        elif p.dim() == 1:  # RMSNorm weights: keep the init (0 or 1) and spread around it
            v = p.double() + 0.2 * r
        elif "embed_tokens" in name:
            v = 0.5 * r
        elif name.endswith("mlp.gate.weight"):  # router: decisive choices, no near-ties
            v = 2.0 * r / shape[-1] ** 0.5
        else:
            v = 0.7 * r / shape[-1] ** 0.5
        p.copy_(v.to(torch.bfloat16).to(p.dtype))


def run(model, ids, dtype):
    model = model.to(dtype)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].double()


def rel_err(a, b):
    d = (a - b).norm(dim=-1) / b.norm(dim=-1)
    return {"median": d.median().item(), "max": d.max().item()}


def build(name, maker, transformers, ids, out, tok_dir, seed):
    cfg, cls = maker(transformers)
    if cls is None:
        cls = transformers.AutoModelForCausalLM
    cfg._attn_implementation = "eager"
    try:  # the plain per-expert loop (no grouped-GEMM kernels, which may lack float64)
        cfg._experts_implementation = "eager"
    except Exception:
        pass
    torch.manual_seed(seed)
    model = (cls(cfg) if cls is not transformers.AutoModelForCausalLM
             else cls.from_config(cfg)).float().eval()
    randomize(model, seed)
    ref32 = run(model, ids, torch.float32)
    try:
        ref64, ref_kind = run(model, ids, torch.float64), "float64"
    except Exception as e:  # some kernel refused float64: the float32 run is the reference
        print("%s: float64 run failed (%r); using float32" % (name, e), flush=True)
        ref64, ref_kind = ref32, "float32"
    model = model.float()
    d = os.path.join(out, name)
    model.to(torch.bfloat16).save_pretrained(d)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, fn), d)
    # what was saved, and does it load back to the same model?
    from safetensors import safe_open
    tensors = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "pt") as f:
                for k in f.keys():
                    t = f.get_tensor(k)
                    tensors[k] = [str(t.dtype), list(t.shape)]
    back = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    reload32 = run(back, ids, torch.float32)
    ref64.float().numpy().tofile(os.path.join(out, name + ".logits.f32"))
    with open(os.path.join(out, name + ".prompt.ids"), "w") as f:
        f.write(" ".join(str(i) for i in ids) + "\n")
    meta = {"name": name, "transformers": transformers.__version__, "torch": torch.__version__,
            "n_prompt": len(ids), "vocab": VOCAB, "seed": seed, "reference_dtype": ref_kind,
            "f32_vs_f64": rel_err(ref32, ref64), "reloaded_f32_vs_f64": rel_err(reload32, ref64),
            "n_params": sum(p.numel() for p in model.parameters()), "tensors": tensors,
            "config": json.load(open(os.path.join(d, "config.json")))}
    with open(os.path.join(out, name + ".meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("%s: %d parameters, f32 vs f64 median %.3g max %.3g; reloaded %.3g" %
          (name, meta["n_params"], meta["f32_vs_f64"]["median"], meta["f32_vs_f64"]["max"],
           meta["reloaded_f32_vs_f64"]["max"]), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "..", "tests", "data", "hf", "tokenizer"))
    ap.add_argument("--prompt", default=os.path.join(HERE, "..", "tests", "data", "hf", "prompt.txt"))
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    import transformers
    os.makedirs(args.out, exist_ok=True)
    enc = bpe.load(os.path.join(args.tokenizer, "tokenizer.json"))
    text = open(args.prompt, encoding="utf-8").read()
    ids = enc.encode(text)
    check = {"ours": ids}
    try:  # the same text through Hugging Face's tokenizers: the tokenizer.json must agree
        import tokenizers
        hf_ids = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json")).encode(text).ids
        check["tokenizers"] = tokenizers.__version__
        check["tokenizers_agree"] = hf_ids == ids
        if hf_ids != ids:
            check["tokenizers_ids"] = hf_ids
    except Exception as e:
        check["tokenizers_error"] = repr(e)[:300]
    with open(os.path.join(args.out, "tokenizer_check.json"), "w") as f:
        json.dump(check, f)
    print("prompt: %d tokens; HF tokenizers agree: %s" % (len(ids), check.get("tokenizers_agree")), flush=True)
    for i, (name, maker) in enumerate([("qwen3moe-tiny", qwen3moe), ("qwen35moe-tiny", qwen35moe)]):
        if args.only and args.only != name:
            continue
        try:
            build(name, maker, transformers, ids, args.out, args.tokenizer, 1000 + i)
        except Exception as e:  # keep going: the other model's reference is still useful
            import traceback
            traceback.print_exc()
            with open(os.path.join(args.out, name + ".error.txt"), "w") as f:
                f.write(traceback.format_exc())


if __name__ == "__main__":
    main()
