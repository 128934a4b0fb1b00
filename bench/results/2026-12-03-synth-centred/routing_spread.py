#!/usr/bin/env python3
"""Distinct experts each layer chose over a trace's decode positions (pos >= first), and the
counts of the most chosen ones: routing_spread.py TRACE [first]. Format: docs/trace-format.md."""
import struct, sys
from collections import defaultdict
d = open(sys.argv[1], 'rb').read()
first = int(sys.argv[2]) if len(sys.argv) > 2 else 0
n_layer, n_expert, k = struct.unpack_from('<III', d, 12)
rb = 8 + 4 * k
uses = defaultdict(lambda: defaultdict(int))
steps = defaultdict(int)
for off in range(struct.unpack_from('<I', d, 8)[0], len(d), rb):
    layer, seq, pos = struct.unpack_from('<HHI', d, off)
    if pos < first:
        continue
    steps[layer] += 1
    for e in struct.unpack_from('<%dH' % k, d, off + 8):
        uses[layer][e] += 1
print('layer steps distinct most-chosen-counts')
for layer in sorted(uses):
    top = sorted(uses[layer].values(), reverse=True)[:10]
    print(layer, steps[layer], len(uses[layer]), top)
