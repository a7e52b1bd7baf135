"""Memory of the log-prob pass: no full-vocabulary fp32 tensors (measured peak against the naive way)."""
import os
import subprocess
import sys

import pytest
import torch

import transparent_grpo as tg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = r"""
import resource, sys, torch
sys.path.insert(0, {root!r})
import transparent_grpo as tg
torch.manual_seed(0)
torch.set_num_threads(2)
V, B, T, H = 151936, 4, 512, 64                          # Qwen2.5's vocabulary, 4 x 512 completion tokens
head = torch.nn.Linear(H, V, bias=False)
h = torch.randn(B, T, H, requires_grad=True)
y, mask = torch.randint(0, V, (B, T)), torch.ones(B, T)

def peak(ours):  # the resident high-water mark above what was resident before it; ours first, the larger after
    base = int(open("/proc/self/statm").read().split()[1]) * 4096
    with torch.set_grad_enabled({grad}):
        if ours:
            lp = tg.sampled_logprobs(h, head, y, mask, 0.7)[0]
        else:
            lp = torch.log_softmax(head(h).float() / 0.7, -1).gather(-1, y[..., None]).squeeze(-1)
        if {grad}:
            lp.sum().backward()
    h.grad = head.weight.grad = None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
print(peak(True), peak(False))
"""


def peak_bytes(grad):  # (ours, naive), one process: one interpreter start and import instead of two
    code = PROBE.format(root=ROOT, grad=grad)
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}  # one malloc arena: the peak does not depend on the machine's load
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return map(int, p.stdout.strip().splitlines()[-1].split())


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "forward+backward"])
def test_logprob_peak_memory_is_a_quarter_of_naive(grad):
    ours, naive = peak_bytes(grad)
    print(f"peak extra memory: ours {ours / 2**20:.0f} MiB, naive {naive / 2**20:.0f} MiB, ratio {ours / naive:.3f}")
    assert naive > 2 * 4 * 512 * 151936 * 4 * 0.9           # naive holds >= two [4, 512, V] fp32 tensors
    assert ours <= 0.25 * naive
