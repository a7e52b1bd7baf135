"""Probe (issue 9): would exact speculative sampling with prompt-lookup drafts make the CPU rollout faster?

    python tests/speculative_probe.py            # the bundled SmolLM2-135M, the CPU preset's prompts, G = 8

Speculative sampling with a draft that proposes one token per position (no draft model: the k tokens that followed
the last earlier occurrence of the row's last n-gram, in the prompt, the row's own text or the previous group's
completions) is exact in its simplest form: run prefix + draft through the model in one forward, sample y_i ~
softmax(logits_i / T) at every position, and keep y_1 .. y_(j+1), where j is the length of the run of positions at
which y_i equals the draft token. (P(accept) = p(d), and a rejected position's y is p with d removed, renormalised:
the textbook residual max(p - q, 0) for a one-hot q.) It pays only if the tokens a forward yields outnumber the cost
of a forward of k + 1 tokens per row in units of a 1-token decode step. This probe measures both:
  1. the cost: one decode forward of 8 rows with 1 .. 16 tokens each, after the 420-token prompt and 100 tokens;
  2. the yield: 8 rows x 192 tokens sampled by the rule above, per prompt, temperature, k and draft corpus, as
     positions per forward when all rows advance together (by the shortest run: one KV cache length), and the mean
     run + 1 per row of those same forwards (an estimate, not a run, of what a ragged cache, one length per row, would
     keep: its drafts would come from other prefixes).
Not collected by pytest. The README (Performance, CPU) quotes its output.
"""
import argparse, functools, os, sys, time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import transparent_grpo as tg  # noqa: E402


def lookup_draft(seq, k, ngram=3):  # [L] -> up to k tokens: what followed the last earlier match of the last n-gram
    for n in range(ngram, 0, -1):
        if len(seq) > n:
            hit = (seq.unfold(0, n, 1)[:-1] == seq[-n:]).all(1).nonzero()          # [hits, 1]
            if len(hit):
                return seq[hit[-1, 0] + n:hit[-1, 0] + n + k]
    return seq[:0]


@torch.inference_mode()
def speculative(model, prompt, n, T, max_new, eos, k, corpus):
    """n rows sampled exactly by the rule above, advancing together: (positions per forward, mean run + 1 per row)."""
    out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.layers = [tg.InPlaceKV(layer, n, max_new + k + 1) for layer in cache.layers]
    rows = [[int(y)] for y in torch.multinomial(torch.softmax(out.logits[0, -1] / T, -1).expand(n, -1), 1)[:, 0]]
    live, advances, row_runs = list(range(n)), [], []
    while True:
        keep = [i for i, r in enumerate(live) if rows[r][-1] not in eos and len(rows[r]) < max_new]
        if len(keep) < len(live):
            cache.batch_select_indices(torch.tensor(keep, dtype=torch.long))
            live = [live[i] for i in keep]
        if not live:
            break
        drafts = [lookup_draft(torch.cat([corpus, prompt[0], torch.tensor(rows[r])]), k) for r in live]
        kk = min([len(d) for d in drafts] + [max_new - len(rows[r]) - 1 for r in live])
        d = torch.stack([x[:kk] for x in drafts])                                        # [live, kk]
        x = torch.cat([torch.tensor([[rows[r][-1]] for r in live]), d], 1)               # [live, 1 + kk]
        n_cached = cache.layers[0].len
        logits = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=kk + 1).logits
        y = torch.multinomial(torch.softmax(logits.float() / T, -1).flatten(0, 1), 1).view(len(live), kk + 1)
        run = (y[:, :kk] == d).int().cumprod(1).sum(1)                                   # [live] accepted drafts
        j = int(run.min())
        for i, r in enumerate(live):
            new = y[i, :j + 1].tolist()
            ends = [t for t, tok in enumerate(new) if tok in eos]
            rows[r] += new[:ends[0] + 1] if ends else new
        for layer in cache.layers:                                                       # keep j + 1 new positions
            layer.len = n_cached + j + 1
            layer.batch_select_indices(slice(None))
        advances.append(j + 1)
        row_runs += (run + 1).tolist()
    return sum(advances) / len(advances), sum(row_runs) / len(row_runs), rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max_new_tokens", type=int, default=192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    tok, model = tg.load_model("bundled:", torch.float32)
    model.eval()
    eos = tg.eos_ids(tok, model)
    prompt = lambda task: tok.apply_chat_template(tg.toy_messages(True, task), add_generation_prompt=True,
                                                  return_tensors="pt", return_dict=True)["input_ids"]
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {os.cpu_count()} cores")

    print("## 1. cost of one decode forward, 8 rows, after 420 + 100 positions (median of 5)")
    ids, linears = prompt("main"), [m for m in model.modules() if type(m) is torch.nn.Linear]
    with torch.inference_mode():
        cache = model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
        cache.layers = [tg.InPlaceKV(layer, 8, 200) for layer in cache.layers]
        model(input_ids=torch.randint(0, 1000, (8, 100)), past_key_values=cache, use_cache=True, logits_to_keep=1)
        n_cached, cost = cache.layers[0].len, {}
        for weight_major in (True, False):
            for m in linears if weight_major else []:                                   # as --sampler fast decodes
                m.forward = functools.partial(tg.weight_major_linear, m)
            for j in (1, 2, 4, 8, 12, 16):
                times = []
                for _ in range(5):
                    for layer in cache.layers:
                        layer.len = n_cached
                        layer.batch_select_indices(slice(None))
                    t0 = time.perf_counter()
                    model(input_ids=torch.randint(0, 1000, (8, j)), past_key_values=cache, use_cache=True,
                          logits_to_keep=j)
                    times.append(time.perf_counter() - t0)
                cost[weight_major, j] = sorted(times)[2]
            for m in linears:
                vars(m).pop("forward", None)
        best1 = min(cost[True, 1], cost[False, 1])
        for j in (1, 2, 4, 8, 12, 16):
            print(f"{j:2d} tokens/row: W @ x.T {cost[True, j] * 1e3:6.1f} ms, F.linear {cost[False, j] * 1e3:6.1f} ms;"
                  f" break-even: {min(cost[True, j], cost[False, j]) / best1:.2f} tokens per forward")

    print(f"## 2. yield of exact speculative sampling, prompt-lookup drafts (8 rows x {args.max_new_tokens} tokens)")
    for task in ("main", "left"):
        ids = prompt(task)
        for T in (0.8, 0.3):
            torch.manual_seed(args.seed)
            previous = tg.sample(model, ids, 8, tg.replace(tg.parse_config([], cuda=False), temperature=T,
                                 max_new_tokens=args.max_new_tokens), eos, tok.pad_token_id)[:, ids.shape[1]:]
            for k in (3, 7):
                for name, corpus in (("prompt + own text", ids[0, :0]), ("+ previous group", previous.flatten())):
                    torch.manual_seed(args.seed + 1)
                    together, ragged, rows = speculative(model, ids, 8, T, args.max_new_tokens, eos, k, corpus)
                    even = min(cost[True, k + 1], cost[False, k + 1]) / best1
                    print(f"{task:4s} T={T} k={k} {name:18s}: {together:.2f} positions per forward together, "
                          f"{ragged:.2f} per row ragged (break-even {even:.2f}); "
                          f"mean length {sum(map(len, rows)) / len(rows):.0f}", flush=True)


if __name__ == "__main__":
    main()
