"""The new doors, each bad input one line (README: Bad inputs): task files the reader chokes on, evaluation values that
pass the checks and would fail after the weights load, an --eval_file that is not held out, and your reward_fn."""
import builtins
import errno
import json
import math

import pytest
import torch

import transparent_grpo as tg

from test_safety import cli, flags

ROW = {"prompt": "What is 2 + 3?", "answer": 5}


def write(path, text, mode="w"):
    with open(path, mode) as f:
        f.write(text)
    return str(path)


def rows_file(path, n=12):
    return write(path, "".join(json.dumps({"prompt": f"What is {i} + 3?", "answer": i + 3}) + "\n" for i in range(n)))


def refused(capsys, *args):
    code, _, err = cli(capsys, *args)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ------------------------------------------------------------------ 1. a file the reader chokes on
@pytest.mark.parametrize("examples", ["3", "null", "\"text\"", "[[\"q\"]]", "{\"a\": 1}"])
def test_examples_that_are_not_a_list_of_pairs_are_one_line(tmp_path, tiny_model, capsys, examples):
    task = write(tmp_path / "t.jsonl", '{"prompt": "p", "answer": 1, "examples": %s}\n' % examples)
    err = refused(capsys, *flags(tmp_path, tiny_model, "--task", task))
    assert err == f"error: --task={task!r} is invalid: line 1: \"system\" must be a string and \"examples\" a list " \
                  "of [question, solution] pairs"


def test_deep_nesting_is_not_json_in_one_line(tmp_path, tiny_model, capsys):
    task = write(tmp_path / "t.jsonl", json.dumps(ROW) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    assert refused(capsys, *flags(tmp_path, tiny_model, "--task", task)).endswith("line 2 is not JSON (or nests too "
                                                                                   "deeply)")


@pytest.mark.parametrize("field", ["prompt", "answer", "system", "examples"])
def test_a_lone_surrogate_is_refused_before_the_tokenizer(tmp_path, tiny_model, capsys, field):
    row = {**ROW, field: [["q \ud800", "s"]] if field == "examples" else "x \ud800 y"}
    task = write(tmp_path / "t.jsonl", json.dumps(row) + "\n")                      # json spells it \ud800
    assert "\\ud800" in open(task).read()
    assert refused(capsys, *flags(tmp_path, tiny_model, "--task", task)).endswith("line 1 holds a lone surrogate "
                                                                                   "(e.g. \"\\ud800\"): not text a "
                                                                                   "tokenizer can read")


@pytest.mark.parametrize("flag", ["--task", "--eval_file"])
@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO])
def test_a_file_whose_read_fails_is_one_line(tmp_path, tiny_model, capsys, monkeypatch, flag, code):
    """A read that fails (as root, chmod 000 does not stop one: the failure is injected at open for that path)."""
    task, other = rows_file(tmp_path / "t.jsonl"), rows_file(tmp_path / "e.jsonl", 3)
    bad = task if flag == "--task" else other
    real_open = builtins.open

    def failing(path, *a, **k):
        if str(path) == bad:
            raise OSError(code, "injected", path)
        return real_open(path, *a, **k)
    monkeypatch.setattr(builtins, "open", failing)
    extra = ["--task", task] + (["--eval_file", other] if flag == "--eval_file" else [])
    err = refused(capsys, *flags(tmp_path, tiny_model, *extra))
    assert err == f"error: {flag}={bad!r} is invalid: it cannot be read (injected)"


def test_a_utf8_bom_is_read_as_none(tmp_path, tiny_model):
    plain = rows_file(tmp_path / "plain.jsonl")
    bom = write(tmp_path / "bom.jsonl", b"\xef\xbb\xbf" + open(plain, "rb").read(), "wb")
    assert [r["prompt"] for r in tg.read_rows(bom, "--task")] == [r["prompt"] for r in tg.read_rows(plain, "--task")]


def test_a_prompt_too_long_for_the_context_is_refused_by_its_length(tmp_path, tiny_model, capsys, monkeypatch):
    """Refused from its characters, before the tokenizer reads it: tokenizing it would abort the process."""
    task = write(tmp_path / "t.jsonl", json.dumps({"prompt": "a" * 3_000_000, "answer": 1}) + "\n")
    tokenized = []
    real = tg.tokenizer_of

    def spy(*a, **k):
        tok = real(*a, **k)
        apply = tok.apply_chat_template
        tok.apply_chat_template = lambda *b, **c: (tokenized.append(1), apply(*b, **c))[1]
        return tok
    monkeypatch.setattr(tg, "tokenizer_of", spy)
    err = refused(capsys, *flags(tmp_path, tiny_model, "--task", task))
    assert err.endswith("line 1's chat is 3000000 characters: more than the context window of 2048 tokens can hold")
    assert not tokenized


def test_a_nan_number_is_one_line(tmp_path, tiny_model, capsys):
    task = write(tmp_path / "t.jsonl", '{"prompt": "p", "answer": NaN}\n')
    assert refused(capsys, *flags(tmp_path, tiny_model, "--task", task)).endswith("line 1: a number must be finite")


# ------------------------------------------------------------------ 2. values that would fail after the weights load
def test_eval_samples_is_bounded_before_loading(tmp_path, tiny_model, capsys):
    err = refused(capsys, *flags(tmp_path, tiny_model, "--task", "family", "--eval_samples", "99999999999999999999"))
    assert err == "error: --eval_samples=99999999999999999999 is invalid: eval_size*eval_samples: at most 2**20 " \
                  "completions an evaluation"


def test_the_family_refuses_more_prompts_a_step_than_it_has(tmp_path, tiny_model, capsys):
    err = refused(capsys, *flags(tmp_path, tiny_model, "--task", "family", "--prompts_per_step", 600))
    assert err == f"error: --prompts_per_step=600 is invalid: the task trains on {len(tg.TRAIN)} instances: at most " \
                  "that many a step"
    assert len(tg.TRAIN) < 600


# ------------------------------------------------------------------ 3. held out, but not really
@pytest.mark.parametrize("how", ["same", "link", "copy", "some"])
def test_an_eval_file_with_training_rows_is_refused(tmp_path, tiny_model, capsys, how):
    task = rows_file(tmp_path / "t.jsonl")
    fresh = '{"prompt": "7 * 7?", "answer": 49}\n'                                    # no training row
    other = {"same": task, "copy": write(tmp_path / "c.jsonl", open(task).read()),
             "some": write(tmp_path / "s.jsonl", open(task).readlines()[3] + fresh)}.get(how)
    if how == "link":
        (tmp_path / "l.jsonl").symlink_to(task)
        other = str(tmp_path / "l.jsonl")
    n = {"some": 2}.get(how, 12)
    err = refused(capsys, *flags(tmp_path, tiny_model, "--task", task, "--eval_file", other))
    assert err == f"error: --eval_file={other!r} is invalid: {1 if how == 'some' else 12} of its {n} rows are also " \
                  "rows of --task (the same prompt and answer): evaluate on rows it does not train on"


# ------------------------------------------------------------------ 4. your reward function
def small(tiny_model, tmp_path, **kw):
    cfg = tg.resolve(tg.Config(model=tiny_model, group_size=4, max_new_tokens=8, num_steps=2, eval_size=0,
                               output_dir=str(tmp_path), log_dir=str(tmp_path), run_name="r", **kw), cuda=False)
    tg.validate(cfg)
    return cfg


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -math.inf, "0.5", None, [1.0], torch.ones(2),
                                   1 + 2j, torch.tensor(float("nan"))])
def test_a_reward_that_is_not_a_finite_number_stops_the_run_in_one_line(tiny_model, tmp_path, value):
    with pytest.raises(tg.RunError) as stop:
        tg.train(small(tiny_model, tmp_path), reward_fn=lambda text: value)
    msg = str(stop.value)
    assert msg.startswith(f"step 0: reward_fn returned {repr(value)[:60]} for ") and "\n" not in msg
    assert msg.endswith(": a reward must be a finite number")


@pytest.mark.parametrize("value", [1, 0.5, True, torch.tensor(0.25), torch.tensor([0.5])])
def test_a_finite_number_of_any_kind_is_a_reward(tiny_model, tmp_path, value):
    tg.train(small(tiny_model, tmp_path), reward_fn=lambda text: value)
    rows = [json.loads(ln) for ln in open(tmp_path / "r.jsonl")]
    assert [r["reward/mean"] for r in rows] == [pytest.approx(float(value))] * 2


def test_an_exception_in_reward_fn_keeps_its_traceback_and_names_the_call(tiny_model, tmp_path):
    def reward(text, row):
        return 1 / 0 if row is not None else 0.0
    with pytest.raises(tg.RunError) as stop:
        tg.train(small(tiny_model, tmp_path), reward_fn=reward)
    assert str(stop.value).startswith("step 0: reward_fn raised ZeroDivisionError: division by zero while scoring ")
    cause = stop.value.__cause__
    assert isinstance(cause, ZeroDivisionError) and cause.__traceback__ is not None    # the user's frame is kept
    assert any(f.name == "reward" for f in __import__("traceback").extract_tb(cause.__traceback__))


def test_a_bad_reward_in_the_evaluation_names_its_step(tiny_model, tmp_path):
    calls = []

    def reward(text):
        calls.append(text)
        return 0.0 if len(calls) < 12 else None       # the evaluations before and after 3 calls each, 2 steps 4 each
    cfg = small(tiny_model, tmp_path, task="family")
    cfg.eval_size = 2
    with pytest.raises(tg.RunError, match=r"^step 2: reward_fn returned None for "):
        tg.train(cfg, reward_fn=reward)
