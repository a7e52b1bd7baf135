"""Do two runs give the same metrics? Every key of their first N steps but time/*, perf/* and instances, compared
exactly (the credits' names before the family, x=2, f(2), ..., read as x=k, f(k), ...). Exit 0 if all are equal. A key
only the second run logs (a metric added since) is listed as new, not as a difference; one it lost is a difference.

    python tests/tools/same_metrics.py logs/before.jsonl logs/after.jsonl --steps 3
"""
import argparse, gzip, json, sys

RENAMED = {"x=2": "x=k", "x=-2": "x=-k", "f(2)": "f(k)", "f(-2)": "f(-k)", "right(2)": "right(k)",
           "left(-2)": "left(-k)", "eq(2)": "eq(k)", "eq(-2)": "eq(-k)"}


def rows(path, n):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        out = [json.loads(ln) for ln in f if ln.strip()][:n]
    return [{("credit/" + RENAMED.get(k[7:], k[7:]) if k.startswith("credit/") else k): v for k, v in r.items()
             if not k.startswith(("time/", "perf/")) and k != "instances"} for r in out]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before"), ap.add_argument("after"), ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    a, b = rows(args.before, args.steps), rows(args.after, args.steps)
    same = len(a) == len(b) == args.steps
    for x, y in zip(a, b):
        diff = {k: (x.get(k), y.get(k)) for k in sorted(x) if x.get(k) != y.get(k)}
        new = sorted(set(y) - set(x))
        same &= not diff
        print(f"step {x.get('step')}: {len(x)} metrics, {'all equal' if not diff else f'differ: {diff}'}"
              + (f"; new in the second: {', '.join(new)}" if new else ""))
    print("same metrics" if same else "NOT the same metrics")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
