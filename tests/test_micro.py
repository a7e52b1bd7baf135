"""--micro_batch_size: a minibatch in passes of fewer rows (memory, not math). Each pass's loss is weighted by its share
of the minibatch, so the passes' gradients add up to the whole minibatch's: checked in float64 for every aggregation,
with groups of different prompt and completion lengths (a wrong weight, e.g. rows for a token mean, fails)."""
import contextlib
import json
from types import SimpleNamespace

import pytest
import torch

import transparent_grpo as tg

from test_tasks import _prompts


@pytest.fixture(scope="module")
def batch(tiny_model):
    """3 prompts of different lengths x G = 2, left-padded as rollout makes them, in a float64 copy of the model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64).eval()
    prompts = [p[None] for p in _prompts(tok, ["say a", "a much longer prompt here", "x"])]
    torch.manual_seed(0)
    cfg = tg.Config(max_new_tokens=7, temperature=0.9, sampler="plain")
    seqs, attn, P = tg.rollout(model, prompts, 2, cfg, [tok.eos_token_id], tok.pad_token_id)   # [6, P+T]
    T = seqs.shape[1] - P
    mask = (torch.arange(T)[None] < torch.tensor([7, 2, 5, 7, 1, 4])[:, None]).double()   # [6, T] unequal lengths
    with torch.no_grad():
        lp = tg.token_logprobs(model, seqs, P, mask, 0.9, attn=attn)[0]                    # [6, T]
    g = torch.Generator().manual_seed(1)
    b = dict(seqs=seqs, attn=attn, mask=mask, old_lp=lp + 0.3 * torch.randn(lp.shape, generator=g, dtype=lp.dtype),
             ref_lp=lp + 0.1 * torch.randn(lp.shape, generator=g, dtype=lp.dtype), adv=torch.randn(6, generator=g,
             dtype=lp.dtype), R=torch.rand(6, generator=g, dtype=lp.dtype), old_values=None, returns=None)
    return model, b, P


def grads(model, b, P, cfg):
    run = SimpleNamespace(acc=SimpleNamespace(autocast=contextlib.nullcontext, num_processes=1), model=model, coef=0.0)
    model.zero_grad()
    stats = {}
    total = 0.0
    for loss in tg.passes(run, dict(b), None, P, cfg, stats):
        loss.backward()
        total += loss.item()
    return torch.cat([p.grad.flatten() for p in model.parameters()]), total, stats


@pytest.mark.parametrize("objective", ["grpo", "dapo", "dr_grpo", "reinforce", "cispo", "gspo"])
@pytest.mark.parametrize("kl_placement", ["reward", "loss"])
def test_passes_add_up_to_the_minibatchs_gradient(batch, objective, kl_placement, float64_norms):
    model, b, P = batch
    assert tg.OBJECTIVES[objective].agg in tg.AGGREGATE
    cfgs = [tg.resolve(tg.Config(objective=objective, kl_placement=kl_placement, group_size=2, prompts_per_step=3,
                                 max_new_tokens=7, temperature=0.9, micro_batch_size=m), cuda=False) for m in (6, 2)]
    whole, passes = grads(model, b, P, cfgs[0]), grads(model, b, P, cfgs[1])
    assert whole[0].abs().max() > 1e-3                                                  # a gradient to compare
    torch.testing.assert_close(passes[0], whole[0], atol=1e-12, rtol=1e-10)
    assert passes[1] == pytest.approx(whole[1], abs=1e-12)
    assert passes[2].keys() == whole[2].keys()
    for k in whole[2]:
        per_token = tg.AGGREGATE[tg.OBJECTIVES[objective].agg].per_token
        if k.startswith("clip/") and not per_token:            # clip shares are token shares, weighted by rows here
            continue
        assert passes[2][k] == pytest.approx(whole[2][k], abs=1e-9), k


def test_a_pass_is_a_group_without_its_shared_left_pads(batch, float64_norms):
    model, b, P = batch
    chunks = list(tg.micro_batches(b, 2, P))
    assert len(chunks) == 3 and all(c["attn"] is None for c, _ in chunks)               # one prompt each: shared
    for i, (c, p) in enumerate(chunks):
        left = int((b["attn"][2 * i] == 0).sum())                                        # this group's left pads
        assert p == P - left and torch.equal(c["seqs"], b["seqs"][2 * i:2 * i + 2, left:])
    cfg = SimpleNamespace(micro_batch_size=2)
    with torch.no_grad():
        whole = tg.token_logprobs(model, b["seqs"], P, b["mask"], 0.9, attn=b["attn"])[0]    # [6, T]
        parts = tg.in_passes(cfg, tg.token_logprobs, model, b["seqs"], P, b["mask"], 0.9, attn=b["attn"])[0]
    torch.testing.assert_close(parts, whole, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("flags, says", [
    (dict(micro_batch_size=3), "--micro_batch_size=3 is invalid: must divide --minibatch_size 8"),
    (dict(micro_batch_size=0), "--micro_batch_size=0 is invalid: must be a positive integer"),
    (dict(objective="online_dpo", micro_batch_size=4), "must be --minibatch_size 8 with online_dpo"),
])
def test_a_bad_micro_batch_size_is_one_line(tiny_model, tmp_path, flags, says):
    cfg = tg.resolve(tg.Config(model=tiny_model, group_size=4, prompts_per_step=2, output_dir=str(tmp_path),
                               log_dir=str(tmp_path), **flags), cuda=False)
    with pytest.raises(tg.ConfigError, match=says.replace("[", r"\[")):
        tg.validate(cfg)


def test_two_prompts_in_passes_train_as_the_whole_batch(tiny_model, tmp_path):
    """Two prompts a step, one group a pass, against the whole batch in one pass: the same run up to rounding."""
    runs = []
    for m in (8, 4):
        cfg = tg.resolve(tg.Config(model=tiny_model, task="family", group_size=4, prompts_per_step=2, max_new_tokens=8,
                                   learning_rate=1e-3, num_steps=2, eval_size=0, micro_batch_size=m, seed=3,
                                   inner_epochs=1,
                                   output_dir=str(tmp_path / str(m)), log_dir=str(tmp_path / str(m)), run_name="r"),
                         cuda=False)
        tg.validate(cfg)
        tg.train(cfg)
        runs.append([json.loads(ln) for ln in open(tmp_path / str(m) / "r.jsonl")])
    assert len(runs[0]) == len(runs[1]) == 2
    for a, b in zip(*runs):
        for k in ("reward/mean", "loss/policy", "optim/grad_norm", "kl/k1"):
            assert b[k] == pytest.approx(a[k], rel=1e-3, abs=1e-5), k
