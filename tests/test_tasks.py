"""Tasks: the piecewise family, its held-out split, the evaluation, and a user's .jsonl file (README: Does it
generalise?, Your own task)."""
import hashlib
import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch

import transparent_grpo as tg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ the family and its split
def test_the_problem_and_the_examples_are_members_of_the_family_with_their_old_text():
    assert tg.TOY in tg.FAMILY and all(p in tg.FAMILY for p in tg.SHOWN)
    assert (tg.TOY.a, tg.TOY.b, tg.TOY.answer) == (-3, 3, 0)
    assert tg.PROBLEM.startswith("Let \\[f(x) = \\left\\{\\begin{array}{cl} ax+3, &\\text{ if }x>2, \\\\ x-5 &")
    assert tg.EXAMPLES[0][1] == (
        "The function must be continuous at x = 1 and x = -1.\nAt x = 1: the right piece is 1a + 2 and the middle piece "
        "is 1 - 7 = -6. So 1a + 2 = -6, 1a = -8, a = -8.\nAt x = -1: the left piece is 2(-1) - b = -2 - b and the middle "
        "piece is -1 - 7 = -8. So -2 - b = -8, -b = -6, b = 6.\nSo a + b = -8 + 6 = -2, and the answer is \\boxed{-2}.")


def test_every_instance_is_continuous_with_integer_answers_and_its_solution_earns_everything():
    for p in tg.FAMILY:
        assert p.k * p.a + p.c == p.k - p.m and p.s * -p.k - p.b == -p.k - p.m    # continuous at k and at -k
        assert tg.toy_reward(p.solution, p) == 1.0 and tg.consistent(p.solution, p) == 1
    assert len({(p.k, p.c, p.m, p.s) for p in tg.FAMILY}) == len(tg.FAMILY) >= 500
    for field in ("k", "c", "m", "s"):                                          # every number of the statement varies
        assert len({getattr(p, field) for p in tg.FAMILY}) >= 3


def test_held_out_is_disjoint_from_every_training_draw_and_from_the_examples():
    held = set(tg.HELD_OUT)
    assert len(tg.HELD_OUT) >= 64 and not held & set(tg.TRAIN) and not held & set(tg.SHOWN) and tg.TOY not in held
    assert not set(tg.SHOWN) & set(tg.TRAIN) and tg.TOY in tg.TRAIN
    statements = {p.statement for p in tg.HELD_OUT}
    for seed in range(50):                       # draws as train() makes them, over seeds, steps and processes
        for step in range(40):
            for x in tg.draw(tg.TRAIN, 4, tg.seed_of("draw", seed, step, seed % 3)):
                assert x not in held and x.statement not in statements


def test_the_split_is_by_the_numbers_and_the_same_on_every_machine():
    """A hash of the instance's numbers, never Python's hash() or a seed offset: this digest is the split's fingerprint
    (if it changes, the held-out set changed and every earlier evaluation is on another set)."""
    names = ",".join(f"{p.k}/{p.c}/{p.m}/{p.s}" for p in tg.HELD_OUT[:64])
    assert hashlib.sha256(names.encode()).hexdigest()[:16] == FINGERPRINT
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", "import transparent_grpo as tg; print(','.join(f'{p.k}/{p.c}/{p.m}/"
                          "{p.s}' for p in tg.HELD_OUT[:64]))"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == names


FINGERPRINT = "1a9f2e1c679b6b0e"


# ------------------------------------------------------------------ the reward on other instances
OTHER = tg.Piecewise(k=3, c=4, m=11, s=2)    # a = (3-11-4)/3 = -4, b = 11-3 = 8, a+b = 4; f(3) = -8, f(-3) = -14


@pytest.mark.parametrize("text,expected", [
    (OTHER.solution, 1.0),
    (tg.TOY.solution, 0.0),                                   # the problem's solution earns nothing on another one
    ("\\boxed{0}", 0.0), ("\\boxed{4}", 0.30), ("\\boxed{4.0}", 0.30), ("\\boxed{40}", 0.0),
    ("a = -4", 0.10), ("a = -3", 0.0), ("a = -40", 0.0), ("b = 8", 0.10), ("b = 3", 0.0), ("b = 8a", 0.0),
    ("3a + 4 = -8", 0.15), ("3a + 4 = 3 - 11", 0.15), ("a(3) + 4 = -8", 0.15), ("13a + 4 = -8", 0.0),
    ("3a = -12", 0.10), ("3a = -12x", 0.0), ("2a + 3 = -3", 0.0),  # the problem's equation
    ("-6 - b = -14", 0.15), ("2(-3) - b = -3 - 11", 0.15), ("-b = -8", 0.10), ("-4 - b = -7", 0.0),
    ("3 - 11 = -8", 0.05), ("f(3) = -8", 0.05), ("-3 - 11 = -14", 0.05), ("f(-3) = -14", 0.05), ("f(3) = -80", 0.0),
    ("x = 3 and x = -3, where f is continuous", 0.10), ("x = 2 and x = -2, where f is continuous", 0.0),
    ("a = -4, b = 8, \\boxed{4}", 0.50), ("a = -4, a = 4, b = 8, \\boxed{4}", 0.40),
])
def test_the_reward_takes_its_numbers_from_the_instance(text, expected):
    assert tg.toy_reward(text, OTHER) == pytest.approx(expected, abs=1e-12)


def test_k_1_accepts_the_right_piece_without_its_1_and_only_whole():
    p = tg.SHOWN[0]                                                             # k = 1, c = 2: a + 2 = -6
    assert tg.credits("a + 2 = -6", p)["eq(k)"] == 0.10 and tg.credits("1a + 2 = -6", p)["eq(k)"] == 0.10
    assert tg.credits("2a + 2 = -6", p)["eq(k)"] == 0.0 and tg.credits("ba + 2 = -6", p)["eq(k)"] == 0.0


@pytest.mark.parametrize("text,expected", [
    (OTHER.solution, 1), ("a = -4, b = 8, \\boxed{4}", 1), ("a = 1, b = 3, \\boxed{4}", 0),   # right box, wrong a, b
    ("\\boxed{4}", -1), ("a = -4, b = 8, \\boxed{0}", 0), ("a = 1, b = -1, \\boxed{0}", 1)])
def test_consistency_shaping_uses_the_instance(text, expected):
    assert tg.consistent(text, OTHER) == expected


# ------------------------------------------------------------------ the evaluation's sampler and left-padded rollouts
def _prompts(tok, texts):
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, return_tensors="pt",
                                    return_dict=True)["input_ids"][0] for t in texts]


@pytest.fixture(scope="module")
def loaded(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model)
    return tok, AutoModelForCausalLM.from_pretrained(tiny_model).eval()


@pytest.mark.parametrize("rows", [2, 32])
def test_generate_many_greedy_is_each_prompts_own_greedy_completion(loaded, rows):
    """Prompts of different lengths with a common prefix, batched (left-padded rests, the prefix run once, finished
    rows dropped) give token for token what HF generate gives each prompt alone."""
    tok, model = loaded
    prompts = _prompts(tok, ["say a", "say b please", "x", "say a", "a much longer prompt than the others"])
    cfg = tg.Config(max_new_tokens=12, temperature=0.7)
    eos = [tok.eos_token_id]
    out = tg.generate_many(model, prompts, 1, cfg, eos, tok.pad_token_id, greedy=True, rows=rows)  # [5, T]
    for p, row in zip(prompts, out):
        ref = model.generate(input_ids=p[None], attention_mask=torch.ones_like(p[None]), do_sample=False,
                             max_new_tokens=12, eos_token_id=eos, pad_token_id=tok.pad_token_id)[0, len(p):]
        assert torch.equal(row[:len(ref)], ref) and (row[len(ref):] == tok.pad_token_id).all()


def test_generate_many_samples_at_the_temperature(loaded):
    """k samples of each prompt: the first token's frequencies match softmax(z / T) of that prompt, not softmax(z),
    so the evaluation's pass@k is at the training temperature (a sharpened copy of the tiny model: its head x 40)."""
    import copy
    tok, model = loaded
    model = copy.deepcopy(model)
    model.lm_head.weight.data *= 40
    prompts = _prompts(tok, ["say a", "bb"])
    cfg = tg.Config(max_new_tokens=1, temperature=2.0)
    torch.manual_seed(0)
    out = tg.generate_many(model, prompts, 1000, cfg, [tok.eos_token_id], tok.pad_token_id, rows=500)  # [2000, 1]
    for i, p in enumerate(prompts):
        z = model(input_ids=p[None]).logits[0, -1].detach()
        freq = torch.bincount(out[i * 1000:(i + 1) * 1000, 0], minlength=len(z)).float() / 1000
        at_T, at_1 = torch.softmax(z / 2.0, -1), torch.softmax(z, -1)
        assert (freq - at_T).abs().max() < 0.05 < (at_T - at_1).abs().max()


def test_left_padded_prompts_give_each_group_its_own_logprobs(loaded):
    """rollout() left-pads the prompts of a step's instances to one length; token_logprobs with their attn (pads
    masked, positions counted from each row's first token) gives each row what its own prompt alone gives."""
    tok, model = loaded
    prompts = [p[None] for p in _prompts(tok, ["say a", "a much longer prompt", "x"])]
    cfg = tg.Config(max_new_tokens=6, temperature=0.9, sampler="plain")
    eos = [tok.eos_token_id]
    torch.manual_seed(0)
    seqs, attn, P = tg.rollout(model, prompts, 2, cfg, eos, tok.pad_token_id)         # [6, P+T]
    assert attn is not None and seqs.shape[0] == 6 and P == max(p.shape[1] for p in prompts)
    mask, _ = tg.completion_mask(seqs[:, P:], eos)
    lp = tg.token_logprobs(model, seqs, P, mask, 0.9, attn=attn)[0]                    # [6, T]
    for i, p in enumerate(prompts):
        for j in (2 * i, 2 * i + 1):
            alone = torch.cat([p[0], seqs[j, P:]])[None]
            own = tg.token_logprobs(model, alone, p.shape[1], mask[j:j + 1], 0.9)[0]    # [1, T]
            torch.testing.assert_close(lp[j], own[0], atol=1e-5, rtol=1e-5)
    same = tg.rollout(model, [prompts[0]] * 3, 2, cfg, eos, tok.pad_token_id)         # one prompt: one call, no pads
    assert same[1] is None and same[0].shape[0] == 6


def test_left_padded_logprobs_count_positions_from_each_rows_first_token(loaded):
    """The same with absolute position embeddings (a tiny GPT-2), where a row's positions change its log-probs (RoPE
    is shift-invariant and would not tell): left-padded rows with attn equal each prompt alone, and the batch without
    position ids does not (the check can fail)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    tok = loaded[0]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=256, n_embd=32, n_layer=2, n_head=2,
                                       initializer_range=0.5)).eval()               # large wpe: positions matter
    prompts = [p[None] for p in _prompts(tok, ["say a", "a much longer prompt here", "x"])]
    seqs, attn, P = tg.rollout(model, prompts, 2, tg.Config(max_new_tokens=5, temperature=1.0, sampler="plain"),
                               [tok.eos_token_id], tok.pad_token_id)                 # [6, P+T]
    mask = torch.ones(seqs.shape[0], seqs.shape[1] - P)                               # [6, T] every token
    lp = tg.token_logprobs(model, seqs, P, mask, 1.0, attn=attn)[0]                    # [6, T]
    alone = torch.stack([tg.token_logprobs(model, torch.cat([prompts[j // 2][0], seqs[j, P:]])[None],
                                           prompts[j // 2].shape[1], mask[j:j + 1], 1.0)[0][0] for j in range(6)])
    torch.testing.assert_close(lp, alone, atol=1e-5, rtol=1e-5)
    with torch.no_grad():                                                            # the mistake: positions from 0
        h = model(input_ids=seqs, attention_mask=attn, output_hidden_states=True).hidden_states[-1][:, P - 1:-1]
        wrong = torch.log_softmax(model.lm_head(h), -1).gather(-1, seqs[:, P:, None])[..., 0]  # [6, T]
    assert (wrong[0] - alone[0]).abs().max() > 1e-3                                   # the shortest prompt's rows


# ------------------------------------------------------------------ training on the family, evaluated as it goes
def _cfg(model, tmp_path, *flags):
    return tg.parse_config(["--model", model, "--group_size", "4", "--max_new_tokens", "8", "--num_steps", "3",
                            "--output_dir", str(tmp_path / "out"), "--log_dir", str(tmp_path), "--run_name", "r",
                            "--learning_rate", "1e-3", *flags], cuda=False)


def _rows(path):
    return [json.loads(ln) for ln in open(path)]


def test_family_training_logs_its_instances_and_evaluates_before_during_and_after(tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "--task", "family", "--prompts_per_step", "2", "--eval_size", "6",
               "--eval_every", "2", "--eval_samples", "3")
    tg.train(cfg)
    steps, evals = _rows(tmp_path / "r.jsonl"), _rows(tmp_path / "r.eval.jsonl")
    assert [r["step"] for r in evals] == [0, 2, 3]                      # before step 0, before step 2, after the last
    for r in evals:
        assert r["eval/n"] == 6 and 0 <= r["eval/accuracy"] <= r["eval/pass@3"] + 1e-9 <= 1 + 1e-9
        assert {"eval/reward", "eval/sampled_accuracy", "eval/credit/boxed", "eval/truncated_frac"} <= set(r)
    drawn = [tg.Piecewise(**x) for r in steps for x in r["instances"]]
    assert len(drawn) == 6 and len(set(drawn)) > 1 and not set(drawn) & set(tg.HELD_OUT)


def test_evaluation_leaves_the_training_run_as_it_would_be_without_it(tiny_model, tmp_path):
    """Greedy and sampled evaluation run on their own seed: the training rows are the same with and without them."""
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))}
    runs = []
    for name, flags in (("with", ["--eval_size", "4", "--eval_samples", "2"]), ("without", ["--eval_size", "0"])):
        tg.train(_cfg(tiny_model, tmp_path / name, "--task", "family", *flags))
        runs.append([drop(r) for r in _rows(tmp_path / name / "r.jsonl")])
    assert runs[0] == runs[1] and os.path.exists(tmp_path / "with" / "r.eval.jsonl")
    assert not os.path.exists(tmp_path / "without" / "r.eval.jsonl")


def test_train_on_the_problem_is_the_default_and_draws_only_it(tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "--eval_size", "2")
    assert cfg.task == "problem"
    tg.train(cfg)
    assert all(tg.Piecewise(**x) == tg.TOY for r in _rows(tmp_path / "r.jsonl") for x in r["instances"])


# ------------------------------------------------------------------ a user's .jsonl file
def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


LINEAR = os.path.join(ROOT, "tests", "data", "linear-equations.jsonl")


def test_the_example_file_is_what_its_script_writes():
    sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
    import linear_equations
    assert [json.loads(ln) for ln in open(LINEAR)] == linear_equations.rows()


def test_a_jsonl_task_trains_and_evaluates_end_to_end(tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "--task", LINEAR, "--prompts_per_step", "2", "--eval_size", "5")
    tg.train(cfg)
    steps, evals = _rows(tmp_path / "r.jsonl"), _rows(tmp_path / "r.eval.jsonl")
    assert len(steps) == 3 and [r["step"] for r in evals] == [0, 3] and evals[0]["eval/n"] == 5
    task = tg.make_task(cfg)
    held = {r["line"] for r in task.held_out}
    assert all(isinstance(x, int) and x not in held for r in steps for x in r["instances"])  # file lines drawn


def test_the_jsonl_split_is_by_a_hash_of_the_row_stable_and_disjoint(tmp_path):
    rows = [{"prompt": f"what is {i} + {i}?", "answer": 2 * i} for i in range(400)]
    path = _write(tmp_path / "t.jsonl", rows)
    shuffled = _write(tmp_path / "s.jsonl", random.Random(1).sample(rows, len(rows)))  # order and seed change nothing
    split = lambda p, *f: tg.make_task(tg.resolve(tg.Config(task=p, *f), cuda=False))
    a, b, c = split(path), split(shuffled), tg.make_task(tg.resolve(tg.Config(task=path, seed=7), cuda=False))
    key = lambda rs: sorted(r["prompt"] for r in rs)
    assert key(a.held_out) == key(b.held_out) == key(c.held_out) and 20 < len(a.held_out) < 60   # ~10 %
    assert not set(key(a.held_out)) & set(key(a.train)) and len(a.train) + len(a.held_out) == 400
    digest = hashlib.sha256(json.dumps(["what is 0 + 0?", 0]).encode()).digest()[0]    # the rule, spelled out
    assert (digest < 25.6) == ("what is 0 + 0?" in key(a.held_out))


@pytest.mark.parametrize("text,answer,right", [
    ("so \\boxed{5}", 5, True), ("\\boxed{5.0}", "5", True), ("\\boxed{ -3 }", -3, True), ("\\boxed{1,000}", 1000, True),
    ("\\boxed{3/4}", 0.75, True), ("\\boxed{\\text{Paris}}.", "paris", True), ("\\boxed{4} no \\boxed{5}", 5, True),
    ("\\boxed{5} no \\boxed{4}", 5, False), ("the answer is 5", 5, False), ("\\boxed{50}", 5, False),
    ("\\boxed{x = 5}", 5, False), ("\\boxed{5/0}", "5/0", True), ("\\boxed{\\frac{3}{4}}", "\\frac{3}{4}", True)])
def test_the_jsonl_reward_reads_the_last_box_against_the_rows_answer(text, answer, right):
    parts = tg.boxed_reward(text, {"answer": answer})
    assert parts["answer"] == pytest.approx(0.9 * right) and parts["boxed"] == pytest.approx(0.1 * ("boxed" in text))


@pytest.mark.parametrize("content,why", [
    (None, "no such file"), ([], "it holds no rows"), (["", "  "], "it holds no rows"),
    (['{"prompt": "a", "answer": 1}', "{not json"], "line 2 is not JSON"),
    (['{"prompt": "a"}'], 'line 1 is not an object with a non-empty "prompt" and "answer"'),
    (['["a", 1]'], "line 1 is not an object"), (['{"prompt": "", "answer": 1}'], "line 1 is not an object"),
    (['{"prompt": "a", "answer": true}'], "line 1 is not an object"),
    (['{"prompt": "a", "answer": 1, "examples": "x"}'], 'line 1: "system" must be a string and "examples" a list'),
])
def test_each_bad_file_gets_one_line_before_any_weight_loads(tiny_model, tmp_path, content, why):
    path = str(tmp_path / "bad.jsonl") if content is None else _write(tmp_path / "bad.jsonl", content)
    with pytest.raises(tg.ConfigError) as err:
        _cfg(tiny_model, tmp_path, "--task", path)
    assert why in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("--task=")


def test_a_split_that_leaves_no_training_row_and_a_prompt_too_long_are_one_line(tiny_model, tmp_path):
    one = _write(tmp_path / "one.jsonl", [{"prompt": "what is 0 + 0?", "answer": 0}])    # held out (see above)
    with pytest.raises(tg.ConfigError, match="0 training rows after the held-out split"):
        _cfg(tiny_model, tmp_path, "--task", one, "--eval_fraction", "0.99")
    long = _write(tmp_path / "long.jsonl", [{"prompt": "x" * 3000, "answer": 1}] * 3)
    with pytest.raises(tg.ConfigError, match="line 1's prompt is .* tokens: with --max_new_tokens 8 it exceeds"):
        _cfg(tiny_model, tmp_path, "--task", long, "--eval_fraction", "0")
    with pytest.raises(tg.ConfigError, match="--eval_file=.* no such file"):
        _cfg(tiny_model, tmp_path, "--task", LINEAR, "--eval_file", str(tmp_path / "none.jsonl"))
    with pytest.raises(tg.ConfigError, match="--eval_fraction=0.5 does nothing here"):
        _cfg(tiny_model, tmp_path, "--eval_fraction", "0.5")


def test_your_reward_function_sees_the_row(tiny_model, tmp_path):
    seen = []

    def reward(text, row):
        seen.append(row)
        return float(str(row["answer"]) in text)
    cfg = _cfg(tiny_model, tmp_path, "--task", LINEAR, "--eval_size", "0", "--num_steps", "1")
    tg.train(cfg, reward_fn=reward)
    assert len(seen) == 4 and all({"prompt", "answer", "line"} <= set(r) for r in seen)
    assert len({r["line"] for r in seen}) == 1                           # one row, one group of 4
