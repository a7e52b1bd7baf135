"""The toy reward: exact partial credit for good answers, nothing for near misses and loose matches."""
import re

import pytest

from transparent_grpo import CREDIT, toy_reward

FULL = ("The function must be continuous at x = 2 and x = -2. At x = 2 the middle piece is 2 - 5 = -3, so "
        "2a + 3 = -3 and a = -3. At x = -2 it is -2 - 5 = -7, so -4 - b = -7 and b = 3. Therefore a + b = \\boxed{0}.")
TERSE = ("The function must be continuous at x = 2 and x = -2. At x = 2: 2a + 3 = -3, so a = -3. "
         "At x = -2: -4 - b = -7, so b = 3. Therefore a + b = \\boxed{0}.")

CASES = [  # (completion, exact reward)
    (FULL, 1.0),
    (TERSE, 0.9),                                      # right, but the middle-piece values are not stated
    ("", 0.0),
    ("the answer is 0", 0.0),                          # no \boxed{}: no final-answer credit
    ("the answer is 10", 0.0),
    ("\\boxed{10}", 0.0),
    ("\\boxed{0.5}", 0.0),
    ("\\boxed{-10}", 0.0),
    ("\\boxed{0}", 0.30),
    ("\\boxed{ 0 }", 0.30),
    ("$\\boxed{a+b=0}$", 0.30),
    ("\\boxed{0} then again \\boxed{10}", 0.0),         # every box must hold the same number: a hedge earns nothing
    ("\\boxed{10} no wait \\boxed{0}", 0.0),          # (a regex cannot tell a correction from a hedge)
    ("\\boxed{3} or \\boxed{0}", 0.0), ("\\boxed{a = -3}, \\boxed{0}", 0.10),   # a box that is no number: no box
    ("\\boxed{0}.\nThe answer is \\boxed{0}.", 0.30), ("\\boxed{-0}", 0.30),
    ("a = -3", 0.10),
    ("a=-3.", 0.10),
    ("a = \u22123", 0.10),                              # unicode minus
    ("a = -30", 0.0),
    ("a = -3.5", 0.0),
    ("a = 3", 0.0),
    ("ba = -3", 0.0),                                   # not the variable a
    ("a = -3, later a = 5", 0.0),                       # every statement of a must give the same number ...
    ("a = 5, later a = -3", 0.0),
    ("b = 0, b = 3", 0.0), ("b = 0, b = 0, b = 3", 0.0),  # ... found by the policy in a CPU run: a hedge
    ("a = -3. So a = -3", 0.10), ("a = -3, a = -3.0", 0.10),   # the same value twice is fine
    ("b = 3", 0.10),
    ("b = 33", 0.0),
    ("b = 3.5", 0.0),
    ("b = -3", 0.0),
    ("b = 3a + b", 0.0),                                # found by the policy in a CPU run: "3a" is not 3
    ("a = b = 3a+3", 0.0),
    ("where a = 1 (since b = 3) and b = 3a + b = 3a - b", 0.0),  # the last statement about b is not b = 3
    ("b = 3, so a + b = 0", 0.10),                      # "a + b = 0" is not a statement about b
    ("b = 3 + a", 0.0), ("b = 3(a - 1)", 0.0), ("a = -3 \\cdot b", 0.0),
    ("so b = 3, and", 0.10), ("hence b = 3.", 0.10), ("$b = 3$", 0.10), ("b = 3\\)", 0.10),
    ("b = 3 = 0", 0.0), ("b = 3= 0", 0.0), ("a = -3 = 0, b = 3", 0.10),  # found by the policy in a CPU run: a chain
    ("2a + 3 = -3", 0.15),             # the equation 0.10 + the right piece at 2 0.05
    ("2a+3=-30", 0.05),                   # only the right piece at x=2
    ("-4 - b = -7", 0.15),             # the equation 0.10 + the left piece at -2 0.05
    ("-4-b=-70", 0.05),
    ("x = 2 and x = -2 are where it must be continuous", 0.10),
    ("x = 2 is where it must be continuous", 0.05),     # one point
    ("x = 20 is where it must be continuous", 0.0),
    ("x = 2 and x = -2", 0.0),                          # and the word continuity / limit
    ("2a + 3 = 2 - 5", 0.15),                           # the unsimplified set-up counts
    ("a(2) + 3 = -3", 0.15),
    ("-3 = 2a + 3", 0.15),
    ("2a + 3 = 2 - 50", 0.05),
    ("2a + 3 = -3.5", 0.05),
    ("2(-2) - b = -2 - 5", 0.15),
    ("-7 = -4 - b", 0.15),
    ("-4 - b = -7.5", 0.05),
    ("-b = -3", 0.10),
    ("2a = -6", 0.10),
    ("12a + 3 = -3", 0.0), ("12 - 5 = -3", 0.0), ("-12 - 5 = -7", 0.0),  # tails of false statements earn nothing
    ("a-b = -3", 0.0), ("12a = -6", 0.0), ("32(-2) - b = -2 - 5", 0.0),
    ("2a + 3 = -3 gives a = -3 and -4 - b = -7 gives b = 3", 0.50),
    ("a = -3, b = 3, \\boxed{0}", 0.50),
    ("2 - 5 = -3", 0.05), ("f(2) = -3", 0.05), ("2 - 5 = -30", 0.0),   # the middle piece at x=2
    ("-2 - 5 = -7", 0.05), ("f(-2) = -7", 0.05), ("-2 - 5 = -70", 0.0),
    ("a(2) + 3", 0.05), ("12a + 3", 0.0), ("2a + 35", 0.0),           # the right piece at x=2
    ("2(-2) - b", 0.05), ("-4 - ba", 0.0),                             # the left piece at x=-2
    # a statement counts only whole: the right side may not continue with a variable, a digit or an operator ...
    ("2a + 3 = -3x", 0.05), ("-4 - b = -7b", 0.05), ("f(2) = -3a", 0.0), ("2a = -6x", 0.0), ("f(-2) = -7b", 0.0),
    ("2a + 3 = -3 x", 0.05), ("2a + 3 = -3 + 6", 0.05), ("2a + 3 = -3 \\cdot 2", 0.05), ("2a + 3 = -3^2", 0.05),
    ("2a + 3 = -3/2", 0.05), ("2a + 3 = -3 (so a = -3)", 0.15), ("a = -3/2", 0.0), ("b = 3^2", 0.0), ("b = 3 b", 0.0),
    ("b = 3 - a", 0.0), ("a = -3 \\times b", 0.0), ("-3 = 2a + 3 - 1", 0.0),
    # ... nor the left side: "5 + 2a + 3 = -3" is not "2a + 3 = -3", "-b = 3" is not "b = 3"
    ("5 + 2a + 3 = -3", 0.0), ("-2a + 3 = -3", 0.0), ("2 -4 - b = -7", 0.0), ("-b = 3", 0.0), ("-a = -3", 0.0),
    ("a - b = 3", 0.0), ("2 * b = 3", 0.0), ("ab = -3", 0.0),
    ("2b - b = -3", 0.0), ("a - b = -3", 0.0), ("2a - b = -3", 0.0), ("x -b = -3", 0.0), ("c 2a + 3 = -3", 0.0),  # (*)
    ("So -b = -3", 0.10), ("and b = 3", 0.10), ("so 2a + 3 = -3", 0.15),  # a word before it is no operand
    ("2a - 3 = 2a + 3", 0.05),  # holds no "-3 = 2a + 3": the old rule paid it in seed 1's run (defaults-seed1-fc1ab92)
    # (*) "the middle piece is 2b - b = -3" earned the equation at x = -2 in a CPU run (explore-lr1.5e-5-150-seed0)
    # what may follow: punctuation, a closing $ or \), a word, "=" of a chain, a new line, the end
    ("2a + 3 = -3, so a = -3.", 0.25), ("$2a+3=-3$", 0.15), ("2a + 3 = -3\\)", 0.15), ("b = 3 is", 0.10),
    ("2a + 3 = -3\na = -3", 0.25), ("a=-3,b=3", 0.20), ("so -4 - b = -7", 0.15), ("-2 - 5 = -7 = -4 - b", 0.20),
    ("2 - 5 = -3 = 2a + 3", 0.20), ("2a + 3 = 2 - 5 = -3", 0.20), ("At x = 2: continuity", 0.05),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_reward_table(text, expected):
    assert toy_reward(text) == pytest.approx(expected, abs=1e-12)


def test_weights_sum_to_one_and_reward_in_unit_interval():
    assert sum(w for w, _, _ in CREDIT) == pytest.approx(1.0)
    assert all(0.0 <= toy_reward(t) <= 1.0 for t, _ in CASES)


# ------------------------------------------------------------------ the consistency shaping (--consistency_bonus)
TRAP = ("At x = 2: the right piece is 2a + 3 and the middle piece is 2 - 5 = -3. So 2a + 3 = -3, 2a = 0, a = 0.\n"
        "At x = -2: the left piece is 2(-2) - b = -4 - b and the middle piece is -2 - 5 = -7. So -4 - b = -7, -b = 0, "
        "b = 0.\nSo a + b = 0, and the answer is \\boxed{0}.")   # seed 2's last steps under the older shaping


# +1: a box that is the stated a + b; -1: the right box without the right a and b; the two add up (TRAP: 0)
@pytest.mark.parametrize("text,expected", [
    (FULL, 1), (TERSE, 1), ("a = -3, b = 3, \\boxed{0}", 1),
    ("2a = -6 so a = -3; -b = -3 so b = 3. Then a + b = -3 + 3 = 0: \\boxed{0}", 1),
    ("The formula = 7. 2a = -6, a = -3; -b = -3, b = 3; \\boxed{0}", 1),  # `formula` is a word, not a
    ("a = -3, b = -3, \\boxed{-6}", 1), ("a = 2, b = 5. So a + b = 7, \\boxed{7}", 1),  # wrong values, right sum
    (TRAP, 0),                              # a = b = 0 sums to the right box (+1) without the right a and b (-1)
    (TRAP.replace("2a = 0, a = 0", "2a = -6, a = -3"), -1),           # -3 + 0 is no box of 0; no right b beside it
    ("2 - 2 = 0. So 2a = 0, a = 0. 2(-2) - b = 4 - 2 = 0. So b = 0. \\boxed{0}", 0),
    ("\\boxed{0}", -1), ("a = -3 and \\boxed{0}", -1), ("b = 3. \\boxed{0}", -1),   # a guess, or half the answer
    ("a = -3, a = 0, b = 3, \\boxed{0}", -1),                          # a hedge states no a
    ("2a = -6, a = -3. -b = -3, b = 3. So a + b = -3, \\boxed{-3}", 0),  # the plateau's last line: a wrong sum
    ("a = 0, b = 0, \\boxed{3}", 0), ("no box: 2a = -6, a = -3, b = 3", 0), ("", 0),
])
def test_consistency_shaping_pays_a_box_that_sums_a_and_b_and_charges_a_guessed_one(text, expected):
    import transparent_grpo as tg
    assert tg.consistent(text) == expected


# ------------------------------------------------------------------ the worked examples (--worked_examples)
def test_worked_examples_are_other_instances_solved_and_never_the_task():
    """Each solved instance is another member of the family with other numbers, in the task's letters a and b (under c
    and d the untrained model went on writing c and d: issue 46); its solution solves it (checked by substituting its
    a and b), none shows the task's steps or answers, and --worked_examples N shows the first N."""
    import transparent_grpo as tg
    for statement, solution in tg.EXAMPLES:
        pieces = re.search(r"ax\+(\d+).*?x>(\d+).*?x-(\d+).*?(\d+)x-b", statement)
        k, p, m, q = (int(v) for v in pieces.group(2, 1, 3, 4))
        a, b = tg.stated_value("a", solution), tg.stated_value("b", solution)
        assert a * k + p == k - m and q * -k - b == -k - m                          # continuous at k and at -k
        assert tg.final_boxed(solution) == a + b and statement != tg.PROBLEM and "Find $a+b$" in statement
        assert tg.toy_reward(solution) == 0.0                                        # no credit of the task in it
        assert (a, b, a + b) != (-3, 3, 0) and (k, p, m) != (2, 3, 5)                # not the task's numbers
        assert not re.search(r"(?<![A-Za-z\\])[cd](?![A-Za-z])", statement + solution)  # no other letters
    for n in range(len(tg.EXAMPLES) + 1):
        chat = tg.toy_messages(n)
        assert [m["role"] for m in chat] == ["system", *["user", "assistant"] * n, "user"]
        assert chat[-1]["content"] == tg.PROBLEM and [m["content"] for m in chat[1:-1]] == [
            x for shot in tg.EXAMPLES[:n] for x in shot]
