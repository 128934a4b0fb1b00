#!/usr/bin/env python3
"""A small byte-level BPE trainer and encoder (GPT-2 / Qwen2 style), standard library only.

    bpe.py train CORPUS.txt VOCAB_SIZE OUT_DIR      tokenizer.json + tokenizer_config.json
    bpe.py encode OUT_DIR/tokenizer.json TEXT.txt OUT.u16   token ids as little-endian uint16

The tokenizer it writes is the one Qwen2/Qwen3 checkpoints use, so that llama.cpp's (and
sluice's) "gpt2" model with pre-tokenizer "qwen2" reproduces our encoding exactly:
  1. split the text with the Qwen2 pre-tokenizer regex (every match is a word);
  2. map each word's UTF-8 bytes to printable characters (GPT-2's bytes_to_unicode);
  3. apply the merges in rank order (lowest rank first, leftmost first on ties).
The regex uses Unicode classes (\\p{L}, \\p{N}) that Python's `re` lacks; PATTERN_RE below is
the same pattern written with `re` classes, exact for ASCII text (the training corpus is ASCII:
`train` refuses anything else), approximate beyond it.

Training: count the words of the corpus, then repeatedly merge the most frequent adjacent pair
(ties: the lexicographically smallest pair, for determinism), updating pair counts incrementally
through an index from pairs to the words that contain them.
"""
import collections
import json
import re
import sys

# The Qwen2 pre-tokenizer pattern as tokenizer.json stores it (and llama.cpp's "qwen2").
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# The same with Python `re` classes: letter = [^\W\d_], digit = \d, "not letter/number" =
# [^\w]|_ (\w is letters, digits and underscore).
PATTERN_RE = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = ["<|endoftext|>"]


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable code points."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_MAP = bytes_to_unicode()


def pretokenize(text):
    return PATTERN_RE.findall(text)


def word_symbols(word):
    return tuple(BYTE_MAP[b] for b in word.encode("utf-8"))


def train(text, vocab_size, log=sys.stderr):
    """Return (merges, vocab) with len(vocab) == vocab_size (specials included, last)."""
    if any(ord(c) > 127 for c in text):
        raise SystemExit("bpe.py train: the corpus must be ASCII (see the module comment)")
    n_merges = vocab_size - 256 - len(SPECIALS)
    if n_merges < 0:
        raise SystemExit("vocab size too small")
    counts = collections.Counter(pretokenize(text))
    words = [list(word_symbols(w)) for w in counts]
    freqs = [counts[w] for w in counts]
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for i, (syms, f) in enumerate(zip(words, freqs)):
        for a, b in zip(syms, syms[1:]):
            pair_count[(a, b)] += f
            where[(a, b)].add(i)
    merges = []
    # different merge paths can build the same string ("a"+"bc", "ab"+"c"): such a merge adds no
    # token, so count tokens, not merges
    seen = set(BYTE_MAP.values())
    step = 0
    while len(seen) - 256 < n_merges:
        step += 1
        if not pair_count:
            break
        best = min(pair_count.items(), key=lambda kv: (-kv[1], kv[0]))
        if best[1] < 2:
            break
        a, b = best[0]
        merged = a + b
        merges.append((a, b))
        seen.add(merged)
        for i in list(where.pop((a, b), ())):
            syms, f = words[i], freqs[i]
            # remove the old pairs of this word, merge, add the new pairs
            for p in zip(syms, syms[1:]):
                pair_count[p] -= f
                if pair_count[p] <= 0:
                    del pair_count[p]
                if p != (a, b):
                    where[p].discard(i)
            out, j = [], 0
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == a and syms[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                pair_count[p] += f
                where[p].add(i)
        if log and step % 500 == 0:
            print("bpe: %d merges, last %r (count %d)" % (step, merged, best[1]), file=log)
    vocab = {}
    for bt in range(256):
        vocab[BYTE_MAP[bt]] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    for s in SPECIALS:
        vocab[s] = len(vocab)
    return merges, vocab


class Encoder:
    def __init__(self, merges, vocab, specials=SPECIALS):
        self.ranks = {tuple(m): i for i, m in enumerate(merges)}
        self.vocab = vocab
        self.specials = {s: vocab[s] for s in specials if s in vocab}
        self.cache = {}

    def _bpe(self, word):
        syms = list(word_symbols(word))
        while len(syms) > 1:
            best, best_rank = -1, None
            for j in range(len(syms) - 1):
                r = self.ranks.get((syms[j], syms[j + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = j, r
            if best < 0:
                break
            syms[best:best + 2] = [syms[best] + syms[best + 1]]
        return [self.vocab[s] for s in syms]

    def encode(self, text, parse_special=True):
        ids = []
        parts = [text]
        if parse_special and self.specials:
            pat = "(" + "|".join(re.escape(s) for s in self.specials) + ")"
            parts = re.split(pat, text)
        for part in parts:
            if part in self.specials:
                ids.append(self.specials[part])
                continue
            for w in pretokenize(part):
                got = self.cache.get(w)
                if got is None:
                    got = self._bpe(w)
                    if len(self.cache) < 1_000_000:
                        self.cache[w] = got
                ids.extend(got)
        return ids

    def decode(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        unmap = {c: b for b, c in BYTE_MAP.items()}
        out = bytearray()
        for i in ids:
            s = inv[i]
            if s in self.specials:
                out += s.encode()
            else:
                out += bytes(unmap[c] for c in s)
        return out.decode("utf-8", errors="replace")


def tokenizer_json(merges, vocab):
    """HF tokenizers' serialization of a Qwen2-style byte-level BPE."""
    added = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in SPECIALS]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            dict(bl)]},
        "post_processor": dict(bl),
        "decoder": dict(bl),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False,
                  "vocab": {s: i for s, i in vocab.items() if s not in SPECIALS},
                  "merges": [[a, b] for a, b in merges]},
    }


def tokenizer_config(vocab):
    eos = SPECIALS[0]
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": eos,
        "pad_token": eos,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": {str(vocab[s]): {"content": s, "lstrip": False, "normalized": False,
                                                 "rstrip": False, "single_word": False, "special": True}
                                 for s in SPECIALS},
    }


def load(path):
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in tj["model"]["merges"]]
    vocab = dict(tj["model"]["vocab"])
    for t in tj["added_tokens"]:
        vocab[t["content"]] = t["id"]
    return Encoder(merges, vocab, [t["content"] for t in tj["added_tokens"]])


def save(out_dir, merges, vocab):
    import os
    os.makedirs(out_dir, exist_ok=True)
    with open(out_dir + "/tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(merges, vocab), f, ensure_ascii=False)
    with open(out_dir + "/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(vocab), f, ensure_ascii=False, indent=1)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "train":
        with open(sys.argv[2], encoding="utf-8") as f:
            text = f.read()
        merges, vocab = train(text, int(sys.argv[3]))
        save(sys.argv[4], merges, vocab)
        print("bpe: %d merges, vocabulary %d" % (len(merges), len(vocab)))
    elif len(sys.argv) == 5 and sys.argv[1] == "encode":
        import array
        enc = load(sys.argv[2])
        with open(sys.argv[3], encoding="utf-8") as f:
            ids = enc.encode(f.read())
        if max(ids) >= 1 << 16:
            raise SystemExit("token ids do not fit uint16")
        a = array.array("H", ids)
        if sys.byteorder != "little":
            a.byteswap()
        with open(sys.argv[4], "wb") as f:
            a.tofile(f)
        print("encoded %d tokens" % len(ids))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
