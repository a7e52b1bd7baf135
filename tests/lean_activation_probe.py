"""What autograd keeps for backward in one token_logprobs pass of the bundled SmolLM2-135M, stock and with the lean
MLP tail (§5, LeanMLPTail), and with a hand-written RMSNorm that keeps only its input (not built: README, Performance,
CPU). Prints the saved bytes (saved-tensor hooks, distinct storages, parameters aside), the pass times, and whether
log-probs and every gradient equal the stock model's to the bit. Not a test: python tests/lean_activation_probe.py
"""
import copy, functools, os, sys, time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transparent_grpo as tg  # noqa: E402
from test_memory import saved_bytes  # noqa: E402  (the same count as the tests')


class RecomputeNorm(torch.autograd.Function):  # f(x) keeping x only; backward runs f again and differentiates it
    @staticmethod
    def forward(ctx, f, x, w):
        ctx.f = f
        ctx.save_for_backward(x, w)
        return f(x)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            x_ = x.detach().requires_grad_()
            y = ctx.f(x_)
        dx, dw = torch.autograd.grad(y, (x_, w), dy)
        return None, dx, dw


def lean_norm(m, x):
    f = functools.partial(type(m).forward, m)
    return RecomputeNorm.apply(f, x, m.weight) if torch.is_grad_enabled() else f(x)


def main():
    torch.manual_seed(0)
    base = tg.load_model("bundled:", torch.float32)[1]
    P, T, N = 60, 128, 8                                  # 8 rows after a 60-token prompt: 7 of 100 tokens, one of 128
    ids = torch.cat([torch.randint(0, 1000, (1, P)).expand(N, -1), torch.randint(0, 1000, (N, T))], 1)
    mask = torch.ones(N, T)
    mask[1:, 100:] = 0
    res = {}
    for variant in ("stock", "lean MLP tail", "lean MLP tail + norms"):
        m = copy.deepcopy(base).train()
        if variant != "stock":
            tg.lean_mlps(m)
        if variant.endswith("norms"):
            for mod in m.modules():
                if type(mod).__name__.endswith("RMSNorm"):
                    mod.forward = functools.partial(lean_norm, mod)
        t0 = time.time()
        (lp, _, _), nbytes = saved_bytes(m, lambda: tg.token_logprobs(m, ids, P, mask, 0.8, entropy="value"))
        t1 = time.time()
        (lp * mask).sum().backward()
        t2 = time.time()
        res[variant] = lp.detach(), {n: p.grad for n, p in m.named_parameters()}
        same = [torch.equal(res["stock"][0], lp.detach()),
                all(torch.equal(res["stock"][1][n], g) for n, g in res[variant][1].items())]
        print(f"{variant:22s} saved {nbytes / 1e9:.3f} GB | forward {t1 - t0:.2f} s, backward {t2 - t1:.2f} s | "
              f"log-probs bitwise equal: {same[0]}, every gradient bitwise equal: {same[1]}", flush=True)


if __name__ == "__main__":
    main()
