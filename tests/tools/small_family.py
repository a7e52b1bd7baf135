"""A pilot of the "smaller numbers" lever (Does it generalise?): --task family on the instances whose numbers are all
at most N (|a|, |b|, m and c), both the training draws and the held-out set. Each is a subset of the family's own split
(by a hash of the numbers), so the two stay disjoint; the evaluation takes the first --eval_size of the small held-out.

    python tests/tools/small_family.py --max_number 7 --task family --seed 1 --eval_every 14 --eval_size 32

Every other argument goes to transparent_grpo.py; its log's first line is this command.
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import transparent_grpo as tg  # noqa: E402


def small(p, n):
    return max(abs(p.a), abs(p.b), p.m, p.c) <= n


if __name__ == "__main__":
    args = sys.argv[1:]
    n = 7
    if args[:1] == ["--max_number"]:
        n, args = int(args[1]), args[2:]
    tg.TRAIN = [p for p in tg.TRAIN if small(p, n)]          # piecewise_task reads both at the run's start
    tg.HELD_OUT = [p for p in tg.HELD_OUT if small(p, n)]
    print(f"small family (numbers <= {n}): {len(tg.TRAIN)} training instances, {len(tg.HELD_OUT)} held out",
          file=sys.stderr)
    assert not set(tg.TRAIN) & set(tg.HELD_OUT)
    tg.main(args)
