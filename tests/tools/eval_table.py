"""Held-out accuracy of runs at their first and last evaluation, one row a run (the 0.5B sweep's table).

    python tests/tools/eval_table.py logs/qwen05b/sweep-seed*.eval.jsonl > logs/qwen05b/sweep10-table.md
"""
import gzip, json, os, re, sys

CREDITS = ("a", "f(-k)", "eq(-k)", "b")


def main(paths):
    gains = []
    print("command: python tests/tools/eval_table.py " + " ".join(paths), "",
          "| run | right of N, first → last evaluation | points | held-out reward | "
          + " | ".join(CREDITS) + " | s a step | peak RSS GB | minutes (steps + evaluations) |",
          "|---" * (7 + len(CREDITS)) + "|",
          sep="\n")
    for path in paths:
        evals = [json.loads(line) for line in open(path) if line.strip()]
        log = path.replace(".eval.jsonl", ".jsonl")
        log = log if os.path.exists(log) else log + ".gz"                    # committed logs are gzipped
        with gzip.open(log, "rt") if log.endswith(".gz") else open(log) as f:
            steps = [json.loads(line) for line in f if line.strip()]
        if len(evals) < 2:
            continue
        a, b, n = evals[0], evals[-1], evals[0]["eval/n"]
        t = [s["time/step"] for s in steps if "time/step" in s]
        gains.append(100 * (b["eval/accuracy"] - a["eval/accuracy"]))
        pct = lambda e, k: f'{100 * e["eval/credit/" + k]:.0f}'
        credit = " | ".join(f"{pct(a, k)} → {pct(b, k)} %" for k in CREDITS)
        print(f'| {re.sub(r"[.]eval[.]jsonl$", "", path.split("/")[-1])} | {round(a["eval/accuracy"] * n)} → '
              f'{round(b["eval/accuracy"] * n)} of {n} (steps {a["step"]} → {b["step"]}) | {gains[-1]:+.1f} | '
              f'{a["eval/reward"]:.3f} → {b["eval/reward"]:.3f} | {credit} | {sum(t) / len(t):.0f} | '
              f'{max(s.get("perf/peak_mem_gb", 0) for s in steps):.1f} | '
              f'{(sum(t) + sum(e["eval/time"] for e in evals)) / 60:.1f} |')
    print(f"\n{len(gains)} runs; the last evaluation beats the first by >= 25 points on {sum(g >= 25 for g in gains)}, "
          f"by > 0 on {sum(g > 0 for g in gains)}; mean {sum(gains) / max(len(gains), 1):+.1f} points")


if __name__ == "__main__":
    main(sys.argv[1:])
