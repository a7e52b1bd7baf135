"""Run one recipe over several seeds and judge it: a table (best 5-step mean, first step at >= 0.8, minutes) and a
pass rate. One seed is an anecdote; report a recipe over >= 8.

    python tests/tools/seeds.py --seeds 0-7 --name defaults                      # the defaults, one run at a time (CPU)
    python tests/tools/seeds.py --seeds 0-7 --parallel 2 --stop_passed --name d  # a run stops once it passes
    python tests/tools/seeds.py --seeds 0-7 --parallel 8 --name gpu -- --model /tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
    python tests/tools/seeds.py --seeds 0-7 --parallel 8 --zero2 --name z2 -- ...  # ZeRO-2 bf16, one process a run
    python tests/tools/seeds.py --table logs/defaults-seed*.jsonl                # the table of runs already made
    python tests/tools/seeds.py --plot img/seeds.png logs/defaults-seed*.jsonl  # a thin line per seed, the median bold
    python tests/tools/seeds.py --curves logs/<run>.jsonl                        # one run: img/<run>.png, four panels
    python tests/tools/seeds.py --samples logs/<run>.samples.jsonl.gz --every 5  # what its completions' last lines say
    python tests/tools/seeds.py --held_out img/h.png logs/*-seed*.eval.jsonl     # held-out accuracy before and after

Everything after `--` goes to transparent_grpo.py. Runs side by side share the machine: on CPU each gets its share
of the cores (pinned); on a GPU they share the one device. A run is judged on the problem's own steps (a curriculum's
halves are left out): it passes when 5 of them in a row average >= 0.8 (--threshold).
"""
import argparse, collections, gzip, json, os, shutil, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def seeds_of(text):  # "0-7" or "0,3,5" or "8-11,20"
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def rows_of(path):  # a JSONL log, or one gzipped (.jsonl.gz)
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def step_logs(paths):  # a glob such as logs/dir/*.jsonl.gz also matches the --log_samples and evaluation files: left out
    return [p for p in paths if not any(f".{kind}.jsonl" in os.path.basename(p) for kind in ("samples", "eval"))]


def eval_rows(jsonl_path):  # the evaluation rows beside a run's JSONL (<run>.eval.jsonl[.gz]), [] if it has none
    base = jsonl_path.split(".jsonl")[0]
    found = [p for p in (base + ".eval.jsonl", base + ".eval.jsonl.gz") if os.path.exists(p)]
    return rows_of(found[0]) if found else []


def judge(path, threshold=0.8, window=5):
    """{run, steps, best, first, minutes_to_first, minutes}: the best mean of `window` problem steps in a row, the step
    that ends the first such window at >= threshold, and the minutes of step time up to it and in all."""
    rows = rows_of(path)
    minutes, m = [], 0.0
    for r in rows:
        m += r.get("time/step", 0.0) / 60
        minutes.append(m)
    main = [(i, r["reward/mean"]) for i, r in enumerate(rows) if "reward/mean" in r]
    means = [(main[j + window - 1][0], sum(v for _, v in main[j:j + window]) / window)
             for j in range(len(main) - window + 1)]
    hit = next(((i, v) for i, v in means if v >= threshold - 1e-9), None)
    return {"run": os.path.basename(path).split(".jsonl")[0], "steps": len(rows),
            "best": max((v for _, v in means), default=float("nan")),
            "first": rows[hit[0]]["step"] if hit else None,
            "minutes_to_first": minutes[hit[0]] if hit else None, "minutes": minutes[-1] if rows else 0.0}


def table(paths, threshold=0.8):
    results = [judge(p, threshold) for p in paths]
    lines = [f"| run | steps | best 5-step mean | first step at >= {threshold} | minutes to it | minutes of steps |",
             "|---|---|---|---|---|---|"]
    for r in results:
        first = "-" if r["first"] is None else str(r["first"])
        to = "-" if r["minutes_to_first"] is None else f"{r['minutes_to_first']:.1f}"
        lines.append(f"| {r['run']} | {r['steps']} | {r['best']:.2f} | {first} | {to} | {r['minutes']:.1f} |")
    passed = [r for r in results if r["first"] is not None]
    times = sorted(r["minutes_to_first"] for r in passed)
    lines.append(f"\npass rate: {len(passed)}/{len(results)} reach a 5-step mean >= {threshold}"
                 + (f"; median minutes of steps to it (passing runs): {statistics.median(times):.1f}" if times else ""))
    return "\n".join(lines), results


def plot(out, paths, threshold=0.8):
    """The problem's task reward per step: a thin line per run, the median over runs bold."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.2))
    curves = {}
    for p in paths:
        pts = [(r["step"], r["reward/mean"]) for r in rows_of(p) if "reward/mean" in r]
        curves[p] = dict(pts)
        ax.plot(*zip(*pts), lw=0.8, alpha=0.45)
    steps = sorted(set().union(*curves.values()))
    med = [(s, statistics.median(c[s] for c in curves.values() if s in c)) for s in steps
           if sum(s in c for c in curves.values()) * 2 > len(curves)]                     # most runs still going
    ax.plot(*zip(*med), color="black", lw=2.2, label=f"median of {len(paths)} seeds")
    ax.axhline(threshold, color="red", ls=":", lw=1)
    ax.set_xlabel("step"), ax.set_ylabel("task reward (mean of the group)"), ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3), ax.legend(loc="lower right")
    passed = sum(judge(p, threshold)["first"] is not None for p in paths)
    ax.set_title(f"{passed}/{len(paths)} seeds reach a 5-step mean >= {threshold}", fontsize=10)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.tight_layout(), fig.savefig(out, dpi=100)
    return out


def curves(jsonl_path, out_dir=os.path.join(ROOT, "img")):
    """One run's task reward, the share of completions earning each credit, KL and entropy, length per step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    try:
        rows = rows_of(jsonl_path)
    except (OSError, ValueError):
        rows = []
    if not rows or not all("step" in r and "time/step" in r for r in rows):
        sys.exit(f"error: {jsonl_path} is not a JSONL log of transparent_grpo.py")
    minutes = sum(r["time/step"] for r in rows) / 60
    evals = eval_rows(jsonl_path)
    panels = [("task reward (o: held-out, greedy)", ["reward/mean", "reward/max"], []),  # (title, left, right: dotted)
              ("share of completions earning each credit", sorted({k for r in rows for k in r
                                                                   if k.startswith("credit/")}), []),
              ("KL per token (dotted: entropy, right)", ["kl/k1", "kl/k3"], ["entropy"]),
              ("completion length (dotted: truncated share, right)", ["completion/len_mean"],
               ["completion/truncated_frac"])]
    fig, axes = plt.subplots(1, 4, figsize=(22, 4.5))
    for ax, (title, left, right) in zip(axes, panels):
        for side, keys in ((ax, left), (ax.twinx() if right else None, right)):
            for i, k in enumerate(k for k in keys if any(k in r for r in rows)):
                side.plot(*zip(*[(r["step"], r[k]) for r in rows if k in r]), label=k, marker=".", ms=3,
                          ls=":" if side is not ax else "-", color=plt.cm.tab20(i / 11) if len(keys) > 2 else None)
        if ax is axes[0]:                                           # the evaluations beside the training reward
            for k, color in (("eval/accuracy", "black"), ("eval/reward", "grey")):
                pts = [(r["step"], r[k]) for r in evals if k in r]
                if pts:
                    ax.plot(*zip(*pts), marker="o", ls="--", color=color, label=f"held-out {k[5:]}")
        ax.set_title(title), ax.set_xlabel("step"), ax.grid(alpha=0.3), ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{os.path.basename(jsonl_path)}: {len(rows)} steps, {minutes:.1f} min of step time")
    out = os.path.join(out_dir, os.path.basename(jsonl_path).split(".jsonl")[0] + ".png")
    os.makedirs(out_dir, exist_ok=True), fig.tight_layout(), fig.savefig(out, dpi=90)
    return out


def held_out(out, paths):
    """Held-out greedy accuracy per evaluation, a line per run (<name>-seed<S>.eval.jsonl), a colour per <name>; a
    table of each run's accuracy before the first step and after the last. out: a .png, or None for the table only."""
    groups = collections.defaultdict(list)
    for p in paths:
        groups[os.path.basename(p).split(".eval.jsonl")[0].rsplit("-seed", 1)[0]].append((p, rows_of(p)))
    lines = ["| runs | seed | held-out accuracy before | after | change (points) | reward before | after |",
             "|---|---|---|---|---|---|---|"]
    for name, runs in sorted(groups.items()):
        for p, rows in runs:
            first, last = rows[0], rows[-1]
            seed = os.path.basename(p).split(".eval.jsonl")[0].rsplit("-seed", 1)[-1]
            lines.append(f"| {name} | {seed} | {first['eval/accuracy']:.3f} | {last['eval/accuracy']:.3f} | "
                         f"{100 * (last['eval/accuracy'] - first['eval/accuracy']):+.1f} | {first['eval/reward']:.3f} | "
                         f"{last['eval/reward']:.3f} |")
    if out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for i, (name, runs) in enumerate(sorted(groups.items())):
            for j, (p, rows) in enumerate(runs):
                for ax, k in zip(axes, ("eval/accuracy", "eval/reward")):
                    ax.plot(*zip(*[(r["step"], r[k]) for r in rows]), marker="o", color=plt.cm.tab10(i),
                            label=name if j == 0 else None, alpha=0.8)
        for ax, title in zip(axes, ("held-out accuracy (greedy, the final box)", "held-out reward (partial credit)")):
            ax.set_title(title, fontsize=10), ax.set_xlabel("step"), ax.set_ylim(0, 1.02), ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        fig.tight_layout(), fig.savefig(out, dpi=100)
        lines.append(out)
    return "\n".join(lines)


def last_lines(path, every=5, top=3):
    """What a run wrote (its --log_samples file): every `every` steps, the mean task reward and the `top` last lines
    written most often, each with how many of the step's completions end in it (a line over 100 characters: its last
    97, after "...": where the completions stop is what tells them apart)."""
    try:
        rows = rows_of(path)
    except (OSError, ValueError):
        rows = []
    if not rows or not all({"step", "reward", "text"} <= set(r) for r in rows):
        sys.exit(f"error: {path} is not a --log_samples file of transparent_grpo.py")
    out = []
    for r in (r for r in rows if r["step"] % every == 0 or r is rows[-1]):
        # a long line: shown by its end, where it stops
        lines = ((t.strip().splitlines() or [""])[-1].strip() for t in r["text"])
        ends = collections.Counter(line if len(line) <= 100 else "..." + line[-97:] for line in lines)
        out.append(f"step {r['step']:4d} | reward {sum(r['reward']) / len(r['reward']):.2f} | "
                   + " | ".join(f"{n}/{len(r['text'])} {line!r}" for line, n in ends.most_common(top)))
    return "\n".join(out)


def run(seeds, name, flags, parallel, log_dir, zero2, port=29600, stop_passed=None,
        script=os.path.join(ROOT, "transparent_grpo.py")):
    """Start the seeds' runs, `parallel` at a time; return their JSONL paths (and print each one's fate). With
    `stop_passed` (a threshold) a run is stopped once it passes, and the next seed takes its place."""
    gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0 if shutil.which("nvidia-smi") \
        else False                                                      # GPU runs share the device, not pinned cores
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    share = max(1, len(cores) // parallel)
    pending, live, paths, stopped = list(seeds), {}, [], {}
    while pending or live:
        while pending and len(live) < parallel:
            seed, slot = pending.pop(0), next(k for k in range(parallel) if k not in {s for s, *_ in live.values()})
            run_name = f"{name}-seed{seed}"
            launch = [sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--zero_stage", "2",
                      "--mixed_precision", "bf16", "--num_processes", "1", "--main_process_port", str(port + slot)] \
                if zero2 else [sys.executable]
            cmd = [*launch, script, *flags, "--seed", str(seed),
                   "--run_name", run_name, "--log_dir", log_dir]
            env = dict(os.environ, OMP_NUM_THREADS=str(share), TORCHINDUCTOR_COMPILE_THREADS="1",
                       TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
            mine = cores[slot * share:(slot + 1) * share] if parallel > 1 and not gpu else None
            err = open(os.path.join(log_dir, f"{run_name}.console"), "w")
            p = subprocess.Popen(cmd, env=env, stdout=err, stderr=subprocess.STDOUT, cwd=ROOT,
                                 preexec_fn=(lambda c=mine: os.sched_setaffinity(0, c)) if mine else None)
            paths.append(os.path.join(log_dir, f"{run_name}.jsonl"))
            live[p] = (slot, seed, err, paths[-1])
            print(f"started seed {seed}: {' '.join(cmd)}", flush=True)
        time.sleep(2)
        for p, (_, _, _, log) in live.items():                           # --stop_passed: a run that passed stops
            if stop_passed is not None and p not in stopped and p.poll() is None and os.path.exists(log):
                try:
                    first = judge(log, stop_passed)["first"]
                except ValueError:                                      # a line still being written
                    first = None
                if first is not None:
                    stopped[p] = first
                    p.terminate()
        for p in [p for p in live if p.poll() is not None]:
            slot, seed, err, _ = live.pop(p)
            err.close()
            if p in stopped:
                print(f"seed {seed} passed at step {stopped[p]}: stopped (--stop_passed)", flush=True)
                os.remove(err.name)
                continue
            print(f"seed {seed} finished with exit code {p.returncode}", flush=True)
            if p.returncode != 0:
                print("".join(open(err.name).readlines()[-15:]), flush=True)
            else:
                os.remove(err.name)                                     # the .log holds what it printed
    return paths


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ours, flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", default="0-7", help="e.g. 0-7 or 0,3,5")
    ap.add_argument("--name", default="seeds", help="runs are named <name>-seed<S>")
    ap.add_argument("--parallel", type=int, default=1, help="runs side by side (CPU: each pinned to its cores)")
    ap.add_argument("--zero2", action="store_true", help="each run under accelerate launch, DeepSpeed ZeRO-2, bf16")
    ap.add_argument("--log_dir", default=os.path.join(ROOT, "logs"))
    ap.add_argument("--port", type=int, default=29600, help="--zero2: run k uses port + k")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--script", default=os.path.join(ROOT, "transparent_grpo.py"),
                    help="the trainer to run (e.g. a tool that changes one piece, then calls transparent_grpo.main)")
    ap.add_argument("--stop_passed", action="store_true", help="stop a run once it passes; the next seed starts")
    ap.add_argument("--table", nargs="+", metavar="JSONL", help="only print the table of these logs")
    ap.add_argument("--plot", nargs="+", metavar=("PNG", "JSONL"), help="draw these logs on one figure")
    ap.add_argument("--curves", metavar="JSONL", help="draw one run's four panels into img/<run>.png")
    ap.add_argument("--held_out", nargs="+", metavar=("PNG", "EVAL_JSONL"),
                    help="held-out accuracy of these <run>.eval.jsonl files: a table and a figure (PNG '-': none)")
    ap.add_argument("--samples", metavar="GZ", help="a --log_samples file: the last lines its completions wrote")
    ap.add_argument("--every", type=int, default=5, help="--samples: one step in this many (and the last)")
    args = ap.parse_args(ours)
    if args.curves:
        print(curves(args.curves))
        return 0
    if args.held_out:
        print(held_out(None if args.held_out[0] == "-" else args.held_out[0], args.held_out[1:]))
        return 0
    if args.samples:
        print(last_lines(args.samples, max(1, args.every)))
        return 0
    if args.plot:
        print(plot(args.plot[0], step_logs(args.plot[1:]), args.threshold))
        return 0
    if not args.table:
        os.makedirs(args.log_dir, exist_ok=True)
        paths = run(seeds_of(args.seeds), args.name, flags, max(1, args.parallel), args.log_dir, args.zero2, args.port,
                    args.threshold if args.stop_passed else None, os.path.abspath(args.script))
    paths = [p for p in step_logs(args.table or paths) if os.path.exists(p) and os.path.getsize(p)]
    text, results = table(paths, args.threshold)
    print(text)
    return 0 if paths else 1


if __name__ == "__main__":
    sys.exit(main())
