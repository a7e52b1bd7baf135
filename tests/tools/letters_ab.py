"""A candidate for issue 46, not the default: the trainer with its two worked examples (EXAMPLES) written in the task's
letters a and b (the same instances and numbers: a = -8, b = 6, sum -2; a = -5, b = 7, sum 2). Under the defaults'
letters c and d, 44 % of the untrained model's samples write `c + d = ...` (seeds 8 and 14 keep it and fail).

    python tests/tools/letters_ab.py --seed 8 [any flag of transparent_grpo.py]
    python tests/tools/seeds.py --seeds 8,14 --parallel 2 --script tests/tools/letters_ab.py --name ab -- --log_samples
"""
import os, re, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import transparent_grpo as tg  # noqa: E402


def in_letters_ab(text):  # c -> a, d -> b where a letter stands alone ("cx", "1c", "-d"; not "continuous", "middle")
    text = re.sub(r"(?<![A-Za-z\\])c(?![a-wyz])", "a", text)
    return re.sub(r"(?<![A-Za-z\\])d(?![a-wyz])", "b", text)


EXAMPLES_AB = [(in_letters_ab(q), in_letters_ab(a)) for q, a in tg.EXAMPLES]

if __name__ == "__main__":
    tg.EXAMPLES[:] = EXAMPLES_AB  # toy_messages (§2) reads tg.EXAMPLES
    tg.main()
