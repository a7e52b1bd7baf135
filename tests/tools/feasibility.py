"""Feasibility study: how often does the untrained bundled SmolLM2-135M earn each credit of the toy reward?

    python tests/tools/feasibility.py                 # 64 samples per (prompt, temperature), 128 new tokens, seed 0
    python tests/tools/feasibility.py --n 32 --temperatures 0.8 --examples 0,2

GRPO can only reinforce what it samples: a credit that no sample ever earns cannot be learned. For each prompt (0, 1
or 2 worked examples before the task) and sampling temperature this prints the share of samples that earn each
credit, the mean reward, and how many completions hit the token cap. It then teacher-forces the correct solution
(written in the worked examples' form) after the small recipe's two examples and lists the tokens the model finds
unlikely: those are the steps a policy must stumble on.
"""
import argparse, json, os, sys, time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import transparent_grpo as tg  # noqa: E402

TARGET = ("The function must be continuous at x = 2 and x = -2.\n"
          "At x = 2: the right piece is 2a + 3 and the middle piece is 2 - 5 = -3. So 2a + 3 = -3, 2a = -6, a = -3.\n"
          "At x = -2: the left piece is 2(-2) - b = -4 - b and the middle piece is -2 - 5 = -7. So -4 - b = -7, "
          "-b = -3, b = 3.\nSo a + b = -3 + 3 = 0, and the answer is \\boxed{0}.")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--temperatures", default="0.5,0.8,1.0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", default="0,2", help="how many worked examples before the task, e.g. 0,1,2")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    tok, model = tg.load_model("bundled:", torch.float32)
    model.eval()
    eos = tg.eos_ids(tok, model)
    names = [name for _, name, _ in tg.CREDIT]
    print("prompt | T | mean reward | truncated | mean length | " + " | ".join(names))
    for n_examples in map(int, args.examples.split(",")):
        ids = tok.apply_chat_template(tg.toy_messages(n_examples), add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        for T in map(float, args.temperatures.split(",")):
            torch.manual_seed(args.seed)
            cfg = SimpleNamespace(sampler="fast", max_new_tokens=args.max_new_tokens, temperature=T)
            t0, texts, trunc, lens = time.time(), [], 0, []
            for s in range(0, args.n, 16):
                out = tg.sample(model, ids, min(16, args.n - s), cfg, eos, tok.pad_token_id)[:, ids.shape[1]:]
                mask, truncated = tg.completion_mask(out, eos)
                texts += tok.batch_decode([c[:int(n)] for c, n in zip(out, mask.sum(1))], skip_special_tokens=True)
                trunc, lens = trunc + int(truncated.sum()), lens + mask.sum(1).tolist()
            hits = [tg.credits(t) for t in texts]
            rate = {k: sum(h[k] > 0 for h in hits) / len(hits) for k in names}          # credits(): weights earned
            mean = sum(tg.toy_reward(t) for t in texts) / len(texts)
            print(f"{n_examples} worked examples | {T} | {mean:.3f} | {trunc / len(texts):.2f} | "
                  f"{sum(lens) / len(lens):.0f} | " + " | ".join(f"{rate[k]:.2f}" for k in names) +
                  f"  ({time.time() - t0:.0f} s)", flush=True)
    # teacher forcing: the probability of each token of a correct solution, given the correct text before it
    ids = tok.apply_chat_template(tg.toy_messages(len(tg.EXAMPLES)), add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    target = tok(TARGET, add_special_tokens=False, return_tensors="pt")["input_ids"]
    x = torch.cat([ids, target], 1)
    with torch.no_grad():
        logits = model(input_ids=x).logits[0, ids.shape[1] - 1:-1]
    for T in map(float, args.temperatures.split(",")):
        p = torch.softmax(logits / T, -1).gather(-1, target[0, :, None])[:, 0]
        hard = [f"{tok.decode(target[0, :i + 1])[-14:]!r}: {p[i]:.3f}" for i in range(len(p)) if p[i] < 0.1]
        print(f"\nT = {T}: log-probability of the whole correct solution {p.log().sum():.1f} over {len(p)} tokens; "
              f"tokens below 0.1 (with the text that ends in them):\n  " + "\n  ".join(hard))
    print(json.dumps({"args": vars(args)}))


if __name__ == "__main__":
    main()
