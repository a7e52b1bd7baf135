"""The fast sampler (§10) samples exactly softmax(logits / T), honours the first-EOS contract, and sees new weights."""
import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch

import transparent_grpo as tg

T = 0.7


def load(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).double().eval()


@pytest.fixture
def light_compile(monkeypatch):
    """--sampler compiled without inductor's C++ code generation (~15 s a graph on 2 cores): the aot_eager backend
    traces the same graph, the weights as its inputs. test_the_sampler_sees_updated_weights keeps inductor."""
    from transformers.generation import configuration_utils as cu
    light = dataclasses.make_dataclass("CompileConfig", [("backend", str, "aot_eager")], bases=(cu.CompileConfig,))
    monkeypatch.setattr(cu, "CompileConfig", light)


def chi_square_p(counts, probs):
    """p-value of Pearson's chi-square test of counts against probs, bins with an expected count < 5 pooled."""
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    stat = ((obs - exp) ** 2 / exp.clamp(min=1e-12)).sum()
    return torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2, dtype=stat.dtype), stat / 2).item()  # chi2 sf


@pytest.mark.parametrize("sampler", ["plain", "fast", "fast_fp32", "compiled"])
def test_first_and_second_token_follow_softmax_at_temperature(tiny_model, sampler, light_compile):
    """20,000 samples of two tokens, no EOS possible: the empirical frequencies at position 1, and at position 2
    (the mixture over every first token), pass a chi-square test against the exact probabilities.
    fast_fp32: the fast sampler with fp32 weights, the CPU default's dtype (the others run in float64)."""
    tok, model = load(tiny_model)
    model, sampler = (model.float(), "fast") if sampler == "fast_fp32" else (model, sampler)
    prompt = tok.apply_chat_template([{"role": "user", "content": "a b"}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8)               # a random model is near uniform: make it peaked
        p1 = torch.softmax(model(input_ids=prompt).logits[0, -1] / T, -1)                          # [V]
        V = p1.numel()
        both = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)                     # every first token
        p2 = (p1[:, None] * torch.softmax(model(input_ids=both).logits[:, -1] / T, -1)).sum(0)   # [V]
    torch.manual_seed(0)
    cfg = SimpleNamespace(sampler=sampler, max_new_tokens=2, temperature=T)
    seqs = tg.sample(model, prompt, 20000, cfg, eos=[V + 5], pad_id=0)                  # an EOS id that never occurs
    for pos, probs in ((0, p1), (1, p2)):
        counts = torch.bincount(seqs[:, prompt.shape[1] + pos], minlength=V).double()
        assert chi_square_p(counts, probs) > 1e-4, f"position {pos + 1}"
    # and a wrong temperature would be caught by the same test
    wrong = torch.softmax(torch.log(p1) * T / 1.0, -1)                                    # p at T = 1.0
    assert chi_square_p(torch.bincount(seqs[:, prompt.shape[1]], minlength=V).double(), wrong) < 1e-6


def test_fast_draws_the_plain_loops_tokens_under_the_same_rng(tiny_model):
    """In float64 the fast sampler (one cache copied into the rows, finished rows dropped) computes the textbook loop's
    probabilities, so under the same seed it draws the same tokens, position after position."""
    tok, model = load(tiny_model)
    prompt = tok("ab", return_tensors="pt")["input_ids"]
    out = {}
    for sampler in ("plain", "fast"):
        torch.manual_seed(3)
        out[sampler] = tg.sample(model, prompt, 16, SimpleNamespace(sampler=sampler, max_new_tokens=5, temperature=T),
                                 eos=[-1], pad_id=tok.pad_token_id)
    assert out["fast"].shape == (16, prompt.shape[1] + 5) and torch.equal(out["fast"], out["plain"])


def reference_mask(row, eos, width):
    """Per row, by hand: 1 up to and including the first EOS; truncated if there is none."""
    stop = next((t for t, y in enumerate(row) if y in eos), None)
    return [1.0 if stop is None or t <= stop else 0.0 for t in range(width)], stop is None


@pytest.mark.parametrize("sampler", ["plain", "fast", "compiled"])
def test_eos_padding_width_masks_and_truncation(tiny_model, sampler, light_compile):
    """Frequent tokens act as EOS, so rows stop at different steps: after its first EOS a row holds only pad; the
    width is max_new_tokens if any row is truncated; masks and truncation flags match a per-row reference."""
    tok, model = load(tiny_model)
    prompt = tok("ab", return_tensors="pt")["input_ids"]
    torch.manual_seed(1)
    probe = tg.sample(model, prompt, 64, SimpleNamespace(sampler=sampler, max_new_tokens=12, temperature=1.0),
                      eos=[-1], pad_id=0)[:, prompt.shape[1]:]
    eos = torch.bincount(probe.flatten()).argsort(descending=True)[:3].tolist()        # frequent: rows stop early
    pad = tok.pad_token_id
    torch.manual_seed(2)
    seqs = tg.sample(model, prompt, 64, SimpleNamespace(sampler=sampler, max_new_tokens=12, temperature=1.0),
                     eos=eos, pad_id=pad)
    completions = seqs[:, prompt.shape[1]:]
    mask, truncated = tg.completion_mask(completions, eos)
    width = completions.shape[1]
    assert width <= 12 and (width == 12 if truncated.any() else True)
    stops = [next((t for t, y in enumerate(r.tolist()) if y in eos), None) for r in completions]
    assert 0 < sum(s is not None for s in stops) < 64                                  # some stop, some do not
    assert width == (12 if None in stops else max(stops) + 1)
    for row, m, tr, stop in zip(completions.tolist(), mask.tolist(), truncated.tolist(), stops):
        assert (m, tr) == reference_mask(row, eos, width)
        if stop is not None:
            assert all(y == pad for y in row[stop + 1:])


@pytest.mark.parametrize("sampler,autocast", [("fast", False), ("fast_fp32", False), ("fast", True),
                                              ("compiled", False), ("compiled", True)])
def test_the_sampler_sees_updated_weights(tiny_model, sampler, autocast):
    """Nothing stale is kept between calls (compiled: the graph reads the weights in place; under autocast its bf16
    twin is refreshed; fast_fp32: the fast sampler in the CPU default's dtype): an in-place update
    (the optimizer's kind) that makes the policy greedy shows in the very next call. With CUDA this runs there."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok, model = load(tiny_model)
    fp32, sampler = sampler == "fast_fp32", sampler.replace("_fp32", "")
    model = model.float().to(device) if device == "cuda" or autocast or fp32 else model
    prompt = tok("ab", return_tensors="pt")["input_ids"].to(device)
    cfg = SimpleNamespace(sampler=sampler, max_new_tokens=3, temperature=1.0)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        before = tg.sample(model, prompt, 32, cfg, eos=[-1], pad_id=0)[:, prompt.shape[1]:]
        assert len(set(before[:, 0].tolist())) > 3
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(1e4)                            # logits x 1e4: argmax only
        after = tg.sample(model, prompt, 32, cfg, eos=[-1], pad_id=0)[:, prompt.shape[1]:]
    assert all(len(set(after[:, t].tolist())) == 1 for t in range(3))
    owner = tg.TWINS.get(id(model), (lambda: None,))[0]                              # (an earlier model's id: dead)
    assert (owner() is model) == autocast                                              # the twin only under autocast


def test_other_cache_layers_are_repeated_not_copied_in_place(tiny_model, monkeypatch):
    """A cache layer other than HF's plain DynamicLayer (sliding windows, ...) is not copied into InPlaceKV buffers:
    the prompt's cache is repeated per row (repeat_cache), and the draws stay the textbook loop's."""
    tok, model = load(tiny_model)
    prompt = tok("ab", return_tensors="pt")["input_ids"]
    called, real = [], tg.repeat_cache
    monkeypatch.setattr(tg, "repeat_cache", lambda *a: called.append(1) or real(*a))
    monkeypatch.setattr(tg, "DynamicLayer", type("Other", (), {}))                    # no layer is "plain" now
    out = []
    for sampler in ("fast", "plain"):
        torch.manual_seed(0)
        out.append(tg.sample(model, prompt, 4, SimpleNamespace(sampler=sampler, max_new_tokens=3, temperature=1.0),
                             [-1], 0))
    assert called and torch.equal(out[0], out[1])


def test_auto_picks_compiled_on_a_gpu_and_fast_on_cpu():
    """--sampler auto (the default): fast on CPU; compiled on CUDA, also for fp32 weights under bf16 autocast (one GPU),
    where it samples from a bf16 copy (the 3B preset fits 80 GB with it: logs/gpu-h100-preset-36l-compiled.log)."""
    assert tg.sampler_kind("auto", "cpu") == "fast" and tg.sampler_kind("auto", "cuda") == "compiled"
    assert tg.sampler_kind("plain", "cuda") == "plain" and tg.sampler_kind("compiled", "cpu") == "compiled"
    assert tg.sampler_kind("fast", "cuda") == "fast"


def test_main_asks_for_expandable_segments_unless_the_user_chose(monkeypatch):
    """main() sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before anything touches CUDA (with it the 3B preset
    and ZeRO-2 bf16 fit one 80 GB GPU: logs/gpu-h100-zero2-bf16-36l.log); a value the user set is kept."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")                                 # recorded, so undone after
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")                                   # the test: nothing leaks out
    with pytest.raises(SystemExit):
        tg.main(["--group_size", "0"])                                               # a config error: exits early
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    with pytest.raises(SystemExit):
        tg.main(["--group_size", "0"])
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


class OldKeyword(torch.nn.Module):
    """A model whose forward takes the KV cache as past_key_values and returns it under that name, as transformers
    before 5.24 did (5.24 renamed both to cache, and 5.40 drops the old name)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config, self.generation_config = inner, inner.config, inner.generation_config

    def forward(self, input_ids, past_key_values=None, use_cache=True, **kw):
        out = self.inner(input_ids=input_ids, cache=past_key_values, use_cache=use_cache, **kw)
        return SimpleNamespace(logits=out.logits, hidden_states=out.hidden_states, past_key_values=out.cache)

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()


@pytest.mark.parametrize("sampler", ["plain", "fast"])
def test_the_cache_goes_under_the_keyword_the_model_takes(tiny_model, sampler, recwarn):
    """cache_arg/kv_cache: a model that takes `cache` (transformers >= 5.24) gets it without a deprecation warning; one
    that takes `past_key_values` (older) gets that; both sample the same tokens and give the same log-probs."""
    tok, model = load(tiny_model)
    if "cache" not in __import__("inspect").signature(model.forward).parameters:
        pytest.skip("this transformers names the cache past_key_values only")
    prompt = tok("ab", return_tensors="pt")["input_ids"]
    cfg, out = SimpleNamespace(sampler=sampler, max_new_tokens=4, temperature=T), []
    for m in (model, OldKeyword(model)):
        torch.manual_seed(0)
        seqs = tg.sample(m, prompt, 6, cfg, eos=[tok.eos_token_id], pad_id=tok.pad_token_id).clone()
        mask = tg.completion_mask(seqs[:, prompt.shape[1]:], [tok.eos_token_id])[0].double()
        with torch.no_grad():
            out.append((seqs, tg.token_logprobs(m, seqs, prompt.shape[1], mask, T)[0]))  # the shared-prompt path
    assert torch.equal(out[0][0], out[1][0]) and torch.allclose(out[0][1], out[1][1], atol=1e-12)
    assert not [w for w in recwarn if "deprecated" in str(w.message)]
