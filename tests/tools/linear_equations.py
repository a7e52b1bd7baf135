"""Writes tests/data/linear-equations.jsonl: an example file for `--task`, two-step linear equations a x + b = c.

    python tests/tools/linear_equations.py            # 300 rows, the same file on every machine (seed 0)

Each row: {"prompt", "answer", "system", "examples"}; the two worked examples are no row's equation."""
import json
import os
import random

SYSTEM = ("You are a helpful assistant. Solve the math problem step by step, "
          "then give the final answer as \\boxed{answer}.")


def equation(a, b, c):  # "3x + 5 = 20", "4x - 7 = 13"
    return f"Solve for x: {a}x {'+-'[b < 0]} {abs(b)} = {c}."


def solution(a, b, c):
    move = f"Subtract {b} from both sides" if b > 0 else f"Add {-b} to both sides"
    return (f"{move}: {a}x = {c - b}.\nDivide both sides by {a}: x = {(c - b) // a}.\n"
            f"The answer is \\boxed{{{(c - b) // a}}}.")


EXAMPLES = [(4, -7, 13), (6, 11, -1)]                          # x = 5 and x = -2


def rows(n=300, seed=0):
    rng, seen, out = random.Random(seed), set(EXAMPLES), []
    while len(out) < n:
        a, x, b = rng.randint(2, 9), rng.randint(-10, 10), rng.choice([v for v in range(-20, 21) if v])
        if (a, b, a * x + b) in seen:
            continue
        seen.add((a, b, a * x + b))
        out.append({"prompt": equation(a, b, a * x + b), "answer": x, "system": SYSTEM,
                    "examples": [[equation(*e), solution(*e)] for e in EXAMPLES]})
    return out


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(__file__), "..", "data", "linear-equations.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows())
    print(f"wrote {os.path.normpath(path)}")
