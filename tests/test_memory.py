"""Memory of the log-prob pass: no full-vocabulary fp32 tensors (measured peak against the naive way), and the lean
MLP tail (§10) keeps two [tokens, I] tensors a layer less for backward while every number stays the same."""
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
base = int(open("/proc/self/statm").read().split()[1]) * 4096  # resident bytes now, inputs allocated
with torch.set_grad_enabled({grad}):
    if {ours}:
        lp = tg.sampled_logprobs(h, head, y, mask, 0.7)[0]
    else:
        lp = torch.log_softmax(head(h).float() / 0.7, -1).gather(-1, y[..., None]).squeeze(-1)
    if {grad}:
        lp.sum().backward()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base)
"""


def peak_bytes(ours, grad):
    code = PROBE.format(root=ROOT, ours=ours, grad=grad)
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}  # one malloc arena: the peak does not depend on the machine's load
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return int(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "forward+backward"])
def test_logprob_peak_memory_is_a_quarter_of_naive(grad):
    ours, naive = peak_bytes(True, grad), peak_bytes(False, grad)
    print(f"peak extra memory: ours {ours / 2**20:.0f} MiB, naive {naive / 2**20:.0f} MiB, ratio {ours / naive:.3f}")
    assert naive > 2 * 4 * 512 * 151936 * 4 * 0.9           # naive holds >= two [4, 512, V] fp32 tensors
    assert ours <= 0.25 * naive


def saved_bytes(model, fn):
    """Bytes of the distinct storages, the model's parameters (and views of them) aside, that autograd keeps for
    backward while fn() runs."""
    seen, total, alive = {p.untyped_storage().data_ptr() for p in model.parameters()}, [0], []

    def pack(t):
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total[0] += t.untyped_storage().nbytes()
        alive.append(t)  # no storage is freed while we count: a new one cannot reuse a counted address
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total[0]


@pytest.mark.parametrize("arch", ["tiny_model", "tiny_qwen"])
def test_lean_mlp_keeps_every_number_and_two_tensors_a_layer_less(arch, request):
    """§10 LeanMLPTail: the same log-probs, the same gradients to the bit, and autograd keeps exactly act(g) and
    act(g) * u less per MLP ([tokens, I] each); sampling (no graph) takes the usual path and draws the same tokens."""
    import functools
    from transformers import AutoModelForCausalLM
    folder = request.getfixturevalue(arch)
    plain, lean = (AutoModelForCausalLM.from_pretrained(folder).train() for _ in range(2))
    mlps = [m for m in lean.modules() if hasattr(m, "gate_proj")]
    for m in mlps:
        m.forward = functools.partial(tg.lean_mlp, m)
    torch.manual_seed(0)
    B, P, T = 3, 5, 9
    ids = torch.cat([torch.randint(6, plain.config.vocab_size, (1, P)).expand(B, -1),
                     torch.randint(6, plain.config.vocab_size, (B, T))], 1)                  # one prompt, B rows
    mask, w = torch.ones(B, T), torch.randn(B, T)
    runs = []
    for model in (plain, lean):
        lp, nbytes = saved_bytes(model, lambda: tg.token_logprobs(model, ids, P, mask, 0.7, entropy="grad"))
        ((lp[0] * w).sum() + lp[1].sum()).backward()                    # log-probs and entropies both reach the loss
        runs.append((lp[0].detach(), nbytes, {n: p.grad for n, p in model.named_parameters()}))
    (lp_a, bytes_a, grads_a), (lp_b, bytes_b, grads_b) = runs
    assert torch.equal(lp_a, lp_b)
    assert grads_a.keys() == grads_b.keys() and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
    tokens = P + B * (T - 1)                                            # the prompt once, then each row's pass
    assert bytes_a - bytes_b == len(mlps) * 2 * tokens * plain.config.intermediate_size * 4
    draws = []
    for model in (plain, lean):
        torch.manual_seed(1)
        cfg = tg.Config(max_new_tokens=6, temperature=1.0, sampler="fast")
        with torch.no_grad():
            draws.append(tg.sample(model, ids[:1, :P], 4, cfg, [1], 1))
    assert torch.equal(draws[0], draws[1])


def test_setup_leans_the_policy_mlps_on_cpu_in_fp32_only(tiny_model, tmp_path, monkeypatch):
    """setup() gives the policy's MLPs lean_mlp on CPU without mixed precision; never the reference's (no backward)."""
    def leaned(model):
        return [getattr(m.forward, "func", None) is tg.lean_mlp for m in model.modules() if hasattr(m, "gate_proj")]
    from accelerate.state import AcceleratorState
    for precision, expect in (("no", True), ("bf16", False)):
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", precision)
        AcceleratorState._reset_state(True)                             # a new precision needs a fresh state
        cfg = tg.resolve(tg.Config(model=tiny_model, group_size=2, max_new_tokens=4, num_steps=1,
                                   output_dir=str(tmp_path), log_dir=str(tmp_path), run_name="lean" + precision),
                         cuda=False)
        run = tg.setup(cfg)
        assert leaned(tg.unwrap(run.model)) == [expect] * 2 and leaned(run.ref) == [False] * 2
    AcceleratorState._reset_state(True)


def test_lean_mlps_leaves_look_alikes_and_the_seed_alone(tiny_model):
    """lean_mlps() takes only MLPs whose forward is down(act(gate(x)) * up(x)), checked on a random input drawn from
    its own generator: a module with the same layers and another forward keeps it, and the run's RNG is not moved."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    odd = model.model.layers[0].mlp
    odd.forward = lambda x: odd.down_proj(odd.act_fn(odd.up_proj(x)) * odd.gate_proj(x))  # gate and up swapped
    torch.manual_seed(3)
    state = torch.get_rng_state()
    tg.lean_mlps(model)
    assert torch.equal(torch.get_rng_state(), state)
    assert [getattr(m.forward, "func", None) is tg.lean_mlp for m in model.modules() if hasattr(m, "gate_proj")] \
        == [False, True]
