"""How likely the untrained bundled SmolLM2-135M finds the correct solution after each choice of worked examples:
the teacher-forced log-probability (T = 0.8) of the solution written in the examples' form, in total and at the tokens
it finds least likely. A policy can only reinforce what it samples: the likelier the solution, the sooner it does.

    python tests/tools/example_likelihood.py
"""
import os, sys

import torch

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                os.path.dirname(os.path.abspath(__file__))]
import transparent_grpo as tg  # noqa: E402

from feasibility import TARGET  # noqa: E402  the correct solution, in the worked examples' form


def main():
    torch.set_num_threads(2)
    tok, model = tg.load_model("bundled:", torch.float32)
    model.eval()
    target = tok(TARGET, add_special_tokens=False, return_tensors="pt")["input_ids"]
    pieces = [tok.decode(t) for t in target[0]]
    first, second = tg.EXAMPLES
    for name, shots in [("zero-shot", []), ("EXAMPLES[1] alone", [second]),
                        ("EXAMPLES[0] alone (--worked_examples 1)", [first]),
                        ("EXAMPLES[1], then [0]", [second, first]),
                        ("EXAMPLES[0], then [1] (--worked_examples 2)", [first, second])]:
        chat = [{"role": "system", "content": tg.SYSTEM_PROMPT}, *[{"role": r, "content": c} for shot in shots
                for r, c in zip(("user", "assistant"), shot)], {"role": "user", "content": tg.PROBLEM}]
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        with torch.no_grad():
            z = model(input_ids=torch.cat([ids, target], 1)).logits[0, ids.shape[1] - 1:-1].float() / 0.8
        lp = z.log_softmax(-1).gather(-1, target[0, :, None])[:, 0]                    # [T] log p(y_t)
        worst = sorted(range(len(lp)), key=lambda i: lp[i])[:5]
        print(f"{name:45s} prompt {ids.shape[1]:4d} tokens | log p(solution) {lp.sum():7.2f} | least likely: "
              + ", ".join(f"{pieces[i]!r}@{i} {lp[i]:.1f}" for i in sorted(worst)), flush=True)


if __name__ == "__main__":
    main()
