"""Per-round ratios of vm_mtp_accept.sh output: each config's decode t/s over the plain run of
the same round (the round starts with `plain`); prints min / median / max per config.
Usage: python3 ratios.py FILE..."""
import re, statistics, sys
ratios, plain = {}, None
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r"(.*?)\s+decode\s+([0-9.]+) t/s", line)
        if not m:
            continue
        cfg, tps = m.group(1).strip(), float(m.group(2))
        if cfg == "plain":
            plain = tps
            continue
        if plain:
            ratios.setdefault(cfg, []).append(tps / plain)
for cfg, r in ratios.items():
    print("%-40s rounds %2d  min %.2f  median %.2f  max %.2f  (>= 1.3: %d)" % (cfg, len(r), min(r), statistics.median(r), max(r), sum(x >= 1.3 for x in r)))
