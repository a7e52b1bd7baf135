"""A candidate for issue 46, not the default: the trainer with its two worked examples (EXAMPLES) written in the task's
letters a and b (the same instances and numbers: a = -8, b = 6, sum -2; a = -5, b = 7, sum 2). Under the defaults'
letters c and d, 44 % of the untrained model's samples write `c + d = ...` (seeds 8 and 14 keep it and fail).

    python tests/tools/letters_ab.py --seed 8 [any flag of transparent_grpo.py]
    python tests/tools/letters_ab.py --step0 8    # the untrained model's samples under both letters, 8 groups of 16
    python tests/tools/seeds.py --seeds 8,14 --parallel 2 --script tests/tools/letters_ab.py --name ab -- --log_samples
"""
import os, re, statistics, sys, time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import transparent_grpo as tg  # noqa: E402


def in_letters_ab(text):  # c -> a, d -> b where a letter stands alone ("cx", "1c", "-d"; not "continuous", "middle")
    text = re.sub(r"(?<![A-Za-z\\])c(?![a-wyz])", "a", text)
    return re.sub(r"(?<![A-Za-z\\])d(?![a-wyz])", "b", text)


EXAMPLES_AB = [(in_letters_ab(q), in_letters_ab(a)) for q, a in tg.EXAMPLES]


def step0(groups):
    """Groups of 16 step-0 samples (T 0.8, 192 tokens, the trainer's sampler; the same seeds) after each pair of
    examples: the mean reward, each credit's share, how many run out of tokens, write c or d, and copy an example's
    values (a rough pattern: a or b stated as one of -8, 6, -5, 7, or either example's sum line)."""
    torch.set_num_threads(os.cpu_count() or 1)
    tok, model = tg.load_model("bundled:", torch.float32)
    model.eval()
    eos = tg.eos_ids(tok, model)
    cfg = SimpleNamespace(temperature=0.8, max_new_tokens=192, sampler="fast")  # what sample() reads
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    for name, examples in (("cd (the defaults)", list(tg.EXAMPLES)), ("ab", EXAMPLES_AB)):
        tg.EXAMPLES[:] = examples
        ids = tok.apply_chat_template(tg.toy_messages(2), add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]                    # [1, P]
        texts, truncated, t0 = [], 0, time.time()
        for g in range(groups):
            torch.manual_seed(1000 + g)
            with torch.no_grad():
                completions = tg.sample(model, ids, 16, cfg, eos, pad)[:, ids.shape[1]:]  # [16, T]
            mask, cut = tg.completion_mask(completions, eos)
            truncated += int(cut.sum())
            texts += [tok.decode(row[:int(m.sum())], skip_special_tokens=True) for row, m in zip(completions, mask)]
        R, got, n = [tg.toy_reward(t) for t in texts], [tg.credits(t) for t in texts], len(texts)
        cd = sum(bool(re.search(r"(?<![A-Za-z])[cd]\s*[=+]", t)) for t in texts)
        copied = sum(bool(re.search(r"-8 \+ 6|-5 \+ 7|[ab] = -8|[ab] = 6\b|[ab] = -5|[ab] = 7\b", t)) for t in texts)
        spread = statistics.mean(statistics.pstdev(R[i:i + 16]) for i in range(0, n, 16))
        print(f"{name}: prompt {ids.shape[1]} tokens, {n} samples, {time.time() - t0:.0f} s | mean reward "
              f"{statistics.mean(R):.3f} | a group's std {spread:.3f} | truncated {truncated / n:.2f} | write c or d "
              f"{cd / n:.2f} | copy an example's values {copied / n:.2f}")
        print("  " + " ".join(f"{k} {sum(c[k] for c in got) / n:.2f}" for _, k, _ in tg.CREDIT), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--step0"]:
    step0(int(sys.argv[2]) if len(sys.argv) > 2 else 8)
elif __name__ == "__main__":
    tg.EXAMPLES[:] = EXAMPLES_AB  # toy_messages (§2) reads tg.EXAMPLES
    tg.main()
