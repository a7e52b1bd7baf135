"""Base rates of an untrained model on the family's held-out instances: what RL has to work with.

    python tests/tools/base_rates.py --model "$(python tests/tools/qwen_coder_05b.py)" --n 64 --k 16

For the first --n held-out instances (the order --eval_size uses) and the prompt a run would show (--worked_examples):
the greedy completion's accuracy, reward and credit rates (what the training's evaluation reports at step 0), then --k
samples of each at --temperature: the mean accuracy, pass@j for j = 1, 2, 4, ..., k (the unbiased estimator
1 - C(n-c, j) / C(n, j) from the k samples), how many instances are ever right, each credit's rate and the length and
truncation of the samples. RL mostly turns what a model sometimes samples into what it does greedily: an instance
that no sample gets right is unlikely to be learned. The samples use generate_many, the sampler the evaluation uses.
"""
import argparse, json, math, os, sys, time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import transparent_grpo as tg  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled:")
    ap.add_argument("--n", type=int, default=64, help="held-out instances (the first n of HELD_OUT)")
    ap.add_argument("--k", type=int, default=16, help="samples an instance at --temperature (0: greedy only)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max_new_tokens", type=int, default=256)
    ap.add_argument("--worked_examples", type=int, default=2)
    ap.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"], help="bf16: what --dtype amp samples from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write every completion here (.jsonl)")
    args = ap.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    print("command: " + " ".join(sys.argv), flush=True)
    t0 = time.time()
    tok, model = tg.load_model(args.model, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    model.eval()
    eos, pad = tg.eos_ids(tok, model), tok.pad_token_id
    print(f"loaded in {time.time() - t0:.0f} s; eos {eos}, pad {pad}", flush=True)
    cfg = tg.Config(worked_examples=args.worked_examples, max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature)
    task = tg.TASKS["family"](cfg)
    held = task.held_out[:args.n]
    prompts = [tok.apply_chat_template(task.messages(x), add_generation_prompt=True, return_tensors="pt",
                                       return_dict=True)["input_ids"][0] for x in held]
    print(f"{len(held)} held-out instances; prompt tokens {min(map(len, prompts))}-{max(map(len, prompts))}")
    names = [name for _, name, _ in tg.credit_table(held[0])]
    out = open(args.out, "w") if args.out else None

    def report(label, texts, tokens, rows):
        mask, cut = tg.completion_mask(tokens, eos)
        right = [bool(task.correct(t, x)) for t, x in zip(texts, rows)]
        scores = [task.score(t, x) for t, x in zip(texts, rows)]
        rate = {k: sum(s[k] > 0 for s in scores) / len(scores) for k in names}
        print(f"{label}: accuracy {sum(right) / len(right):.3f} ({sum(right)} of {len(right)}) | reward "
              f"{sum(sum(s.values()) for s in scores) / len(scores):.3f} | len {mask.sum(1).float().mean():.0f} | "
              f"truncated {cut.float().mean():.2f} | " + " ".join(f"{k} {v:.2f}" for k, v in rate.items()),
              flush=True)
        if out:
            for t, x, r in zip(texts, rows, right):
                out.write(json.dumps({"label": label, "instance": [x.k, x.c, x.m, x.s], "right": r, "text": t}) + "\n")
        return right

    t0 = time.time()
    tokens = tg.generate_many(model, prompts, 1, cfg, eos, pad, greedy=True)
    texts = tg.decode(tok, tokens, eos)[0]
    report(f"greedy ({time.time() - t0:.0f} s)", texts, tokens, held)
    if args.k:
        torch.manual_seed(args.seed)
        t0 = time.time()
        tokens = tg.generate_many(model, prompts, args.k, cfg, eos, pad)
        texts = tg.decode(tok, tokens, eos)[0]
        rows = [x for x in held for _ in range(args.k)]
        right = torch.tensor(report(f"T={args.temperature}, {args.k} each ({time.time() - t0:.0f} s)", texts, tokens,
                                    rows)).view(-1, args.k)
        c, n = right.sum(1).tolist(), args.k
        js = [j for j in (1, 2, 4, 8, 16, 32, 64) if j <= n]
        pass_at = {j: sum(1 - math.comb(n - ci, j) / math.comb(n, j) for ci in c) / len(c) for j in js}
        print("pass@j (unbiased, from the k samples): " + " | ".join(f"pass@{j} {v:.3f}" for j, v in pass_at.items()))
        print(f"instances ever right: {sum(ci > 0 for ci in c)} of {len(c)}; right samples per instance: {c}")
        print(json.dumps({"args": vars(args), "pass_at": pass_at, "right_per_instance": c}))


if __name__ == "__main__":
    main()
