"""Safe to point at folders someone else made (issue 74), on real files: no code from a folder runs (a planted pickle,
a model's own code), nothing is written or deleted outside the run's own files (names, links, pruning), no earlier run
is lost (a rerun, a resume with nothing to do), and every failure is one line (a real full disk, damaged files)."""
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import transparent_grpo as tg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "transparent_grpo.py")
BIN = os.path.dirname(sys.executable)
VOLATILE = ("time/", "perf/")


class Payload:
    """Unpickling it creates the file `path`: the proof that a pickle ran (with weights_only=True it cannot load)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def flags(tmp_path, model, *extra):  # the toy's tasks without worked examples: a short prompt, a quick run
    short = [] if any(str(e).endswith(".jsonl") for e in extra) else ["--worked_examples", "0"]
    return ["--model", str(model), "--group_size", "4", "--max_new_tokens", "8", "--num_steps", "2", "--output_dir",
            str(tmp_path / "out"), "--log_dir", str(tmp_path / "logs"), "--run_name", "r", *short, *map(str, extra)]


def cli(capsys, *args):
    """main() with these flags: (exit code, stdout, the stderr lines that are not progress bars); never a traceback."""
    capsys.readouterr()
    try:
        tg.main([str(a) for a in args])
        code = 0
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err[-3000:]
    return code, out, [ln for ln in err.strip().splitlines()
                       if ln.strip() and not ln.startswith(("Loading", "Writing"))]


def script(*args, timeout=300, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", **kw.pop(
        "env", {})}
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env, **kw)


def rows(path):
    return [{k: v for k, v in json.loads(ln).items() if not k.startswith(VOLATILE)} for ln in open(path)]


def snapshot(folder):  # every file under `folder` with its bytes
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(folder) for f in files}


@pytest.fixture(scope="module")
def finished_run(tiny_model, tmp_path_factory):
    """A run of 3 steps, a checkpoint every step (keep 2: step_000001, step_000002), its samples logged: copied by
    each test that changes it."""
    tmp = tmp_path_factory.mktemp("finished")
    tg.main(flags(tmp, tiny_model, "--num_steps", 3, "--save_every", 1, "--log_samples"))
    return tmp


@pytest.fixture
def run(finished_run, tmp_path):
    for sub in ("out", "logs"):
        shutil.copytree(finished_run / sub, tmp_path / sub)
    return tmp_path


# ------------------------------------------------------------------ 1. no code from a folder runs
def test_a_pickle_planted_in_a_checkpoint_never_runs(tiny_model, tmp_path, capsys):
    """With --ref_update_every the reference was registered with accelerate, which saved it as
    custom_checkpoint_0.pkl and loaded it back with weights_only=False: a planted pickle ran on --resume."""
    args = flags(tmp_path, tiny_model, "--save_every", 2, "--ref_update_every", 1)
    assert cli(capsys, *args, "--num_steps", 3)[0] == 0
    ckpt, marker = tmp_path / "out" / "r" / "checkpoints" / "step_000002", tmp_path / "pickle-ran"
    torch.save(Payload(marker), ckpt / "custom_checkpoint_0.pkl")
    code, _, err = cli(capsys, *args, "--num_steps", 4, "--resume")
    assert not marker.exists()
    assert code == 1 and len(err) == 1 and err[0].startswith(f"error: checkpoint {ckpt} could not be loaded")
    assert "custom_checkpoint_0.pkl, a pickle" in err[0]


def test_the_moving_reference_is_saved_as_safetensors_and_resumes_exactly(tiny_model, tmp_path, capsys):
    args = flags(tmp_path, tiny_model, "--save_every", 2, "--ref_update_every", 2, "--learning_rate", "1e-2")
    assert cli(capsys, *args, "--num_steps", 3)[0] == 0                  # step_000002: after the refresh at step 1
    ckpt = tmp_path / "out" / "r" / "checkpoints" / "step_000002"
    assert (ckpt / "reference.safetensors").is_file()
    assert sorted(f for f in os.listdir(ckpt) if f.endswith((".pkl", ".bin"))) == ["optimizer.bin",
                                                                                    "random_states_0.pkl"]
    assert cli(capsys, *args, "--num_steps", 5, "--resume")[0] == 0      # steps 2, 3 on the restored reference
    assert cli(capsys, *args, "--num_steps", 5, "--run_name", "straight")[0] == 0
    resumed, straight = rows(tmp_path / "logs" / "r.jsonl"), rows(tmp_path / "logs" / "straight.jsonl")
    assert [r["step"] for r in resumed] == list(range(5)) and resumed == straight
    assert resumed[2]["kl/k1"] == 0 and resumed[3]["kl/k1"] != 0


@pytest.mark.parametrize("damage", ["a pickle", "a wrong state"])
def test_random_states_that_cannot_be_restored_are_an_error(run, tiny_model, capsys, damage):
    """accelerate only logs 'Could not load random states' at INFO: the resumed run silently drew other samples."""
    ckpt, marker = run / "out" / "r" / "checkpoints" / "step_000002", run / "pickle-ran"
    if damage == "a pickle":   # refused by weights_only=True, as it must be, and then an error
        torch.save(Payload(marker), ckpt / "random_states_0.pkl")
    else:                      # loads, but torch.set_rng_state refuses a state of the wrong size
        states = torch.load(ckpt / "random_states_0.pkl", weights_only=False)
        torch.save({**states, "torch_manual_seed": torch.zeros(7, dtype=torch.uint8)}, ckpt / "random_states_0.pkl")
    code, _, err = cli(capsys, *flags(run, tiny_model, "--num_steps", 4, "--save_every", 1, "--log_samples",
                                      "--resume"))
    assert not marker.exists()
    assert code == 1 and len(err) == 1 and err[0].startswith(f"error: checkpoint {ckpt} could not be loaded")


def custom_code_model(tiny_model, folder):
    """The tiny model, but its config names its own classes (auto_map): configuration_x.py writes a marker file."""
    shutil.copytree(tiny_model, folder)
    marker = folder.parent / "custom-code-ran"
    (folder / "configuration_x.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import LlamaConfig\n\n\nclass XConfig(LlamaConfig):\n    model_type = 'custom-x'\n")
    (folder / "modeling_x.py").write_text(
        "from transformers import LlamaForCausalLM\nfrom .configuration_x import XConfig\n\n\n"
        "class XForCausalLM(LlamaForCausalLM):\n    config_class = XConfig\n")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="custom-x", architectures=["XForCausalLM"], auto_map={
        "AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


def test_a_models_own_code_runs_only_with_trust_remote_code(tiny_model, tmp_path):
    """transformers asked "run the custom code? [y/N]" on the terminal: answering y ran it. Now it never asks: one
    line says how to allow it, and --trust_remote_code does."""
    folder, marker = custom_code_model(tiny_model, tmp_path / "custom")
    env = {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    p = script(*flags(tmp_path, folder), input="y\n", env=env)
    assert not marker.exists(), p.stdout[-2000:]
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1] == (
        f"error: --model='{folder}' is invalid: it needs the Python code in its folder to load: --trust_remote_code "
        "runs it (only if you trust it)")
    p = script(*flags(tmp_path, folder, "--trust_remote_code"), env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert marker.exists() and (tmp_path / "out" / "r" / "final" / "config.json").exists()


def test_a_deepspeed_resume_unpickles_so_it_needs_trust_remote_code(tiny_model, tmp_path):
    """DeepSpeed's checkpoint engine loads every state file with torch.load(weights_only=False): a pickle planted in
    a checkpoint ran. Without --trust_remote_code such a resume stops before anything loads."""
    ckpt, marker = tmp_path / "ckpt", tmp_path / "pickle-ran"
    (ckpt / "pytorch_model").mkdir(parents=True)
    (ckpt / "meta.json").write_text('{"next_step": 1, "run_name": "r"}')
    torch.save(Payload(marker), ckpt / "pytorch_model" / "mp_rank_00_model_states.pt")
    cmd = [os.path.join(BIN, "accelerate"), "launch", "--use_deepspeed", "--zero_stage", "2", "--num_processes", "1",
           SCRIPT, *flags(tmp_path, tiny_model, "--num_steps", 3, "--resume_from", ckpt)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert not marker.exists()
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]     # the launcher adds its own report
    assert p.returncode != 0 and len(said) == 1 and said[0].startswith(
        f"error: --resume_from='{ckpt}' is invalid: under DeepSpeed a resume unpickles"), p.stderr[-3000:]
    assert "--trust_remote_code" in said[0] and "model:" not in p.stdout


def test_help_says_what_a_deepspeed_resume_does_and_a_trusted_one_warns(tiny_model, tmp_path, monkeypatch):
    from dataclasses import fields
    helps = {f.name: f.metadata["help"] for f in fields(tg.Config)}
    assert "DeepSpeed" in helps["resume"] and "DeepSpeed" in helps["resume_from"]
    assert "DeepSpeed" in helps["trust_remote_code"] and "unpickle" in helps["resume"]
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "meta.json").write_text('{"next_step": 1}')
    cfg = tg.resolve(tg.Config(model=tiny_model, resume_from=str(tmp_path / "ckpt"), trust_remote_code=True,
                               output_dir=str(tmp_path / "out"), log_dir=str(tmp_path / "logs")), cuda=False)
    resume, meta, notes = tg.resume_point(cfg)
    assert meta["next_step"] == 1 and any(n.startswith("warning: DeepSpeed unpickles") for n in notes)


# ------------------------------------------------------------------ 2. nothing written or deleted outside the run
def test_pruning_deletes_only_the_scripts_own_checkpoints(tiny_model, tmp_path, capsys):
    root = tmp_path / "out" / "r" / "checkpoints"
    for name in ("notes", "step_1", "step_000009_mine"):                # folders that look alike, a user's
        (root / name).mkdir(parents=True)
        (root / name / "keep.txt").write_text("mine")
    (root / "readme.txt").write_text("mine")
    code, _, err = cli(capsys, *flags(tmp_path, tiny_model, "--num_steps", 4, "--save_every", 1, "--keep_last", 1))
    assert code == 0, err
    assert sorted(os.listdir(root)) == ["notes", "readme.txt", "step_000003", "step_000009_mine", "step_1"]


def test_a_save_never_deletes_a_folder_the_script_did_not_write(tmp_path):
    import accelerate
    acc = accelerate.Accelerator(cpu=True)
    path = tmp_path / "final"
    path.mkdir()
    (path / "thesis.tex").write_text("years of work")
    with pytest.raises(tg.RunError, match="was not written by this script"):
        tg.save_atomically(acc, str(path), lambda tmp: os.makedirs(tmp, exist_ok=True))
    assert (path / "thesis.tex").read_text() == "years of work"
    elsewhere = tmp_path / "elsewhere"                                   # a link where the save's *.tmp goes
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "step_000001.tmp")
    with pytest.raises(tg.RunError, match="was not written by this script"):
        tg.save_atomically(acc, str(tmp_path / "step_000001"), lambda tmp: open(os.path.join(tmp, "x"), "w").close())
    assert os.listdir(elsewhere) == []


def test_overwrite_keeps_a_final_folder_the_script_did_not_write(run, tiny_model, capsys):
    final = run / "out" / "r" / "final"
    shutil.rmtree(final)
    final.mkdir()
    (final / "thesis.tex").write_text("years of work")
    code, _, err = cli(capsys, *flags(run, tiny_model, "--overwrite"))
    assert code == 2 and err == [f"error: --output_dir='{run / 'out'}' is invalid: {final} was not written by this "
                                 "script: move it away first"]
    assert (final / "thesis.tex").read_text() == "years of work"


@pytest.mark.parametrize("which", ["jsonl", "log", "samples.jsonl.gz"])
def test_logs_are_never_written_through_a_symbolic_link(tiny_model, tmp_path, capsys, which):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file\n")
    (tmp_path / "logs").mkdir()
    os.symlink(victim, tmp_path / "logs" / f"r.{which}")
    code, _, err = cli(capsys, *flags(tmp_path, tiny_model, "--log_samples"))
    assert code == 2 and len(err) == 1 and "is a symbolic link: this script never writes through one" in err[0]
    assert victim.read_text() == "someone's file\n"
    with pytest.raises(tg.RunError, match="could not write"):           # a link made after the checks: no write
        with tg.open_log(str(tmp_path / "logs" / f"r.{which}"), "at") as f:
            f.write("x")
    assert victim.read_text() == "someone's file\n"


def test_a_run_folder_reached_through_a_link_is_refused(tiny_model, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    os.symlink(elsewhere, tmp_path / "out" / "r")                        # out/r/final would land in `elsewhere`
    code, _, err = cli(capsys, *flags(tmp_path, tiny_model))
    assert code == 2 and err == [f"error: --run_name='r' is invalid: {tmp_path / 'out' / 'r'} is a symbolic link: "
                                 "this script never writes through one"]
    assert os.listdir(elsewhere) == []


# ------------------------------------------------------------------ 3. no earlier run lost
def test_a_rerun_with_the_same_name_refuses_and_keeps_the_earlier_run(run, tiny_model, capsys):
    before = snapshot(run)
    code, _, err = cli(capsys, *flags(run, tiny_model))
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --run_name='r' is invalid: an earlier run")
    assert all(how in err[0] for how in ("--resume", "another --run_name", "--overwrite"))
    assert snapshot(run) == before
    code, _, err = cli(capsys, *flags(run, tiny_model, "--overwrite"))  # asked: replaced whole, no checkpoint mixed in
    assert code == 0, err
    assert [r["step"] for r in rows(run / "logs" / "r.jsonl")] == [0, 1]
    assert not os.path.exists(run / "logs" / "r.samples.jsonl.gz")
    assert os.listdir(run / "out" / "r" / "checkpoints") == []
    assert snapshot(run / "out" / "r" / "final") != {k[len("out/r/final/"):]: v for k, v in before.items()
                                                     if k.startswith("out/r/final/")}


def test_a_resume_with_nothing_to_do_says_so_and_changes_nothing(run, tiny_model, capsys):
    before = snapshot(run)
    for steps in (1, 2):                                                 # the newest checkpoint has done 2 steps
        code, _, err = cli(capsys, *flags(run, tiny_model, "--num_steps", steps, "--save_every", 1, "--resume"))
        assert code == 2 and len(err) == 1 and err[0].startswith(f"error: --num_steps={steps} is invalid: ")
        assert "has done 2 steps already: nothing to do" in err[0]
        assert snapshot(run) == before


# ------------------------------------------------------------------ 4. failures after the start: one line
def fill_disk_args(tmp_path, model, out):
    return flags(tmp_path, model, "--save_every", 1, "--output_dir", out)


def can_mount():
    return sys.platform == "linux" and shutil.which("unshare") and subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True).returncode == 0


def test_a_full_filesystem_while_saving_is_one_line(tiny_model, tmp_path):
    """A real full disk: a 32 kB tmpfs in a mount namespace of its own (root only), where the checkpoint goes.
    safetensors raises its SafetensorError, not an OSError."""
    if not can_mount():
        pytest.skip("no tmpfs: needs root and unshare -m")
    out = tmp_path / "small"
    out.mkdir()
    cmd = " ".join(map(shlex_quote, [sys.executable, SCRIPT, *fill_disk_args(tmp_path, tiny_model, out)]))
    p = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=32k tmpfs {out} && exec {cmd}"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert last.startswith(f"error: could not save {out}/r/checkpoints/step_000001: SafetensorError: ")
    assert "No space left on device" in last


def shlex_quote(x):
    import shlex
    return shlex.quote(str(x))


def test_a_file_size_limit_while_saving_is_one_line(tiny_model, tmp_path):
    """The same without root: RLIMIT_FSIZE makes the real write of model.safetensors fail (EFBIG), and safetensors
    raises its own SafetensorError."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))      # the logs fit, the 93 kB weights do not
    p = script(*fill_disk_args(tmp_path, tiny_model, tmp_path / "out"), preexec_fn=limit)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert last.startswith(f"error: could not save {tmp_path}/out/r/checkpoints/step_000001: SafetensorError: ")


DAMAGED_META = {"cut short": '{"next_step": 2, "spent_s": 0.', "a list": "[2, 0.5]", "a string step":
                '{"next_step": "2"}', "NaN": '{"next_step": 2, "spent_s": 1.0, "entropy_coef": NaN}',
                "a bool step": '{"next_step": true}', "no next_step": '{"spent_s": 1.0}'}


@pytest.mark.parametrize("damage", sorted(DAMAGED_META))
def test_a_damaged_meta_json_falls_back_to_the_checkpoint_before_it(run, tiny_model, capsys, damage):
    ckpts = run / "out" / "r" / "checkpoints"
    (ckpts / "step_000002" / "meta.json").write_text(DAMAGED_META[damage])
    code, out, err = cli(capsys, *flags(run, tiny_model, "--num_steps", 3, "--save_every", 1, "--log_samples",
                                        "--resume"))
    assert code == 0, err
    assert f"passed over {ckpts / 'step_000002'}: its meta.json is damaged" in out
    assert f"resumed from {ckpts / 'step_000001'} at step 1" in out
    assert [r["step"] for r in rows(run / "logs" / "r.jsonl")] == [0, 1, 2]
    (ckpts / "step_000002" / "meta.json").write_text(DAMAGED_META[damage])  # named: no fallback, one line
    code, _, err = cli(capsys, *flags(run, tiny_model, "--num_steps", 4, "--resume_from", ckpts / "step_000002"))
    assert code == 2 and err[0].startswith(f"error: --resume_from='{ckpts / 'step_000002'}' is invalid: its meta.json "
                                           "is damaged") and len(err) == 1


def test_a_log_line_cut_short_by_a_kill_is_dropped_at_resume(run, tiny_model, capsys):
    jsonl, samples = run / "logs" / "r.jsonl", run / "logs" / "r.samples.jsonl.gz"
    with open(jsonl, "a") as f:
        f.write('{"step": 3, "reward/mean": 0.1')                         # killed while writing step 3's row
    data = samples.read_bytes()
    samples.write_bytes(data[:-30])                                      # and the last gzip member cut short
    code, out, err = cli(capsys, *flags(run, tiny_model, "--num_steps", 4, "--save_every", 1, "--log_samples",
                                        "--resume"))
    assert code == 0, err
    assert f"{jsonl} ends cut short (a kill while it was written): dropped its incomplete last line" in out
    assert f"{samples} ends cut short" in out
    assert [r["step"] for r in rows(jsonl)] == [0, 1, 2, 3]
    assert [json.loads(ln)["step"] for ln in gzip.open(samples, "rt")] == [0, 1, 2, 3]


def test_a_damaged_log_line_before_the_last_is_one_line(run, tiny_model, capsys):
    jsonl = run / "logs" / "r.jsonl"
    lines = jsonl.read_text().splitlines(keepends=True)
    jsonl.write_text(lines[0] + "[1, 2]\n" + "".join(lines[1:]))
    code, _, err = cli(capsys, *flags(run, tiny_model, "--num_steps", 4, "--save_every", 1, "--log_samples",
                                      "--resume"))
    assert code == 1 and err == [f"error: {jsonl} line 2 is not a row of this script's log: move the file away to "
                                 "resume"]


def test_weights_cut_short_are_one_line(tiny_model, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    code, _, err = cli(capsys, *flags(tmp_path, folder))
    assert code in (1, 2) and len(err) == 1 and err[0].startswith(f"error: --model=")
    assert not os.path.exists(tmp_path / "out" / "r" / "final")


# ------------------------------------------------------------------ 5. checked before any weights load
@pytest.fixture(scope="module")
def folders(tiny_model, tmp_path_factory):
    """Model folders that are not complete causal LMs: no tokenizer, no weights, no chat template, a T5, custom code."""
    from transformers import T5Config
    tmp = tmp_path_factory.mktemp("models")
    made = {}
    for name, drop in (("notok", ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")),
                       ("noweights", ("model.safetensors",)), ("nochat", ("chat_template.jinja",))):
        shutil.copytree(tiny_model, tmp / name, ignore=shutil.ignore_patterns(*drop))
        made[name] = tmp / name
    T5Config(d_model=8, num_layers=1, num_heads=1, d_kv=8, d_ff=8, vocab_size=10).save_pretrained(tmp / "t5")
    made["t5"], _ = tmp / "t5", custom_code_model(tiny_model, tmp / "custom")
    made["custom"] = tmp / "custom"
    return made


BAD = [  # (flags, what the one line must hold); {x}: the folder x of `folders`
    (["--run_name", "../escape"], "--run_name='../escape' is invalid: must be one plain file name"),
    (["--run_name", "a/b"], "--run_name='a/b' is invalid"),
    (["--run_name", "/tmp/abs"], "--run_name='/tmp/abs' is invalid"),
    (["--run_name", ".."], "--run_name='..' is invalid"),
    (["--run_name", "."], "--run_name='.' is invalid"),
    (["--run_name", ""], "--run_name='' is invalid"),
    (["--run_name", "a\\b"], "is invalid: must be one plain file name"),
    (["--run_name", "line\nbreak"], "is invalid: must be one plain file name"),
    (["--run_name", "x" * 201], "is invalid: must be one plain file name"),
    (["--preset", "foo"], "--preset='foo' is invalid: choose one of " + ", ".join(sorted(tg.PRESETS))),
    (["--preset", ""], "--preset='' is invalid: choose one of"),
    (["--resume_from", ""], "--resume_from='' is invalid: must name a checkpoint folder"),
    (["--advantage", ""], "--advantage='' is invalid: choose one of"),
    (["--kl_placement", ""], "--kl_placement='' is invalid: choose one of"),
    (["--model", "a--b/c"], "--model='a--b/c' is invalid: not a local path and not a hub id"),
    (["--model", "org/x..y"], "not a local path and not a hub id"),
    (["--model", "org/name.git"], "not a local path and not a hub id"),
    (["--model", "org/" + "x" * 97], "not a local path and not a hub id"),
    (["--model", "{notok}"], "is invalid: its tokenizer cannot be loaded"),
    (["--model", "{noweights}"], "is invalid: no weights in it (model.safetensors"),
    (["--model", "{nochat}"], "is invalid: its tokenizer has no chat template"),
    (["--model", "{t5}"], "is invalid: its config (T5Config) is not a causal language model's"),
    (["--model", "{custom}"], "is invalid: it needs the Python code in its folder to load: --trust_remote_code"),
    (["--group_size", str(2 ** 63)], f"--group_size={2 ** 63} is invalid: prompts_per_step*group_size"),
    (["--group_size", "100000", "--prompts_per_step", "100000"], "--group_size=100000 is invalid"),
    (["--temperature", "1e-30"], "--temperature=1e-30 is invalid: must be >= 1e-4"),
    (["--temperature", "5e-324"], "--temperature=5e-324 is invalid"),
    (["--gam", "0.9"], "--gam 0.9: not flags of this script"),
    (["--num_st", "3"], "--num_st 3: not flags of this script"),
    (["--vf-coef", "0.5"], "--vf_coef=0.5 does nothing here: only --objective ppo"),
    (["--objective", "reinforce", "--clip-eps", "0.1"], "--clip_eps=0.1 does nothing here"),
    (["--entropy_target", "0", "--entropy-step", "0.01"], "--entropy_step=0.01 does nothing here"),
    (["--beta", "0", "--ref-update-every", "5"], "--ref_update_every=5 does nothing here"),
    (["--keep-last", "3"], "--keep_last=3 does nothing here"),
]


@pytest.mark.parametrize("args,expected", BAD, ids=[" ".join(a)[:40] for a, _ in BAD])
def test_bad_input_is_one_line_before_any_weights_load(args, expected, folders, tiny_model, tmp_path, monkeypatch,
                                                        capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(tg, "load_model", lambda *a: pytest.fail("a model was loaded"))
    args = [a.format(**folders) if a.startswith("{") else a for a in args]
    model = [] if "--model" in args else ["--model", tiny_model]
    code, _, err = cli(capsys, "--output_dir", str(tmp_path / "out"), "--log_dir", str(tmp_path / "logs"), *model,
                       *args)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --") and expected in err[0], err
    assert not (folders["custom"].parent / "custom-code-ran").exists()
    assert sorted(os.listdir(tmp_path)) == sorted({"out", "logs", "modules"} & set(os.listdir(tmp_path)))
