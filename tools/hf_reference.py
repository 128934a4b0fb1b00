#!/usr/bin/env python3
"""Reference models and logits for the converter tests (tests/data/hf), made with transformers.

    hf_reference.py OUT_DIR [--tokenizer DIR] [--prompt FILE] [--only NAME]

Builds tiny random models with transformers' own classes, Qwen3MoeForCausalLM (qwen3_moe),
Qwen3_5MoeForCausalLM (qwen3_5_moe_text: Gated DeltaNet + gated attention + shared expert) and
Qwen4ExpForCausalLM (qwen4_exp_text: hyper-connections, Gated DeltaNet with the sigmoid gate, QSA
gated attention, the n-gram/PLE module and its table, MoE + shared expert), saves each with
save_pretrained (bf16 safetensors + config.json) next to the tokenizer, and writes the logits of
every position of a fixed prompt (--only qwen3moe / qwen35moe / qwen4exp: that model alone):

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

qwen4exp-tiny: layers [linear, linear + n-gram module, QSA attention] (the attention layer last, so
that a position's logits depend on its own QSA selection only), 4 streams of rank 32, indexer 4
heads of 32 in blocks of 4, budget 2048 (dense over the prompt). The same weights are run again
with indexer_budget 16 (QSA block selection from position 19 on) and written as
qwen4exp-tiny-topk16.logits.f32, with the cells each position attended in the attention layer as
qwen4exp-tiny-topk16.qsa.u8 ([n][n] bytes, 1 = attended), recorded from the indexer's own mask.
Every config field is checked against the installed transformers' Qwen4ExpTextConfig before use
and read back after: a renamed or missing field stops the script with its name, never silently.
The meta.json lists the in-memory state_dict (names, dtypes, shapes) and the saved tensors.
"""
import argparse
import copy
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


class ConfigMismatch(RuntimeError):
    pass


def checked_config(cls, rope, extra, **kw):
    """make_config, after checking that this transformers' config class knows every field, and
    checking afterwards that each one reads back as given (a field that a version renamed would
    otherwise be taken as an unknown keyword and ignored). extra: keywords the class consumes in
    __post_init__ (not fields)."""
    fields = set(getattr(cls, "__dataclass_fields__", {})) | set(inspect.signature(cls).parameters)
    missing = sorted(k for k in kw if k not in fields)
    if missing:
        raise ConfigMismatch("%s (transformers %s) has no field(s) %s; its fields: %s" % (
            cls.__name__, __import__("transformers").__version__, missing, sorted(fields)))
    cfg = make_config(cls, rope, **dict(kw, **extra))
    wrong = {}
    for k, v in kw.items():
        got = getattr(cfg, k, None)
        if isinstance(v, list):
            got = list(got) if got is not None else None
        if got != v:
            wrong[k] = (v, got)
    rp = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    for k, v in rope.items():
        got = rp.get(k, getattr(cfg, k, None))
        if k != "mrope_interleaved" and (list(got) if isinstance(got, (list, tuple)) else got) != v:
            wrong["rope " + k] = (v, got)
    if wrong:
        raise ConfigMismatch("%s: fields read back differently (wanted, got): %s" % (cls.__name__, wrong))
    return cfg


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
        elif "embed_tokens" in name or "ngram_embedding" in name:  # token and n-gram tables
            v = 0.5 * r
        elif name.endswith("mlp.gate.weight"):  # router: decisive choices, no near-ties
            v = 2.0 * r / shape[-1] ** 0.5
        else:
            v = 0.7 * r / shape[-1] ** 0.5
        p.copy_(v.to(torch.bfloat16).to(p.dtype))


def qwen4exp(transformers):
    cfg_cls = getattr(transformers, "Qwen4ExpTextConfig", None)
    cls = getattr(transformers, "Qwen4ExpForCausalLM", None)
    if cfg_cls is None or cls is None:
        raise ConfigMismatch("transformers %s has no Qwen4ExpTextConfig / Qwen4ExpForCausalLM"
                             % transformers.__version__)
    # head_dim 64 with partial rotary 0.25: 16 rotated dims, 8 frequencies = mrope 3+3+2; the
    # indexer heads (32) hold the 16 rotated dims; n-gram: 2 orders x 4 heads of 32 = hidden 256,
    # moduli the primes from 250 (table 2176 rows in 4 shards). The layer pattern: let the config
    # derive its own layer-type names from full_attention_interval 3 (they changed between
    # versions), else name them explicitly.
    rope = {"rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [3, 3, 2],
            "mrope_interleaved": True}
    attempts = [({"full_attention_interval": 3}, {}),
                ({}, {"layer_types": ["linear_attention", "linear_attention", "deepseek_sparse_attention"]}),
                ({}, {"layer_types": ["linear_attention", "linear_attention", "full_attention"]})]
    failures = []
    for extra, pattern in attempts:
        try:
            cfg = qwen4exp_config(cfg_cls, rope, extra, pattern)
            return cfg, cls
        except ConfigMismatch:
            raise
        except Exception as e:  # this version's validation refused this layer pattern
            failures.append("%s%s: %r" % (extra, pattern, e))
    raise ConfigMismatch("no layer pattern was accepted: %s" % failures)


def qwen4exp_config(cfg_cls, rope, extra, pattern):
    cfg = checked_config(
        cfg_cls, rope, extra, **pattern,
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, linear_conv_kernel_dim=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, norm_topk_prob=True, rms_norm_eps=1e-6,
        max_position_embeddings=512, tie_word_embeddings=False, hc_count=4, hc_lowrank=32,
        indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=2048,
        indexer_compress_ratio=4, ple_layer_ids=[2], ple_embed_dim=256, ple_conv_kernel_size=4,
        ngram_size=3, heads_per_ngram=4, ngram_vocab_size_base=250,
        make_ngram_vocab_size_divisible_by=128, seed=1234, split_ngram_parts=4,
        output_gate_type="sigmoid", bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    lt = list(cfg.layer_types)
    if len(lt) != 3 or lt[0] != "linear_attention" or lt[1] != "linear_attention" or lt[2] == "linear_attention":
        raise ValueError("layer_types came out %s, wanted [linear, linear, attention]" % lt)
    return cfg


def check_qwen4exp_model(model):
    """The modules the reference must exercise, by the names sluice convert reads."""
    m = model.model
    need = {"model.hyper_connection_mixer": getattr(m, "hyper_connection_mixer", None),
            "model.layers.1.ple": getattr(m.layers[1], "ple", None),
            "model.layers.2.self_attn.indexer": getattr(getattr(m.layers[2], "self_attn", None), "indexer", None),
            "model.layers.0.linear_attn": getattr(m.layers[0], "linear_attn", None)}
    absent = [k for k, v in need.items() if v is None]
    if absent:
        raise ConfigMismatch("Qwen4ExpForCausalLM lacks %s" % absent)


def qsa_cells(model, ids, dtype):
    """Logits, and the cells each position attends in the attention layer: [n][n] uint8, from
    the indexer's own output (its selection mask, additive or boolean), within the causal mask."""
    indexer = model.model.layers[2].self_attn.indexer
    seen = []

    def hook(mod, args, out):
        seen.append(out)
    h = indexer.register_forward_hook(hook)
    try:
        logits = run(model, ids, dtype)
    finally:
        h.remove()
    if len(seen) != 1:
        raise ConfigMismatch("the indexer ran %d times, expected once" % len(seen))
    out = seen[0]
    cands = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
             if torch.is_tensor(t) and t.dim() == 4]
    if len(cands) != 1:
        raise ConfigMismatch("cannot find the indexer's [B, 1, Q, K] mask in its output %s" %
                             [getattr(t, "shape", type(t)) for t in (out if isinstance(out, (tuple, list)) else (out,))])
    mask = cands[0][0, 0]
    sel = mask if mask.dtype == torch.bool else (mask == 0)
    n = len(ids)
    sel = sel[-n:, -n:] & torch.ones(n, n, dtype=torch.bool).tril()
    return logits, sel.to(torch.uint8)


def qwen4exp_topk(name, model, cfg, cls, ids, out, transformers):
    """The same weights with indexer_budget 16: block selection engaged within the prompt."""
    check_qwen4exp_model(model)
    cfg16 = copy.deepcopy(cfg)
    cfg16.indexer_budget = 16
    m16 = cls(cfg16).float().eval()
    missing, unexpected = m16.load_state_dict(model.state_dict(), strict=False)
    if missing or unexpected:
        raise ConfigMismatch("state_dict transfer to the budget-16 model: missing %s unexpected %s"
                             % (missing, unexpected))
    if getattr(m16.model.layers[2].self_attn.indexer, "token_budget", 16) != 16:
        raise ConfigMismatch("the budget-16 model's indexer did not take indexer_budget 16")
    r32, _ = qsa_cells(m16, ids, torch.float32)
    try:
        r64, cells = qsa_cells(m16, ids, torch.float64)
    except Exception as e:
        print("%s-topk16: float64 run failed (%r); using float32" % (name, e), flush=True)
        r64, cells = qsa_cells(m16, ids, torch.float32)
    dense = run(model.float(), ids, torch.float64 if r64.dtype == torch.float64 else torch.float32)
    r64.float().numpy().tofile(os.path.join(out, name + "-topk16.logits.f32"))
    cells.numpy().tofile(os.path.join(out, name + "-topk16.qsa.u8"))
    n = len(ids)
    sparse = int((cells.sum(dim=1) < torch.arange(1, n + 1)).sum())
    info = {"indexer_budget": 16, "sparse_positions": sparse,
            "attended_per_position": cells.sum(dim=1).tolist(),
            "f32_vs_f64": rel_err(r32, r64), "vs_dense_budget": rel_err(r64, dense)}
    print("%s-topk16: %d of %d positions sparse; vs the dense budget median %.3g" %
          (name, sparse, n, info["vs_dense_budget"]["median"]), flush=True)
    return info


def run(model, ids, dtype):
    model = model.to(dtype)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].double()


def rel_err(a, b):
    d = (a - b).norm(dim=-1) / b.norm(dim=-1)
    return {"median": d.median().item(), "max": d.max().item()}


def build(name, maker, transformers, ids, out, tok_dir, seed, post=None):
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
    state = {k: [str(v.dtype), list(v.shape)] for k, v in model.state_dict().items()}
    extra = post(name, model, cfg, cls, ids, out, transformers) if post else None
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
            "state_dict": state, "config": json.load(open(os.path.join(d, "config.json")))}
    if extra:
        meta["topk16"] = extra
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
    models = [("qwen3moe-tiny", qwen3moe, None), ("qwen35moe-tiny", qwen35moe, None),
              ("qwen4exp-tiny", qwen4exp, qwen4exp_topk)]
    if args.only and not any(args.only in (n, n.replace("-tiny", "")) for n, _, _ in models):
        sys.exit("--only: one of %s" % ", ".join(n.replace("-tiny", "") for n, _, _ in models))
    for i, (name, maker, post) in enumerate(models):
        if args.only and args.only not in (name, name.replace("-tiny", "")):
            continue
        try:
            build(name, maker, transformers, ids, args.out, args.tokenizer, 1000 + i, post)
        except Exception as e:  # keep going: the other model's reference is still useful
            import traceback
            traceback.print_exc()
            with open(os.path.join(args.out, name + ".error.txt"), "w") as f:
                f.write(traceback.format_exc())


if __name__ == "__main__":
    main()
