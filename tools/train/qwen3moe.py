"""A compact Qwen3-MoE decoder in plain PyTorch (no transformers), with the exact math and
parameter names of Hugging Face's Qwen3MoeForCausalLM, so that its state dict saves as a standard
HF checkpoint that transformers, llama.cpp's converter and `sluice convert` read.

Math (transformers' modeling_qwen3_moe.py):
  RMSNorm  y = w * (x * rsqrt(mean(x^2) + eps)), in float32, weight initialised to ones
  attention: q/k/v projections without bias; per-head RMSNorm on q and k (q_norm, k_norm) before
    NeoX ("rotate half") RoPE over the whole head; GQA (query head h uses KV head h / (Hq/Hkv));
    causal softmax(q k^T / sqrt(head_dim)); o_proj
  MoE: router logits = gate(x); p = softmax in float32; top-k; renormalised (norm_topk_prob);
    expert e: down(silu(gate_proj(x)) * up_proj(x)); weighted sum of the k experts
  decoder layer: h += attn(input_layernorm(h)); h += moe(post_attention_layernorm(h))
  logits = lm_head(norm(h))

Training-only additions that do not change the exported architecture: dropout on the residual
branches and attention probabilities (off in eval mode), and the Switch-style load-balancing
auxiliary loss.
Works on PyTorch 1.13 (CPU tests here) and 2.x (the GPU machine).
"""
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Cfg:
    def __init__(self, **kw):
        self.vocab_size = 4096
        self.hidden_size = 256
        self.num_hidden_layers = 6
        self.num_attention_heads = 4
        self.num_key_value_heads = 2
        self.head_dim = 64
        self.num_experts = 8
        self.num_experts_per_tok = 2
        self.moe_intermediate_size = 256
        self.rms_norm_eps = 1e-6
        self.rope_theta = 10000.0
        self.max_position_embeddings = 512
        self.dropout = 0.0
        self.aux_loss_coef = 0.01
        self.eos_token_id = 4095
        for k, v in kw.items():
            if not hasattr(self, k):
                raise ValueError("unknown config field " + k)
            setattr(self, k, v)

    def hf_config(self):
        """config.json of the equivalent transformers Qwen3MoeForCausalLM."""
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.moe_intermediate_size * self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "output_router_logits": False,
            "router_aux_loss_coef": self.aux_loss_coef,
            "initializer_range": 0.02,
            "bos_token_id": self.eos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": "bfloat16",
            "use_cache": True,
        }


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_cache(n, dim, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    t = torch.arange(n, dtype=torch.float32, device=device)
    fr = torch.outer(t, inv)
    emb = torch.cat([fr, fr], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        c = self.c
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = cos[:T].to(q.dtype), sin[:T].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = c.num_attention_heads // c.num_key_value_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(c.head_dim))
        s = s.masked_fill(mask[:T, :T], float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        p = F.dropout(p, c.dropout, self.training)
        o = (p @ v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(o)


class Expert(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.moe_intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.moe_intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.moe_intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.experts = nn.ModuleList([Expert(c) for _ in range(c.num_experts)])

    def forward(self, x):
        c = self.c
        shp = x.shape
        x = x.reshape(-1, shp[-1])
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        w, idx = torch.topk(probs, c.num_experts_per_tok, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            y = expert(x[tok]) * w[tok, slot, None]
            out.index_add_(0, tok, y)
        # Switch-Transformer balance loss: E * sum_e (fraction routed to e) * (mean prob of e)
        frac = F.one_hot(idx, c.num_experts).float().sum(dim=(0, 1)) / idx.numel()
        aux = c.num_experts * (frac * probs.mean(dim=0)).sum()
        return out.reshape(shp), aux


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MoE(c)

    def forward(self, h, cos, sin, mask):
        h = h + F.dropout(self.self_attn(self.input_layernorm(h), cos, sin, mask), self.c.dropout,
                          self.training)
        m, aux = self.mlp(self.post_attention_layernorm(h))
        return h + F.dropout(m, self.c.dropout, self.training), aux


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Qwen3MoeLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Body(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.apply(self._init)
        # GPT-2 style: shrink the residual-branch outputs with depth
        for layer in self.model.layers:
            nn.init.normal_(layer.self_attn.o_proj.weight, std=0.02 / math.sqrt(2 * c.num_hidden_layers))
            for ex in layer.mlp.experts:
                nn.init.normal_(ex.down_proj.weight, std=0.02 / math.sqrt(2 * c.num_hidden_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids):
        c = self.c
        T = ids.shape[1]
        cos, sin = rope_cache(T, c.head_dim, c.rope_theta, ids.device)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=ids.device), diagonal=1)
        h = self.model.embed_tokens(ids)
        aux = 0.0
        for layer in self.model.layers:
            h, a = layer(h, cos, sin, mask)
            aux = aux + a
        return self.lm_head(self.model.norm(h)), aux / c.num_hidden_layers


# ---- safetensors (the format is small enough to write by hand) -------------------------------

_DT = {torch.float32: ("F32", 4), torch.float16: ("F16", 2), torch.bfloat16: ("BF16", 2)}


def _raw_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the bits
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def save_safetensors(path, tensors, metadata=None):
    """tensors: ordered dict name -> tensor. Header: 8-byte little-endian length, JSON (padded
    with spaces to 8 bytes), then the data, offsets relative to the end of the header."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        b = _raw_bytes(t)
        header[name] = {"dtype": _DT[t.dtype][0], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(hj).to_bytes(8, "little"))
        f.write(hj)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = np.frombuffer(data[base + a:base + b], dtype={"F32": np.float32, "F16": np.float16,
                                                              "BF16": np.int16}[info["dtype"]])
        t = torch.from_numpy(raw.copy())
        if info["dtype"] == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t.reshape(info["shape"])
    return out


def export_hf(model, out_dir, n_shards=1, dtype=torch.bfloat16):
    """config.json, generation_config.json and the weights as (sharded) safetensors with an
    index, in transformers' names; experts in the per-expert layout of the released Qwen3-MoE
    checkpoints."""
    import os
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.to(dtype) for k, v in model.state_dict().items()}
    names = list(sd.keys())
    total = sum(v.numel() * v.element_size() for v in sd.values())
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.c.hf_config(), f, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": model.c.eos_token_id, "eos_token_id": model.c.eos_token_id,
                   "do_sample": False}, f, indent=1)
    if n_shards == 1:
        save_safetensors(os.path.join(out_dir, "model.safetensors"), sd, {"format": "pt"})
        return
    # split by bytes, in state-dict order
    per = total / n_shards
    shards, cur, acc = [], [], 0
    for k in names:
        nb = sd[k].numel() * sd[k].element_size()
        if cur and acc + nb > per * (len(shards) + 1) and len(shards) < n_shards - 1:
            shards.append(cur)
            cur = []
        cur.append(k)
        acc += nb
    shards.append(cur)
    wmap = {}
    for i, keys in enumerate(shards):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        save_safetensors(os.path.join(out_dir, fn), {k: sd[k] for k in keys}, {"format": "pt"})
        for k in keys:
            wmap[k] = fn
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=1)


@torch.no_grad()
def perplexity(logits_fn, ids, n_ctx=512, device="cpu"):
    """llama.cpp's perplexity protocol: non-overlapping windows of n_ctx tokens, each evaluated
    from an empty context; the tokens of the second half of each window are scored (the logits
    of positions n_ctx/2 .. n_ctx-2 predicting positions n_ctx/2+1 .. n_ctx-1).
    Returns (ppl, mean nll, tokens scored, windows)."""
    n_win = len(ids) // n_ctx
    nll, count = 0.0, 0
    first = n_ctx // 2
    for w in range(n_win):
        x = torch.tensor(ids[w * n_ctx:(w + 1) * n_ctx], dtype=torch.long, device=device)[None]
        lg = logits_fn(x)[0].double()
        lp = torch.log_softmax(lg[first:n_ctx - 1], dim=-1)
        tgt = x[0, first + 1:n_ctx]
        nll -= lp.gather(1, tgt[:, None]).sum().item()
        count += n_ctx - 1 - first
    return math.exp(nll / count), nll / count, count, n_win
