"""Pilot: greedy accuracy on the first 32 held-out instances with k = 1 (breakpoints at +-1), for each policy given.
    python tests/tools/eval_k1.py bundled:SmolLM2-135M-Instruct out/<run>/final ..."""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch, transparent_grpo as tg
from types import SimpleNamespace
from accelerate import Accelerator
easy = [p for p in tg.HELD_OUT if p.k == 1][:32]
print("k=1 held-out instances:", len([p for p in tg.HELD_OUT if p.k == 1]), "of", len(tg.HELD_OUT), "; evaluated", len(easy))
for name in sys.argv[1:]:
    t0 = time.time()
    cfg = tg.resolve(tg.Config(model=name), cuda=False)
    cfg.eval_size = len(easy)
    tok, model = tg.load_model(name, torch.float32)
    task = tg.TASKS["family"](cfg)
    task.held_out = easy
    run = SimpleNamespace(acc=Accelerator(cpu=True), model=model, tok=tok)
    m = tg.evaluate(run, task, cfg, tg.eos_ids(tok, model), 0)
    print(f"{name}: right {round(m['eval/accuracy'] * m['eval/n'])} of {m['eval/n']}, reward {m['eval/reward']:.3f}, "
          f"a {m['eval/credit/a']:.2f}, b {m['eval/credit/b']:.2f} | {time.time() - t0:.0f}s", flush=True)
