"""Side-by-side benchmark: transparent_grpo.py against TRL's GRPOTrainer on the same work.

    pip install trl                     # benchmark-only dependency, not in requirements.txt
    python tests/benchmark.py           # CPU: bundled SmolLM2-135M, 1 prompt x 8 samples, 128 tokens, 6 steps
    python tests/benchmark.py --model Qwen/Qwen2.5-0.5B-Instruct --group_size 16 --max_new_tokens 512   # a GPU
    python tests/benchmark.py --random_qwen_3b --group_size 16 --max_new_tokens 512                     # no download
    python tests/benchmark.py --model qwen.gguf --max_new_tokens 192 --systems ours,trl   # a GGUF: dequantised once

Same model folder, prompt, G, completion length, beta, learning rate, mu = 1, max_grad_norm = 1, fp32 on CPU, and
the same reward function. Each system runs in its own process. It reports the median step time of steps 2..N (steps
0 and 1 are warm-up) and its peak memory: peak RSS on CPU (getrusage), peak allocated memory on GPU.
`--systems ours,ours_plain,trl` also runs this script with `--sampler plain` (§4's loop) to compare the two samplers
(`ours_compiled`: `--sampler compiled`, static cache + torch.compile, CUDA graphs on GPU), and
every run prints the physical floor of sampling: reading the weights once per decode step at the memory bandwidth
measured on this machine. Not collected by pytest (the file name does not start with test_).
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TRL_RUNNER = textwrap.dedent(r"""
    import json, resource, sys, time, torch
    sys.path.insert(0, {root!r})
    import transparent_grpo as tg
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    a = json.loads({args!r})
    torch.manual_seed(a["seed"])
    cuda = torch.cuda.is_available()
    messages = [{{"role": "system", "content": tg.SYSTEM_PROMPT}}, {{"role": "user", "content": tg.PROBLEM}}]
    data = Dataset.from_list([{{"prompt": messages}}] * a["steps"] * 4)

    def reward(completions, **kw):
        return [tg.toy_reward(c[0]["content"]) for c in completions]

    times = []
    class Timer(TrainerCallback):
        def on_step_begin(self, *args, **kw): self.t = time.time()
        def on_step_end(self, *args, **kw): times.append(time.time() - self.t)

    cfg = GRPOConfig(output_dir=a["out"], num_generations=a["group_size"], per_device_train_batch_size=a["group_size"],
                     gradient_accumulation_steps=1, max_completion_length=a["max_new_tokens"], beta=a["beta"],
                     loss_type="grpo", num_iterations=1, temperature=1.0, learning_rate=a["lr"], max_steps=a["steps"],
                     max_grad_norm=1.0, logging_steps=1, save_strategy="no", report_to="none", use_cpu=not cuda,
                     bf16=cuda, seed=a["seed"], gradient_checkpointing=a["gc"])
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(a["model"])
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok,
                          callbacks=[Timer()])
    trainer.train()
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps({{"step_times": times, "peak_gb": peak / 2**30}}))
""")


def local_model(args):
    """A plain local folder of the model (the bundled GGUF dequantised and saved once), or a random Qwen2.5-3B."""
    import torch
    import transparent_grpo as tg
    if args.random_qwen_3b:
        from transformers import AutoModelForCausalLM, Qwen2Config
        folder = os.path.join(tempfile.gettempdir(), f"tg-bench-random-qwen2.5-3b-{args.layers}l")
        if not os.path.exists(os.path.join(folder, "config.json")):
            from transformers import AutoTokenizer  # any tokenizer with a chat template will do
            tok = tg.load_model("bundled:", torch.float32)[0] if args.tokenizer == "bundled" else \
                AutoTokenizer.from_pretrained(args.tokenizer)
            config = Qwen2Config(vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                                 num_hidden_layers=args.layers,
                                 num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True,
                                 max_position_embeddings=32768, rope_theta=1e6, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
            with torch.device("cuda" if torch.cuda.is_available() else "cpu"):           # random init is fast there
                AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
            torch.cuda.empty_cache()                                   # leave the GPU to the systems measured
            tok.save_pretrained(folder)
        return folder
    gguf = args.model == "bundled" or args.model.endswith(".gguf")
    if not gguf:
        return args.model
    name = "smollm2-135m" if args.model == "bundled" else os.path.basename(args.model)[:-5]
    folder = os.path.join(tempfile.gettempdir(), f"tg-bench-{name}")                    # TRL reads a plain folder
    if not os.path.exists(os.path.join(folder, "config.json")):
        tok, model = tg.load_model("bundled:" if args.model == "bundled" else args.model, torch.float32)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    return folder


def run_ours(args, model, work, sampler="fast"):
    cmd = [sys.executable, os.path.join(ROOT, "transparent_grpo.py"), "--model", model, "--sampler", sampler,
           "--worked_examples", "0", "--truncation_penalty", "0", "--consistency_bonus", "0", "--advantage", "zscore",
           "--entropy_target", "0", "--task", "problem", "--eval_size", "0", "--dtype", args.dtype, "--group_size",
           str(args.group_size), "--prompts_per_step", "1", "--max_new_tokens", str(args.max_new_tokens), "--beta",
           str(args.beta), "--learning_rate", str(args.lr), "--inner_epochs", "1", "--temperature", "1.0",
           "--num_steps", str(args.steps), "--seed", str(args.seed), "--max_grad_norm", "1.0",
           "--output_dir", os.path.join(work, "out"), "--log_dir", work, "--run_name", f"ours-{sampler}",
           "--gradient_checkpointing", str(args.gradient_checkpointing)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(p.stdout[-3000:] + p.stderr[-3000:])
    rows = [json.loads(ln) for ln in open(os.path.join(work, f"ours-{sampler}.jsonl"))]
    return {"step_times": [r["time/step"] for r in rows], "peak_gb": max(r["perf/peak_mem_gb"] for r in rows),
            "generate_s": statistics.median(r["time/generate"] for r in rows[2:] or rows),
            "tokens": statistics.median(r["completion/len_max"] for r in rows[2:] or rows)}


def floor(model):
    """Seconds to read the fp32 weights once, at the memory bandwidth measured here (the best of 5 sums of 1 GiB;
    on the GPU when there is one)."""
    import time, torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cuda = torch.cuda.is_available()
    x = torch.ones(2 ** 28, device="cuda" if cuda else "cpu")                  # 1 GiB of fp32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    x.sum(), sync()
    best = min((lambda t: (x.sum(), sync(), time.time() - t)[2])(time.time()) for _ in range(5))
    with torch.device("meta"):                                                 # count parameters, allocate nothing
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).parameters())
    return params * 4 / (2 ** 30 / best), 2 ** 30 / best / 1e9, params


def run_trl(args, model, work):
    spec = dict(model=model, group_size=args.group_size, max_new_tokens=args.max_new_tokens, beta=args.beta,
                lr=args.lr, steps=args.steps, seed=args.seed, out=os.path.join(work, "trl"),
                gc=args.gradient_checkpointing)
    code = TRL_RUNNER.format(root=ROOT, args=json.dumps(spec))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not line:
        sys.exit(p.stdout[-3000:] + p.stderr[-3000:])
    return json.loads(line[-1][7:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled", help="'bundled' (SmolLM2-135M), a .gguf, a local folder or a hub id")
    ap.add_argument("--random_qwen_3b", action="store_true", help="a random-weight Qwen2.5-3B-shaped model")
    ap.add_argument("--tokenizer", default="bundled", help="--random_qwen_3b: the bundled one or a tokenizer folder")
    ap.add_argument("--layers", type=int, default=36, help="--random_qwen_3b: 36 = Qwen2.5-3B; fewer: a dry run")
    ap.add_argument("--group_size", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--beta", type=float, default=0.02)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="fp32", help="ours: fp32 (as TRL on CPU) or amp (bf16 autocast; a bf16 CPU)")
    ap.add_argument("--systems", default="ours,ours_plain,trl")
    ap.add_argument("--gradient_checkpointing", action="store_true", help="in both systems (G=16 x 512 on one GPU)")
    args = ap.parse_args()
    model = local_model(args)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for name in args.systems.split(","):
            run = {"ours": run_ours, "ours_plain": lambda *a: run_ours(*a, sampler="plain"), "trl": run_trl,
                   "ours_compiled": lambda *a: run_ours(*a, sampler="compiled")}[name]
            try:
                results[name] = run(args, model, work)
            except SystemExit as err:                                      # report it, go on with the others
                print(f"{name:>5}: FAILED\n{err}", flush=True)
                continue
            r = results[name]
            r["median_step_s"] = statistics.median(r["step_times"][2:] or r["step_times"])
            print(f"{name:>5}: median step {r['median_step_s']:.1f} s (steps 2..{args.steps - 1}: "
                  f"{', '.join(f'{t:.1f}' for t in r['step_times'][2:])}), peak memory {r['peak_gb']:.2f} GB", flush=True)
    for name in ("ours", "ours_compiled"):
        if {name, "trl"} <= results.keys():
            o, t = results[name], results["trl"]
            print(f"ratio {name}/TRL: step time {o['median_step_s'] / t['median_step_s']:.2f}x, "
                  f"peak memory {o['peak_gb'] / t['peak_gb']:.2f}x")
    for name in ("ours", "ours_compiled"):
        if {name, "ours_plain"} <= results.keys():
            f, h = results[name], results["ours_plain"]
            print(f"generate: {name} {f['generate_s']:.1f} s, --sampler plain {h['generate_s']:.1f} s "
                  f"({h['generate_s'] / f['generate_s']:.2f}x faster)")
    if "ours" in results:
        read_s, gbps, params = floor(model)
        steps = results["ours"]["tokens"]
        print(f"floor: {steps:.0f} decode steps x {params * 4 / 1e9:.2f} GB of fp32 weights at {gbps:.1f} GB/s = "
              f"{steps * read_s:.1f} s; --sampler fast takes {results['ours']['generate_s'] / (steps * read_s):.1f}x that")
    print(json.dumps({"config": vars(args), "model_folder": model, **results}))


if __name__ == "__main__":
    main()
