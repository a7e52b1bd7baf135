"""What each speed or memory piece of §10 buys: the CPU defaults for a few steps with every piece, then with one
piece switched off at a time (each variant in its own process, the same seed), side by side in one table.

    python tests/tools/pieces.py                 # 4 steps a variant; the median of steps 1..3
    python tests/tools/pieces.py --steps 6 --only all,no_shared_prompt
    python tests/tools/pieces.py --flags "--model qwen.gguf --max_new_tokens 128"   # another recipe's pieces

A piece is switched off by replacing it with what §4/§5 do without it, so the numbers of a run stay the same up to
rounding; the table gives the median step, its generate and log-prob + update parts, and the peak RSS.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VARIANTS = {  # name: (what it switches off, code run before train(), extra flags)
    "all": ("nothing", "", []),
    "plain_sampler": ("fast_sample (generate_many): §4's plain loop instead", "", ["--sampler", "plain"]),
    "no_in_place_kv": ("InPlaceKV: the prompt's cache repeated into the rows, grown by torch.cat each token",
                       "tg.rows_cache = lambda prefix, n, room: tg.repeat_cache(prefix, n)", []),
    "no_shared_prompt": ("shared_prompt_hidden: one forward over prompt + completion per row",
                         "tg.shared_prompt_hidden = lambda *a, **k: None", []),
    "amp": ("fp32 matmuls: --dtype amp instead (bf16 autocast; the bf16 twin samples), a change of numbers", "",
            ["--dtype", "amp"]),
}
RUN = """
import sys
sys.argv = ["transparent_grpo.py", *{flags!r}]
sys.path.insert(0, {root!r})
import transparent_grpo as tg
{patch}
tg.main()
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=",".join(VARIANTS))
    ap.add_argument("--flags", default="", help="more flags for every variant (e.g. another --model)")
    ap.add_argument("--log", default=None, help="also write the table to this file")
    args = ap.parse_args()
    rows, tmp = [], tempfile.mkdtemp()
    for name in args.only.split(","):
        what, patch, extra = VARIANTS[name]
        flags = ["--num_steps", str(args.steps), "--seed", str(args.seed), "--run_name", name, "--log_dir", tmp,
                 "--output_dir", tmp, "--eval_size", "0", *args.flags.split(), *extra]
        p = subprocess.run([sys.executable, "-c", RUN.format(flags=flags, root=ROOT, patch=patch)], cwd=ROOT,
                           capture_output=True, text=True)
        if p.returncode:
            print(f"{name}: failed\n{p.stderr[-2000:]}")
            continue
        log = [json.loads(ln) for ln in open(os.path.join(tmp, f"{name}.jsonl"))][1:]   # step 0 warms up
        med = lambda k: statistics.median(r[k] for r in log)
        rows.append((name, what, med("time/step"), med("time/generate"), med("time/logprobs") + med("time/update"),
                     max(r["perf/peak_mem_gb"] for r in log), [round(r["reward/mean"], 4) for r in log]))
        print(rows[-1], flush=True)
    base = rows[0] if rows and rows[0][0] == "all" else None
    lines = ["| variant | switched off | median step | generate | log-probs + update | peak RSS | step vs all |",
             "|---|---|---|---|---|---|---|"]
    for name, what, step, gen, rest, peak, _ in rows:
        ratio = f"{step / base[2]:.2f}x" if base else "-"
        lines.append(f"| {name} | {what} | {step:.1f} s | {gen:.1f} s | {rest:.1f} s | {peak:.2f} GB | {ratio} |")
    text = "\n".join(lines)
    print(text)
    if args.log:
        open(args.log, "a").write(text + "\n")


if __name__ == "__main__":
    main()
