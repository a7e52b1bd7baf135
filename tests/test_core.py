"""Masks, log-probs and the K1-in-reward advantage, against exact answers."""
from dataclasses import fields
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import transparent_grpo as tg


def test_mask_eos_mid_sequence_no_eos_and_pad_equal_to_eos():
    eos = 1  # pad == eos: the padding after the first EOS is made of EOS tokens
    c = torch.tensor([[5, 1, 1, 1],    # EOS at t=1 then padding (= EOS)
                      [5, 6, 7, 8],    # no EOS: truncated, every token counts
                      [1, 1, 1, 1],    # EOS first: one token (the EOS itself)
                      [5, 6, 7, 1]])   # EOS on the last position
    mask, truncated = tg.completion_mask(c, [eos])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert truncated.tolist() == [False, True, False, False]


def test_mask_with_several_eos_ids():
    c = torch.tensor([[3, 9, 4, 2], [3, 4, 9, 9]])
    mask, truncated = tg.completion_mask(c, [4, 9])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0]] and not truncated.any()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_naive_log_softmax(arch, temperature, tiny_model, tiny_qwen):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model if arch == "llama" else tiny_qwen).double()
    torch.manual_seed(0)
    P, T = 5, 9
    ids = torch.randint(6, model.config.vocab_size, (3, P + T))
    mask = torch.ones(3, T)
    mask[0, 4:] = 0  # some padding after an EOS
    lp, ent, _ = tg.token_logprobs(model, ids, P, mask, temperature)
    logits = model(input_ids=ids).logits[:, P - 1:-1] / temperature                    # [B, T, V] the naive way
    naive = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
    naive_ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    assert lp.dtype == torch.float64
    torch.testing.assert_close(lp, naive * mask, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent, naive_ent * mask, rtol=0, atol=1e-10)


@pytest.mark.parametrize("same_prompt", [False, True])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logprob_gradients_match_naive(arch, same_prompt, tiny_model, tiny_qwen, float64_norms):
    """The chunked, checkpointed path (and the shared-prompt KV cache) gives the naive values and gradients."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model if arch == "llama" else tiny_qwen).double()
    ids = torch.randint(6, model.config.vocab_size, (3, 12))
    if same_prompt:
        ids[:, :6] = ids[0, :6]
    mask = torch.ones(3, 6)
    mask[1, 3:] = 0
    lp = tg.token_logprobs(model, ids, 6, mask, 0.8)[0]
    lp.sum().backward()
    g1 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(input_ids=ids).logits[:, 5:-1] / 0.8
    naive = torch.log_softmax(logits, -1).gather(-1, ids[:, 6:, None]).squeeze(-1) * mask
    torch.testing.assert_close(lp, naive, rtol=0, atol=1e-10)
    naive.sum().backward()
    # With HF's own RMSNorm (float32 inside) the shared-prompt gradients would differ at float32 rounding, ~1e-7
    # relative: float64_norms. With it, both paths agree to float64 rounding (6e-16 relative on 2026-11-26).
    for a, p in zip(g1, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-9, atol=1e-12)


def test_logprob_passes_skip_padding_and_change_nothing(tiny_qwen, monkeypatch, float64_norms):
    """Rows of one prompt run in passes of ROWS_PER_PASS rows of like length, each only up to its longest row: the
    values and gradients equal the naive full forward, the rows come back in their order, and no pass runs padding."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen).double()
    monkeypatch.setattr(tg, "ROWS_PER_PASS", 2)
    torch.manual_seed(1)
    P, T, lengths = 5, 9, [9, 2, 6, 1, 4, 9]                           # 3 passes: (1, 2), (4, 6), (9, 9)
    ids = torch.randint(6, model.config.vocab_size, (6, P + T))
    ids[:, :P] = ids[0, :P]
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).double()            # [6, T]
    widths = []
    model.register_forward_pre_hook(lambda m, a, kw: widths.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    lp, ent, _ = tg.token_logprobs(model, ids, P, mask, 0.8)
    assert widths == [(1, P), (2, 1), (2, 5), (2, 8)]                  # the prompt once, then each pass to its end
    (lp * torch.arange(1.0, 7.0, dtype=torch.float64)[:, None]).sum().backward()       # a different weight per row
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(input_ids=ids).logits[:, P - 1:-1] / 0.8                             # [6, T, V] the naive way
    naive = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1) * mask
    naive_ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1) * mask
    torch.testing.assert_close(lp, naive, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent, naive_ent, rtol=0, atol=1e-10)
    (naive * torch.arange(1.0, 7.0, dtype=torch.float64)[:, None]).sum().backward()
    for a, p in zip(grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-9, atol=1e-12)  # float64_norms: as the test above


@pytest.mark.parametrize("same_prompt", [False, True])
def test_entropy_modes_change_no_logprob_or_gradient(same_prompt, tiny_qwen, float64_norms):
    """entropy="value" (logged only) and None (the reference's pass) give the same log-probs and gradients, to the bit,
    as "grad"; "value" gives the same entropy without a graph, None zeros; "grad" entropy has the naive gradient."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen).double()
    torch.manual_seed(2)
    ids = torch.randint(6, model.config.vocab_size, (3, 12))
    if same_prompt:
        ids[:, :6] = ids[0, :6]
    mask = torch.ones(3, 6)
    mask[2, 4:] = 0
    out = {}
    for mode in ("grad", "value", None):
        lp, ent, _ = tg.token_logprobs(model, ids, 6, mask, 0.7, entropy=mode)
        (lp * torch.arange(1.0, 7.0, dtype=torch.float64)).sum().backward()
        out[mode] = lp.detach(), ent, [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
    for mode in ("value", None):
        assert torch.equal(out[mode][0], out["grad"][0])
        assert all(torch.equal(a, b) for a, b in zip(out[mode][2], out["grad"][2]))
    assert torch.equal(out["value"][1], out["grad"][1].detach()) and not out["value"][1].requires_grad
    assert out["grad"][1].requires_grad and torch.equal(out[None][1], torch.zeros_like(out["grad"][1]))
    tg.token_logprobs(model, ids, 6, mask, 0.7, entropy="grad")[1].sum().backward()  # d(sum of H)/d(weights) ...
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(input_ids=ids).logits[:, 5:-1] / 0.7                                  # ... and the naive way
    (-(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1) * mask).sum().backward()
    for a, p in zip(grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-9, atol=1e-12)


def test_logged_entropy_is_not_recomputed_in_backward():
    """entropy="value": backward's checkpoint recompute of each LM-head chunk stops at the log-probs (no softmax);
    entropy="grad" recomputes it in every chunk (3 chunks here)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountSoftmax(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func is torch.ops.aten._softmax.default
            return func(*args, **(kwargs or {}))
    head, h = torch.nn.Linear(8, 50, bias=False), torch.randn(2, 5, 8, requires_grad=True)
    y, mask, counts = torch.randint(0, 50, (2, 5)), torch.ones(2, 5), {}
    for mode in ("grad", "value"):
        lp = tg.sampled_logprobs(h, head, y, mask, 0.7, chunk=4, entropy=mode)[0]
        with CountSoftmax() as c:
            lp.sum().backward()
        counts[mode] = c.n
    assert counts == {"grad": 3, "value": 0}


def test_entropy_bonus_gets_a_differentiable_entropy(tiny_model, tmp_path, monkeypatch):
    """train(): with --entropy_coef or --entropy_target the loss sees the entropy with its graph (mu = 1 reuses the
    log-prob pass, mu = 2 runs the update's own); without either, a plain value."""
    seen, policy_loss = [], tg.policy_loss
    monkeypatch.setattr(tg, "policy_loss", lambda b, cfg, coef: seen.append(b["entropy"].requires_grad) or
                        policy_loss(b, cfg, coef))
    for coef, target, mu in ((0.01, 0.0, 1), (0.01, 0.0, 2), (0.0, 0.2, 1), (0.0, 0.0, 1), (0.0, 0.0, 2)):
        cfg = tg.resolve(tg.Config(model=tiny_model, group_size=4, max_new_tokens=6, num_steps=1, entropy_coef=coef,
                                   entropy_target=target, inner_epochs=mu, output_dir=str(tmp_path),
                                   log_dir=str(tmp_path), run_name=f"e{coef}{target}{mu}"), cuda=False)
        tg.validate(cfg)
        tg.train(cfg)
    assert seen == [True, True, True, True, False, False, False]     # the adaptive bonus's coefficient may rise


def _cfg(**kw):
    cfg = tg.Config(model="/x", **kw)
    return tg.resolve(cfg, cuda=False)


def test_k1_in_reward_scales_with_beta_when_rewards_tie():
    R = torch.tensor([[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)   # group 0 ties
    kl = torch.tensor([[0.1, 0.4, 0.2, 0.9], [0.3, 0.3, 0.1, 0.5]], dtype=torch.float64)
    A1 = tg.advantages(R, kl, _cfg(beta=0.02, advantage="zscore"))
    A2 = tg.advantages(R, kl, _cfg(beta=0.04, advantage="zscore"))
    task = tg.zscore(R)
    torch.testing.assert_close(A2 - task, 2 * (A1 - task))                               # the KL part doubles
    # exact value: -beta * (KL_i - mean_{j != i} KL_j); in the tied group the task part is exactly 0
    loo = kl - (kl.sum(1, keepdim=True) - kl) / 3
    torch.testing.assert_close(A1, task - 0.02 * loo)
    assert torch.all(task[0] == 0)
    # the upstream order (subtract, then divide by the group std) loses beta: both betas give the same advantage
    upstream = lambda b: tg.zscore(R - b * kl)
    torch.testing.assert_close(upstream(0.02)[0], upstream(0.04)[0])


def test_a_tied_group_gets_exactly_zero_task_advantage_in_float32():
    """Every reward the credit table can give (the problem's k/20, a half's k/13, minus the truncation penalty), tied
    across a group in float32: the group's mean can miss R by one rounding (0.7: 6e-8), and dividing that by the std's
    floor of 1e-6 gave every sample the same advantage of up to 0.06, a push towards whatever the group sampled."""
    values = [k / 20 for k in range(21)] + [k / 13 for k in range(14)]
    for v in values + [v - 0.1 for v in values]:
        R = torch.full((1, 8), v, dtype=torch.float32)
        assert torch.all(tg.zscore(R) == 0), v
    R = torch.tensor([[0.7] * 7 + [0.65]])                                              # one differs: z-scored
    torch.testing.assert_close(tg.zscore(R), (R - R.mean()) / R.std())


def test_sequence_kl_is_detached():
    lp = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    kl_tok, kl_seq = tg.sequence_kl(lp, torch.zeros(3, 4, dtype=torch.float64), torch.ones(3, 4), "k1")
    assert not kl_seq.requires_grad and not kl_tok.requires_grad
    A = tg.advantages(torch.zeros(1, 3, dtype=torch.float64), kl_seq.view(1, 3), _cfg())
    assert not A.requires_grad


def test_step_metrics_credit_shares_and_reward_stats_by_hand():
    """step_metrics on one process: credit/<name> is the share of the N completions that earned it, and the reward,
    length and truncation metrics equal their values worked out by hand (a wrong divisor or key fails here)."""
    from types import SimpleNamespace
    acc = SimpleNamespace(gather=lambda t: t, device="cpu")                       # one process: gather is identity
    cfg = tg.resolve(tg.Config(group_size=2, prompts_per_step=2, beta=0.0, model="bundled:x"), cuda=False)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)  # lengths 2, 3, 1, 3
    batch = dict(R=torch.tensor([9.0, 9.0, 9.0, 9.0]), mask=mask, adv=torch.tensor([1.0, -1.0, 0.0, 0.0]),
                 old_lp=None, ref_lp=None)                                        # R + shaping: the update's, not logged
    parts = [{"a": True, "boxed": False}, {"a": True, "boxed": True}, {"a": False, "boxed": False},
             {"a": True, "boxed": False}]
    seen = dict(reward=torch.tensor([0.3, 1.0, 0.0, 0.3]), truncated=torch.tensor([False, True, False, True]),
                parts=parts, kl_seq=torch.zeros(4), entropy=torch.zeros(4, 3))
    m = tg.step_metrics(acc, cfg, batch, seen, {"time/generate": 2.0})
    assert m["credit/a"] == pytest.approx(0.75) and m["credit/boxed"] == pytest.approx(0.25)
    assert m["reward/mean"] == pytest.approx(0.4) and m["reward/max"] == pytest.approx(1.0)
    assert m["reward/frac_zero_std_groups"] == pytest.approx(0.0)                 # groups (0.3, 1.0), (0.0, 0.3)
    assert m["completion/len_mean"] == pytest.approx(2.25) and m["completion/truncated_frac"] == pytest.approx(0.5)
    assert m["perf/gen_tokens_per_s"] == pytest.approx(9 / 2.0)
    assert m["adv/abs_mean"] == pytest.approx(0.5)


@pytest.mark.parametrize("model,cuda,preset", [
    ("auto", False, "smollm2-135m"), ("auto", True, "qwen2.5-3b"),                      # auto: the device's recipe
    ("bundled:SmolLM2-135M-Instruct", True, "smollm2-135m"),                            # the small model on a GPU
    ("/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf", True, "smollm2-135m"),                   # a file of it
    ("HuggingFaceTB/SmolLM2-135M-Instruct", True, "smollm2-135m"),                      # the hub's copy
    ("Qwen/Qwen2.5-3B-Instruct", False, "qwen2.5-3b"),                                  # the 3B on a CPU
    ("some-org/other-model", True, "qwen2.5-3b"), ("some-org/other-model", False, "smollm2-135m"),
])
def test_the_model_picks_its_recipe(model, cuda, preset):
    """The recipe follows the model, not the device: the bundled SmolLM2 on a GPU gets the small recipe (its G, length,
    worked example), not the 3B one; a model we do not know gets the device's; --preset wins over both."""
    cfg = tg.resolve(tg.Config(model=model), cuda=cuda)
    assert cfg.preset == preset
    assert all(getattr(cfg, k) == v for k, v in tg.PRESETS[preset].items() if k != "model")
    assert cfg.model == (tg.PRESETS[preset]["model"] if model == "auto" else model)
    other = next(p for p in tg.PRESETS if p != preset)
    forced = tg.resolve(tg.Config(model=model, preset=other), cuda=cuda)
    assert all(getattr(forced, k) == v for k, v in tg.PRESETS[other].items() if k != "model")


def test_entropy_control_steers_the_coefficient_to_the_target():
    """--entropy_target: the coefficient rises by --entropy_step while the entropy is below the target, falls above
    it, never below 0 nor above --entropy_coef_max; without a target it stays what it was."""
    cfg = SimpleNamespace(entropy_target=0.2, entropy_step=0.01, entropy_coef_max=0.025)
    assert tg.entropy_coef(0.0, 0.1, cfg) == pytest.approx(0.01)                       # too little entropy: up
    assert tg.entropy_coef(0.02, 0.1, cfg) == pytest.approx(0.025)                     # capped
    assert tg.entropy_coef(0.02, 0.3, cfg) == pytest.approx(0.01)                      # too much: down
    assert tg.entropy_coef(0.005, 0.3, cfg) == 0.0                                     # never below 0
    assert tg.entropy_coef(0.04, 0.1, SimpleNamespace(entropy_target=0.0)) == 0.04     # off: unchanged


def test_gdpo_zscores_each_part_then_the_sum():
    """GDPO: every part of the reward z-scored within its group, the parts summed, the sum scaled to unit std over the
    batch; exact against a float64 computation written out here, and different from z-scoring the summed reward."""
    C = torch.tensor([[[0.3, 0.1], [0.3, 0.0], [0.3, 0.0], [0.0, 0.0]],
                      [[0.0, 0.0], [0.3, 0.0], [0.0, 0.1], [0.0, 0.1]]], dtype=torch.float64)   # [P=2, G=4, K=2]
    z = torch.zeros(2, 4, dtype=torch.float64)
    for p in range(2):
        for k in range(2):
            col = C[p, :, k]
            z[p] += (col - col.mean()) / col.std()
    torch.testing.assert_close(tg.gdpo(C), z / z.std())
    assert not torch.allclose(tg.gdpo(C), tg.zscore(C.sum(-1)))
    # a sample that finds a rare 0.1 step but misses the 0.3 box that the other 7 have: the summed reward's z-score
    # pushes it down; GDPO counts the found step as much as the missed box
    C = torch.zeros(1, 8, 2)
    C[0, 1:, 0], C[0, 0, 1] = 0.3, 0.1
    assert tg.zscore(C.sum(-1))[0, 0] < -1 and abs(tg.gdpo(C)[0, 0]) < 1e-6
    assert torch.all(tg.gdpo(torch.full((2, 8, 3), 0.7)) == 0)           # ties: exactly 0, no 0/0


def toy_columns(texts, truncated, cfg, weights=False):  # the toy problem's reward columns (and w), as train() builds
    C, w = tg.reward_columns([tg.credits(t) for t in texts], [tg.consistent(t) for t in texts], truncated, cfg)
    return (C, w) if weights else C


def test_a_guessed_box_moves_no_gdpo_advantage():
    """With consistency_bonus = the box's weight, a group where some samples guess the right box (without the right a
    and b) gets the GDPO advantages it would get if nobody had boxed: the box's column and the charge cancel. A box
    beside the right a and b counts."""
    cfg = _cfg(truncation_penalty=0.0, consistency_bonus=0.3, advantage="gdpo")
    steps = ["At x = 2: 2a + 3 = -3 so a = -3", "2 - 5 = -3", "At x = -2 it is -2 - 5 = -7", "nothing"] * 2
    guessed = [t + (" \\boxed{0}" if i % 3 == 0 else "") for i, t in enumerate(steps)]
    A = lambda texts: tg.gdpo(toy_columns(texts, torch.zeros(8, dtype=torch.bool), cfg)[None])
    torch.testing.assert_close(A(guessed), A(steps))
    whole = list(steps)
    whole[1] = "2a = -6, a = -3; -b = -3, b = 3; a + b = 0, \\boxed{0}"
    assert tg.consistent(whole[1]) == 1 and A(whole)[0, 1] > A(steps)[0, 1]


def test_reward_columns_sum_to_the_learning_reward_and_gdpo_reads_them():
    """The toy's columns: each credit's weight where earned, -truncation_penalty, +-consistency_bonus; they sum to the
    task reward plus the shaping. Your own reward is one column. advantages() hands them to gdpo only."""
    cfg = _cfg(truncation_penalty=0.1, consistency_bonus=0.3, advantage="gdpo")
    texts = ["So a = -3, b = 3, a + b = 0, \\boxed{0}", "a = 0, b = 3, so \\boxed{0}", "a = -3, b = -3: \\boxed{-6}",
             "nothing"]
    truncated = torch.tensor([False, False, True, True])
    R = torch.tensor([tg.toy_reward(t) for t in texts])
    C, w = toy_columns(texts, truncated, cfg, weights=True)          # [4, K + 2], [K + 2]
    assert w.tolist() == [1.0] * len(tg.CREDIT) + [cfg.truncation_weight, 1.0]
    shaping = torch.tensor([0.3, -0.3, 0.2, -0.1])  # 0: a + b, right; 1: the right box without a; 2: a + b, wrong
    torch.testing.assert_close(C.sum(1), R + shaping)
    assert C.shape[1] == len(tg.CREDIT) + 2
    own = tg.reward_columns([{"reward": r} for r in (1.0, 2.0, 3.0, 4.0)], [0] * 4, truncated, cfg)[0]
    torch.testing.assert_close(own.sum(1), torch.tensor([1.0, 2.0, 2.9, 3.9]))         # no consistency bonus
    parts, kl = C.unflatten(0, (1, 4)), torch.zeros(1, 4)
    torch.testing.assert_close(tg.advantages(C.sum(1)[None], kl, cfg, parts, w), tg.gdpo(parts))
    torch.testing.assert_close(tg.advantages(C.sum(1)[None], kl, _cfg(advantage="zscore"), parts),
                               tg.zscore(C.sum(1)[None]))


def test_under_gdpo_a_shaping_term_counts_by_its_sign_not_its_size():
    """GDPO z-scores each column in its group, and z(c x) = z(x) for c > 0: --truncation_penalty 0.1 and 1.0 (and
    --consistency_bonus 0.3 and 0.05) give the same advantages; one truncated sample weighs like one missed credit.
    Under the z-score of the summed reward the size counts. The README says so; this pins it."""
    texts = ["So a = -3, b = 3, a + b = 0, \\boxed{0}", "a = 0, b = 3, so \\boxed{0}", "a = -3, b = -3: \\boxed{-6}",
             "2 - 5 = -3", "nothing", "At x = 2: 2a + 3 = -3 so a = -3", "b = 3", "nothing at all"]
    truncated = torch.tensor([False, False, True, True, False, True, False, False])
    R, kl = torch.tensor([tg.toy_reward(t) for t in texts]), torch.zeros(1, 8)

    def A(advantage, **shaping):
        cfg = _cfg(advantage=advantage, **shaping)
        C = toy_columns(texts, truncated, cfg)                       # [8, K + 2]
        return tg.advantages(C.sum(1)[None], kl, cfg, C[None])                          # [1, 8]
    small = dict(truncation_penalty=0.1, consistency_bonus=0.3)
    big = dict(truncation_penalty=1.0, consistency_bonus=0.05)
    torch.testing.assert_close(A("gdpo", **small), A("gdpo", **big))
    assert not torch.allclose(A("zscore", **small), A("zscore", **big))
    assert not torch.allclose(A("gdpo", **small), A("gdpo", truncation_penalty=0.0, consistency_bonus=0.3))


def test_gdpo_weights_the_truncation_column_by_truncation_weight():
    """GDPO's w_k: A = sum_k w_k z_k / std, each credit's and the consistency column's w = 1, the truncation column's
    --truncation_weight. Exact against a hand computation; 1 (the default) is today's unweighted GDPO, 0 is no penalty,
    and in between the penalty is weaker: a truncated sample's advantage lies between the two."""
    texts = ["So a = -3, b = 3, a + b = 0, \\boxed{0}", "a = 0, b = 3, so \\boxed{0}", "a = -3, b = -3: \\boxed{-6}",
             "2 - 5 = -3", "nothing", "At x = 2: 2a + 3 = -3 so a = -3", "b = 3", "nothing at all"]
    truncated = torch.tensor([False, False, True, True, False, True, False, False])
    R, kl = torch.tensor([tg.toy_reward(t) for t in texts]), torch.zeros(1, 8)

    def A(**kw):
        cfg = _cfg(advantage="gdpo", truncation_penalty=0.1, consistency_bonus=0.3, **kw)
        C, w = toy_columns(texts, truncated, cfg, weights=True)      # [8, K + 2], [K + 2]: as train() passes them
        return tg.advantages(C.sum(-1)[None], kl, cfg, C[None], w), C[None]
    A1, C = A()
    A0, A3 = A(truncation_weight=0.0)[0], A(truncation_weight=0.3)[0]
    z = tg.zscore(C.permute(0, 2, 1).flatten(0, 1)).view(C.shape[2], 8).T              # [8, K + 2] by hand
    w = torch.ones(C.shape[-1])
    w[-2] = 0.3
    by_hand = (z * w).sum(-1)
    torch.testing.assert_close(A3[0], by_hand / by_hand.std())
    torch.testing.assert_close(A1, tg.gdpo(C))                                          # default: unweighted
    C0 = torch.cat([C[..., :-2], C[..., -1:]], -1)                                      # the column dropped
    torch.testing.assert_close(A0, tg.gdpo(C0))
    cut = truncated.nonzero().flatten()
    assert (A1[0, cut] < A3[0, cut]).all() and (A3[0, cut] < A0[0, cut]).all()


THE_3B = dict(model="Qwen/Qwen2.5-3B-Instruct", group_size=4, prompts_per_step=1, max_new_tokens=512, temperature=1.0,
              learning_rate=2e-6, num_steps=20, beta=0.02, inner_epochs=3, worked_examples=0, truncation_penalty=0.0,
              consistency_bonus=0.0, entropy_target=0.0, eval_size=64, advantage="zscore", kl_placement="reward",
              clip_eps=0.2, clip_eps_high=0.2, minibatch_size=4)
THE_SMALL = dict(THE_3B, model="bundled:SmolLM2-135M-Instruct", group_size=16, max_new_tokens=192, temperature=0.8,
                 learning_rate=2e-5, num_steps=28, inner_epochs=1, worked_examples=2, truncation_penalty=0.1,
                 consistency_bonus=0.3, advantage="gdpo", entropy_target=0.2, eval_size=32, minibatch_size=16)


@pytest.mark.parametrize("cuda, recipe", [(True, THE_3B), (False, THE_SMALL)])
def test_defaults_beside_their_flags_and_presets_as_differences_give_the_two_recipes(cuda, recipe):
    """Every value of both recipes, pinned: the defaults declared beside the flags (the 3B recipe's), the small preset
    as the fields that differ; then each objective's own values, which a preset gives way to and a flag beats."""
    cfg = tg.resolve(tg.Config(), cuda=cuda)
    assert {k: getattr(cfg, k) for k in recipe} == recipe
    assert tg.PRESETS["qwen2.5-3b"] == dict(model=THE_3B["model"])                  # the defaults are the 3B recipe
    own = {"grpo": {}, "dr_grpo": dict(advantage="mean"), "dapo": dict(clip_eps_high=0.28),
           "gspo": dict(clip_eps=3e-4, clip_eps_high=4e-4), "cispo": dict(clip_eps_high=4.0),
           "reinforce": dict(advantage="none", inner_epochs=1), "rloo": dict(advantage="rloo", inner_epochs=1),
           "ppo": dict(advantage=None),
           "online_dpo": dict(beta=0.1, kl_placement="none", advantage=None)}   # pinned; a new row: what it says
    for objective, row in tg.OBJECTIVES.items():
        says = {**({"advantage": row.advantage} if row.advantage else {}), **row.defaults}
        says |= {"advantage": None} if row.critic or row.pairs else {}             # their own: no ADVANTAGES row
        cfg = tg.resolve(tg.Config(objective=objective), cuda=cuda)
        expected = {**recipe, **{k: v for k, v in own.get(objective, says).items() if k in recipe}}
        assert {k: getattr(cfg, k) for k in recipe} == expected, objective
    passed = tg.resolve(tg.Config(objective="gspo", clip_eps=0.1, advantage="mean", group_size=8), cuda=cuda)
    assert (passed.clip_eps, passed.clip_eps_high, passed.advantage, passed.minibatch_size) == (0.1, 4e-4, "mean", 8)
    assert tg.resolve(tg.Config(clip_eps=0.3), cuda=cuda).clip_eps_high == 0.3       # its default: clip_eps


def test_only_objectives_with_their_own_advantages_run_without_one(tmp_path):
    """ppo (a critic) and online_dpo (pairs) resolve to no ADVANTAGES row and pass validate; any other objective
    without one is an error (it would train on the KL part alone), and advantages() gives those a zero task part."""
    for objective in tg.OBJECTIVES:
        cfg = tg.resolve(tg.Config(objective=objective, output_dir=str(tmp_path / "out"), log_dir=str(tmp_path)),
                         cuda=False)                                # validate probes both folders: not the repo's
        own = tg.OBJECTIVES[objective].critic or tg.OBJECTIVES[objective].pairs
        assert (cfg.advantage is None) == own, objective
        tg.validate(cfg)
        cfg.advantage = None
        if not own:
            with pytest.raises(tg.ConfigError, match="--advantage=None is invalid"):
                tg.validate(cfg)
    R, kl = torch.tensor([[0.0, 1.0, 0.5]]), torch.tensor([[0.1, 0.4, 0.1]])
    cfg = _cfg(beta=0.1)
    cfg.advantage = None
    torch.testing.assert_close(tg.advantages(R, kl, cfg), -0.1 * (kl - kl.mean()) * 3 / 2)


def test_help_shows_each_declared_default(capsys):
    """--help: a knob (None until resolve) shows the default declared beside it, once, and never 'None'."""
    with pytest.raises(SystemExit):
        tg.parse_config(["--help"], cuda=False)
    text = " ".join(capsys.readouterr().out.split())
    for f in fields(tg.Config):
        if "default" in f.metadata:
            assert f"(default: {f.metadata['default']})" in text, f.name
    assert "(default: None)" not in text and "(default: 4) (default" not in text


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_model_with_dropout_loads_without_it(tmp_path, arch):
    """pi_old's forward runs in train mode (gradient checkpointing needs it): dropout there would make it another
    policy than the one that sampled. Llama's is the attention's (a float); GPT-2's are nn.Dropout modules."""
    import json
    from conftest import make_tokenizer
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig
    tok = make_tokenizer()
    config = (LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.5) if arch == "llama" else
              GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=256))  # GPT-2: 0.1 each
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    ids = torch.randint(0, len(tok), (2, 12))
    forward = lambda m: m.train()(ids).logits                                   # [2, 12, V]
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not torch.equal(forward(plain), forward(plain))                      # the test's model has dropout
    _, model = tg.load_model(str(tmp_path), torch.float32)
    assert torch.equal(forward(model), forward(model))
    assert torch.allclose(forward(model), plain.eval()(ids).logits, atol=1e-5)  # train mode = the sampler's eval mode
