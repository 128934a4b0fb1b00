#!/usr/bin/env python3
"""Train a small Qwen3-MoE language model on the KJV corpus and export it as a Hugging Face
checkpoint (config.json + safetensors + tokenizer), for `sluice convert`.

    train.py DATA_DIR OUT_DIR [--seconds S] [--tiny]

DATA_DIR holds train.u16, valid.u16, heldout.u16 (uint16 token ids, written by prepare.sh) and
tokenizer/ (tokenizer.json, tokenizer_config.json). OUT_DIR receives:
    hf/            the exported checkpoint (bf16 weights, 2 safetensors shards + index)
    report.json    parameters, steps, losses, PyTorch perplexity of heldout.u16, sample text
    train.log      the log
The perplexity follows llama.cpp's protocol (qwen3moe.perplexity) and is computed in float32 on the
exported bf16 weights, i.e. on exactly the numbers a converted GGUF holds, so `sluice perplexity`
on an F32 conversion must agree with it to float32 rounding. When transformers is importable the
exported checkpoint is also loaded with Qwen3MoeForCausalLM and its perplexity and logits are
checked against ours (the proof that the export is a standard checkpoint).

Schedule: AdamW, linear warm-up then cosine decay over a step count fitted to the time budget
from the measured speed of the first steps (at most --max-epochs passes over the data); validation loss every EVAL_EVERY steps; the best
state by validation loss is exported. --tiny: a small configuration for CPU smoke tests.
"""
import argparse
import array
import json
import math
import os
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import qwen3moe as Q  # noqa: E402


def log(*a):
    msg = " ".join(str(x) for x in a)
    print(msg, flush=True)
    with open(LOG_PATH, "a") as f:
        f.write(msg + "\n")


def read_ids(path):
    a = array.array("H")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return list(a)


def batches(data, seq, bsz, gen, device):
    n = data.numel() - seq - 1
    while True:
        starts = torch.randint(0, n, (bsz,), generator=gen)
        x = torch.stack([data[s:s + seq + 1] for s in starts.tolist()]).to(device)
        yield x[:, :-1], x[:, 1:]


@torch.no_grad()
def eval_loss(model, data, seq, device, max_windows=64):
    """Mean token loss over the first max_windows windows of data, as one batch."""
    model.eval()
    n = min((data.numel() - 1) // seq, max_windows)
    x = torch.stack([data[w * seq:(w + 1) * seq + 1] for w in range(n)]).to(device)
    with autocast(device):
        lg, _ = model(x[:, :-1])
    loss = torch.nn.functional.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1))
    model.train()
    return loss.item()


def autocast(device):
    if device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def sample(model, enc, prompt, n, device, temperature=0.8, top_k=40, seed=1):
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = enc.encode(prompt)
    for _ in range(n):
        x = torch.tensor(ids[-model.c.max_position_embeddings:], device=device)[None]
        lg, _ = model(x)
        lg = lg[0, -1].float().cpu()
        if temperature <= 0:
            nxt = int(lg.argmax())
        else:
            v, i = torch.topk(lg / temperature, top_k)
            nxt = int(i[torch.multinomial(torch.softmax(v, -1), 1, generator=g)])
        ids.append(nxt)
        if nxt == model.c.eos_token_id:
            break
    return enc.decode(ids)


def main():
    global LOG_PATH
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=200)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--max-epochs", type=float, default=40,
                    help="cap on the schedule's length, in passes over the training tokens")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    LOG_PATH = os.path.join(args.out, "train.log")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(1234)
    if device == "cuda":
        # float32 evaluation must be true float32 (no TF32) for the perplexity comparison
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    enc = bpe.load(os.path.join(args.data, "tokenizer", "tokenizer.json"))
    vocab = max(enc.vocab.values()) + 1
    eos = enc.specials["<|endoftext|>"]
    train = torch.tensor(read_ids(os.path.join(args.data, "train.u16")), dtype=torch.long)
    valid = torch.tensor(read_ids(os.path.join(args.data, "valid.u16")), dtype=torch.long)
    held = read_ids(os.path.join(args.data, "heldout.u16"))
    if args.tiny:
        cfg = Q.Cfg(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=32, num_experts=4, moe_intermediate_size=64,
                    eos_token_id=eos, dropout=0.1)
        seq, bsz, lr, eval_every = 64, 8, 3e-3, 20
    else:
        cfg = Q.Cfg(vocab_size=vocab, hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=256, eos_token_id=eos, dropout=0.1)
        seq, bsz, lr, eval_every = 512, 32, 2e-3, 100
    model = Q.Qwen3MoeLM(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    active = n_params - sum(p.numel() for n, p in model.named_parameters() if ".experts." in n) * \
        (1 - cfg.num_experts_per_tok / cfg.num_experts)
    log("device %s, torch %s, %d parameters (%.1fM; %.1fM active per token), %d train tokens, "
        "%d valid, %d held out" % (device, torch.__version__, n_params, n_params / 1e6, active / 1e6,
                                   train.numel(), valid.numel(), len(held)))

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(42)
    it = batches(train, seq, bsz, gen, device)
    warmup, total_steps = 100 if not args.tiny else 5, None
    t0 = time.time()
    best = (float("inf"), None, 0)
    step, hist = 0, []
    while True:
        step += 1
        if total_steps is None and step == 31:
            # fit the schedule to the time budget from the speed of steps 11..30 (eval included)
            per = (time.time() - t_fit) / 20
            by_time = int(args.seconds / (per * (1 + 8.0 / eval_every)))
            by_epochs = int(args.max_epochs * train.numel() / (seq * bsz))
            total_steps = max(50, min(by_time, by_epochs))
            log("%.3f s/step -> %d steps (time budget allows %d, %.0f epochs %d)" %
                (per, total_steps, by_time, args.max_epochs, by_epochs))
        if step == 11:
            t_fit = time.time()
        horizon = total_steps or 10 ** 9
        cur_lr = lr * min(1.0, step / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / horizon))))
        for g in opt.param_groups:
            g["lr"] = cur_lr
        x, y = next(it)
        with autocast(device):
            lg, aux = model(x)
            loss = torch.nn.functional.cross_entropy(lg.float().reshape(-1, cfg.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + cfg.aux_loss_coef * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = total_steps is not None and (step >= total_steps or time.time() - t0 > args.seconds * 1.1)
        if step % eval_every == 0 or done:
            vl = eval_loss(model, valid, seq, device)
            hist.append((step, round(loss.item(), 4), round(vl, 4)))
            log("step %d  lr %.2e  train %.4f  aux %.3f  valid %.4f (ppl %.2f)  %.0f s" %
                (step, cur_lr, loss.item(), float(aux), vl, math.exp(vl), time.time() - t0))
            if vl < best[0]:
                best = (vl, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
        if done:
            break
    train_s = time.time() - t0
    log("trained %d steps in %.0f s; best valid loss %.4f at step %d" % (step, train_s, best[0], best[2]))
    model.load_state_dict(best[1])
    # the exported numbers are bf16: evaluate exactly those, in float32
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model = model.float().eval()
    hf_dir = os.path.join(args.out, "hf")
    Q.export_hf(model, hf_dir, n_shards=args.shards)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.data, "tokenizer", fn), hf_dir)

    n_ctx = 512 if not args.tiny else 64

    def ours(x):
        return model(x)[0]

    ppl, nll, cnt, nwin = Q.perplexity(ours, held, n_ctx, device)
    log("PyTorch perplexity (own model, float32, bf16 weights): %.4f over %d tokens in %d windows of %d" %
        (ppl, cnt, nwin, n_ctx))
    report = {"parameters": n_params, "active_parameters": int(active), "config": cfg.hf_config(),
              "steps": step, "train_seconds": round(train_s, 1), "best_step": best[2],
              "best_valid_loss": best[0], "history": hist, "device": device,
              "torch": torch.__version__, "train_tokens": train.numel(),
              "ppl": {"n_ctx": n_ctx, "windows": nwin, "tokens_scored": cnt, "ppl_own": ppl,
                      "nll_own": nll}}
    try:
        import transformers
        hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(device).eval()
        report["transformers"] = transformers.__version__

        def theirs(x):
            return hf(x).logits

        with torch.no_grad():
            x = torch.tensor(held[:n_ctx], device=device)[None]
            a, b = ours(x).double(), theirs(x).double()
            report["hf_max_abs_logit_diff"] = (a - b).abs().max().item()
            report["hf_rel_logit_diff"] = ((a - b).norm() / b.norm()).item()
        hppl, hnll, _, _ = Q.perplexity(theirs, held, n_ctx, device)
        report["ppl"]["ppl_transformers"] = hppl
        report["ppl"]["nll_transformers"] = hnll
        log("transformers %s: perplexity %.4f; logits vs own model: max |diff| %.3g, relative %.3g" %
            (transformers.__version__, hppl, report["hf_max_abs_logit_diff"], report["hf_rel_logit_diff"]))
        del hf
    except Exception as e:  # the export stays usable; the report says why the check is missing
        report["transformers_error"] = repr(e)[:500]
        log("transformers check failed:", repr(e)[:500])
    samples = {}
    for i, prompt in enumerate(["And God said", "The LORD is my shepherd", "In the beginning"]):
        samples[prompt] = {"greedy": sample(model, enc, prompt, 60, device, temperature=0),
                           "t0.8": sample(model, enc, prompt, 60, device, seed=i + 1)}
        log("sample %r: %r" % (prompt, samples[prompt]["t0.8"][:300]))
    report["samples"] = samples
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
