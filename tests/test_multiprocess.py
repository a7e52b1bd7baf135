"""Two processes on CPU (gloo), as on two GPUs: `accelerate launch --multi_gpu --num_processes 2` (DDP) and
`accelerate launch --use_deepspeed --zero_stage 2 --num_processes 2`, with a tiny random model."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
WORKER = r"""
import json, os, sys
sys.path.insert(0, {root!r})
import transparent_grpo as tg
rank, scored = int(os.environ.get("RANK", 0)), []

def reward(text):  # rank {nan_reward} returns NaN: a reward_fn's NaN stops the run at once, on every process
    scored.append(text)
    return float("nan") if rank == {nan_reward} else text.count("a") / 8 + 0.01 * len(text)

if rank == {nan_rank}:  # rank {nan_rank}'s loss is NaN: the NaN guard must decide on every process at once
    real_loss = tg.policy_loss
    tg.policy_loss = lambda *a, **k: (lambda out: (out[0] * float("nan"), out[1]))(real_loss(*a, **k))
cfg = tg.parse_config(sys.argv[1:])
try:
    tg.train(cfg, reward_fn=reward, messages=[{{"role": "user", "content": "say a"}}])
finally:
    json.dump({{"rank": rank, "scored": len(scored)}}, open(os.path.join(cfg.log_dir, f"rank{{rank}}.json"), "w"))
"""
PPO_WORKER = WORKER.replace("cfg = tg.parse_config(sys.argv[1:])", """cfg = tg.parse_config(sys.argv[1:])
real, seen = tg.ppo_advantages, []

def spy(*args):  # keeps what this process's ppo_advantages returns on its own completion tokens, step by step
    A, returns = real(*args)
    seen.append(A[args[3].bool()].tolist())
    json.dump(seen, open(os.path.join(cfg.log_dir, f"adv{{rank}}.json"), "w"))
    return A, returns

tg.ppo_advantages = spy""")
VOLATILE = ("time/", "perf/")


def launch(tmp_path, *args, deepspeed=False, nan_rank=-1, nan_reward=-1, steps=3, run="r", timeout=240,
           worker_text=WORKER):
    worker = tmp_path / "worker.py"
    worker.write_text(worker_text.format(root=ROOT, nan_rank=nan_rank, nan_reward=nan_reward))
    how = ["--use_deepspeed", "--zero_stage", "2"] if deepspeed else ["--multi_gpu"]
    cmd = [os.path.join(BIN, "accelerate"), "launch", *how, "--num_processes", "2", str(worker), "--model",
           args[0], "--num_steps", str(steps), "--max_new_tokens", "8", "--group_size", "4", "--prompts_per_step", "2",
           "--learning_rate", "1e-2", "--output_dir", str(tmp_path / "out"), "--log_dir", str(tmp_path / "logs"),
           "--run_name", run, *args[1:]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)


def rows(tmp_path, run="r"):
    return [{k: v for k, v in json.loads(ln).items() if not k.startswith(VOLATILE)}
            for ln in open(tmp_path / "logs" / f"{run}.jsonl")]


def test_two_processes_ddp_one_log_whole_groups_and_exact_resume(tmp_path, tiny_model):
    p = launch(tmp_path, tiny_model, "--save_every", "2", "--objective", "dapo")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "processes: 2 | MULTI_CPU" in p.stdout and p.stdout.count("step    2/3") == 1  # the main process logs
    for rank in (0, 1):  # each process scores its own whole groups: steps x prompts_per_step x G
        assert json.load(open(tmp_path / "logs" / f"rank{rank}.json"))["scored"] == 3 * 2 * 4
    straight = rows(tmp_path)
    assert [r["step"] for r in straight] == [0, 1, 2] and straight[0]["kl/k1"] == 0.0
    assert straight[-1]["kl/k1"] != 0.0                                   # the processes trained one model together
    # resume from the checkpoint at step 2 (both processes' RNG states, the optimizer): the same numbers again
    p = launch(tmp_path, tiny_model, "--resume", "--objective", "dapo")
    assert p.returncode == 0 and "resumed from" in p.stdout, p.stderr[-3000:]
    assert rows(tmp_path) == straight


def test_two_processes_deepspeed_zero2(tmp_path, tiny_model):
    p = launch(tmp_path, tiny_model, deepspeed=True, steps=2)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "processes: 2 | DEEPSPEED" in p.stdout and "weights: torch.float32 |" in p.stdout
    r = rows(tmp_path)
    assert [x["step"] for x in r] == [0, 1] and r[0]["kl/k1"] == 0.0


def test_nan_on_one_process_skips_on_both_and_stops_together(tmp_path, tiny_model):
    """Before the guard was collective, the healthy process waited forever in the gradient all-reduce."""
    p = launch(tmp_path, tiny_model, "--max_bad_updates", "2", nan_rank=1, steps=5, timeout=180)
    assert p.returncode != 0
    assert "stopping: 2 non-finite losses or gradients in a row at step 1" in p.stdout
    assert [r["optim/skipped_updates"] for r in rows(tmp_path)] == [1.0]


def test_nan_reward_on_one_process_stops_both_with_one_line(tmp_path, tiny_model):
    """A reward_fn's NaN on one process ends the run there with one line; the other must not wait for it forever."""
    p = launch(tmp_path, tiny_model, nan_reward=1, steps=3, timeout=180)
    assert p.returncode != 0
    assert "step 0: reward_fn returned nan for" in p.stdout + p.stderr
    assert not os.path.exists(tmp_path / "logs" / "r.jsonl") or rows(tmp_path) == []


def test_two_processes_ppo_whitens_over_the_tokens_of_both(tmp_path, tiny_model):
    """GAE advantages whitened over both processes' tokens, as one process with the whole batch would: together they
    have mean 0 and std 1 (whitening each process alone would leave the union's std at sqrt((n-2)/(n-1)) < 1)."""
    import torch
    p = launch(tmp_path, tiny_model, "--objective", "ppo", steps=2, worker_text=PPO_WORKER)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    seen = [json.load(open(tmp_path / "logs" / f"adv{rank}.json")) for rank in (0, 1)]
    for step in (0, 1):
        both = torch.tensor(seen[0][step] + seen[1][step], dtype=torch.float64)
        assert len(seen[0][step]) >= 8 and len(seen[1][step]) >= 8
        assert abs(both.mean().item()) < 1e-5 and abs(both.std().item() - 1) < 1e-5


FAMILY_WORKER = r"""
import sys
sys.path.insert(0, {root!r})
import transparent_grpo as tg
tg.train(tg.parse_config(sys.argv[1:]))
"""


def test_two_processes_train_on_the_family_and_share_the_evaluation(tmp_path, tiny_model):
    """Each process draws its own instances (all logged) and evaluates its share of the held-out set; with
    --eval_size 1 the second process has none and still joins the gather: one row, n = 1, pass@2 from one instance."""
    p = launch(tmp_path, tiny_model, "--task", "family", "--eval_size", "1", "--eval_samples", "2",
               "--worked_examples", "0", steps=2, worker_text=FAMILY_WORKER)   # a short prompt: a quick run
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    evals = [json.loads(ln) for ln in open(tmp_path / "logs" / "r.eval.jsonl")]
    assert [r["step"] for r in evals] == [0, 2] and all(r["eval/n"] == 1 and "eval/pass@2" in r for r in evals)
    drawn = [tuple(x.values()) for r in rows(tmp_path) for x in r["instances"]]
    assert len(drawn) == 2 * 2 * 2 and len(set(drawn)) > 2               # steps x processes x prompts_per_step
