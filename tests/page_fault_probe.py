"""Page faults of a CPU step, with glibc's default allocator settings and with keep_freed_memory() (§9).

    python tests/page_fault_probe.py [iterations]

Each variant runs in its own process: the bundled SmolLM2-135M, the CPU preset's prompt (worked example, 420 tokens),
8 rows; per iteration: the fast sampler (96 tokens, no EOS), the reference's log-prob pass, the policy's pass, its
backward and an AdamW step on 8 fixed completions of 120-160 tokens. Prints time, kernel time and minor page faults
per iteration, and checks that both variants compute the same log-probs and gradients to the bit. Not collected by
pytest (the file name does not start with test_).
"""
import json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = r"""
import copy, hashlib, json, resource, sys, time, torch
from types import SimpleNamespace
sys.path.insert(0, {root!r})
import transparent_grpo as tg
if {keep}:
    assert tg.keep_freed_memory()
torch.manual_seed(0)
torch.set_num_threads(2)
tok, model = tg.load_model("bundled:SmolLM2-135M-Instruct", torch.float32)
ref = copy.deepcopy(model).eval().requires_grad_(False)
prompt = tok.apply_chat_template(tg.toy_messages(True, "main"), add_generation_prompt=True, return_tensors="pt",
                                 return_dict=True)["input_ids"]
P, N, T = prompt.shape[1], 8, 160
comp = torch.randint(100, 20000, (N, T), generator=torch.Generator().manual_seed(0))
mask = (torch.arange(T)[None] < torch.tensor([150, 140, 160, 120, 155, 145, 130, 158])[:, None]).float()
seqs = torch.cat([prompt.expand(N, -1), comp], 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=False)
digest = hashlib.sha256()
for i in range({iters}):
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    torch.manual_seed(i)
    ids = tg.sample(model.eval(), prompt, N, SimpleNamespace(sampler="fast", max_new_tokens=96, temperature=0.8), [-1],
                    tok.pad_token_id)
    t1 = time.time()
    with torch.no_grad():
        ref_lp = tg.token_logprobs(ref, seqs, P, mask, 0.8, prompt_memo={{}}, entropy=None)[0]
    lp = tg.token_logprobs(model.train(), seqs, P, mask, 0.8, entropy="value")[0]
    ((lp - ref_lp) * mask).sum().backward()
    opt.step(), opt.zero_grad()
    t2, r1 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    digest.update(ids.numpy().tobytes()), digest.update(lp.detach().numpy().tobytes())
    print(json.dumps(dict(sample_s=t1 - t0, passes_s=t2 - t1, sys_s=r1.ru_stime - r0.ru_stime,
                          faults=r1.ru_minflt - r0.ru_minflt, maxrss_gb=r1.ru_maxrss / 2 ** 20)), flush=True)
print("DIGEST " + digest.hexdigest())
"""


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    digests = {}
    for name, keep in (("glibc defaults", False), ("keep_freed_memory()", True)):
        p = subprocess.run([sys.executable, "-c", PROBE.format(root=ROOT, keep=keep, iters=iters)], capture_output=True,
                           text=True)
        if p.returncode:
            sys.exit(p.stderr[-3000:])
        print(f"== {name}")
        for ln in p.stdout.splitlines():
            if ln.startswith("{"):
                r = json.loads(ln)
                print(f"sample {r['sample_s']:.2f} s | log-prob passes + backward + AdamW {r['passes_s']:.2f} s | "
                      f"kernel {r['sys_s']:.1f} s | {r['faults']:>8} page faults | max RSS {r['maxrss_gb']:.2f} GB")
            elif ln.startswith("DIGEST "):
                digests[name] = ln.split()[1]
    print("same samples, log-probs (and so gradients) in both:", len(set(digests.values())) == 1)


if __name__ == "__main__":
    main()
