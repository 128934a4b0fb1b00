#!/usr/bin/env python3
"""Clean the King James Bible text printed by Debian's `bible` program (packages bible-kjv and
bible-kjv-text; the KJV text is in the public domain, see /usr/share/doc/bible-kjv-text/copyright)
into a training corpus and a held-out set.

Input: the output of `bible -l 100000 Gen1:1-Rev22:21` (chapter headings, then one numbered verse
per line). Output format, one file each for training and held-out text:

    Genesis 1
    In the beginning God created the heaven and the earth.
    ...
    <blank line between chapters>

Every HOLDOUT_EVERY-th chapter (counting from the HOLDOUT_OFFSET-th) goes to the held-out file
(perplexity reports), and as many others (from VALID_OFFSET) to a validation file (early stopping
during training), so both span the whole book rather than its last pages. Deterministic.

usage: make_corpus.py BIBLE_OUTPUT.txt OUT_DIR
"""
import re
import sys

HOLDOUT_EVERY = 40
HOLDOUT_OFFSET = 17
VALID_OFFSET = 37


def chapters(lines):
    """Yield (heading, [verse texts]) in order."""
    heading, verses = None, []
    for raw in lines:
        line = raw.rstrip("\n").rstrip()
        if not line.strip():
            continue
        m = re.match(r"^\s+(\d+)\s+(.*)$", line)
        if m:
            if heading is None:
                raise SystemExit("verse before the first chapter heading: %r" % line[:60])
            verses.append(re.sub(r"\s+", " ", m.group(2)).strip())
        else:
            if heading is not None:
                yield heading, verses
            heading, verses = line.strip(), []
    if heading is not None:
        yield heading, verses


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], encoding="ascii") as f:
        chs = list(chapters(f))
    if len(chs) != 1189:
        raise SystemExit("expected the 1189 chapters of the KJV, found %d" % len(chs))
    train, valid, held = [], [], []
    for i, (head, verses) in enumerate(chs):
        block = head + "\n" + "\n".join(verses) + "\n"
        k = i % HOLDOUT_EVERY
        (held if k == HOLDOUT_OFFSET else valid if k == VALID_OFFSET else train).append(block)
    out = sys.argv[2]
    for name, blocks in (("train.txt", train), ("valid.txt", valid), ("heldout.txt", held)):
        with open(out + "/" + name, "w", encoding="ascii", newline="\n") as f:
            f.write("\n".join(blocks))
    print("chapters: %d train, %d validation, %d held out" % (len(train), len(valid), len(held)))


if __name__ == "__main__":
    main()
