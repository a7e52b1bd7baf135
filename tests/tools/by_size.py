"""Are small numbers easier? Each credit's rate over a family run's training samples, early (steps 0-6) and late (the
last 7 steps), for instances whose numbers (|a|, |b|, m, c) are all at most N, and for the others.

    python tests/tools/by_size.py logs/generalise-sweep/sweep-family-seed?.jsonl.gz          # N = 7

Reads each <run>.jsonl or .jsonl.gz (its `instances`) beside its <run>.samples.jsonl.gz (the completions, from --log_samples) and
scores the completions again with the instance's credit table.
"""
import argparse, collections, gzip, json, os, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import transparent_grpo as tg  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="<run>.jsonl(.gz) step logs of --task family runs with --log_samples")
    ap.add_argument("--max_number", type=int, default=7)
    args = ap.parse_args()
    print("command: python tests/tools/by_size.py " + " ".join(sys.argv[1:]))
    rows = collections.defaultdict(list)
    for path in (p for p in args.runs if not p.endswith(".samples.jsonl.gz")):
        steps = [json.loads(line) for line in (gzip.open if path.endswith(".gz") else open)(path)]
        samples = {r["step"]: r for r in map(json.loads, gzip.open(path.split(".jsonl")[0] + ".samples.jsonl.gz"))}
        last = steps[-1]["step"]
        for row in steps:
            phase = "early" if row["step"] < 7 else "late" if row["step"] > last - 7 else None
            if phase is None:
                continue
            texts = samples[row["step"]]["text"]
            per = len(texts) // len(row["instances"])                  # a group of completions per instance
            for g, numbers in enumerate(row["instances"]):
                p = tg.Piecewise(**numbers)
                size = "small" if max(abs(p.a), abs(p.b), p.m, p.c) <= args.max_number else "other"
                rows[phase, size] += [tg.credits(t, p) for t in texts[g * per:(g + 1) * per]]
    names = ["f(k)", "f(-k)", "eq(k)", "a", "eq(-k)", "b", "boxed"]
    print(f"{'phase':<6} {'numbers':<8} {'samples':>7} {'reward':>6} " + " ".join(f"{n:>6}" for n in names))
    for (phase, size), r in sorted(rows.items()):
        rates = [sum(c[n] > 0 for c in r) / len(r) for n in names]
        print(f"{phase:<6} {('<= %d' % args.max_number) if size == 'small' else 'other':<8} {len(r):>7} "
              f"{sum(sum(c.values()) for c in r) / len(r):>6.3f} " + " ".join(f"{x:>6.3f}" for x in rates))


if __name__ == "__main__":
    main()
