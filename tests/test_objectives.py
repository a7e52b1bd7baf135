"""Every objective, aggregation and KL-in-the-loss term against an independent reference written as plain loops.

The batches have what a real minibatch has and a one-token bandit does not: completions of different lengths (and
garbage in the padded positions), several groups per minibatch, and off-policy ratios (mu > 1: pi_theta != pi_old,
values != old values). Loss values and gradients are compared in float64 through the trainer's own functions
(policy_loss, sequence_kl, advantages, gae, ppo_advantages).
"""
import math

import pytest
import torch
import torch.nn.functional as F

import transparent_grpo as tg

D = torch.float64
LENGTHS = [3, 1, 4, 2, 4, 3]          # two groups of G = 3, completions of different lengths, width T = 5
B, T, G = len(LENGTHS), 5, 3


def cfg_for(**kw):
    kw.setdefault("group_size", G)
    kw.setdefault("max_new_tokens", T)
    kw.setdefault("beta", 0.0)
    return tg.resolve(tg.Config(model="/x", **kw), cuda=False)


GSPO_SHIFT = torch.tensor([1e-4, -5e-4, 2e-4, 6e-4, -1e-4, 0.0], dtype=D)[:, None]  # mean log-ratio per sequence


def make_batch(seed=0, ratio_scale=0.4, shift=0.0):
    """A minibatch dict as the trainer builds it; padded positions hold garbage that a mask must hide."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in LENGTHS], dtype=D)        # [B, T]
    rnd = lambda scale=1.0: torch.randn(B, T, generator=g, dtype=D) * scale
    old_lp = -rnd().abs() - 0.1                                                          # log-probs < 0
    lp = (old_lp + shift + ratio_scale * rnd()).clone().requires_grad_(True)             # off-policy: ratios != 1
    ref_lp = old_lp + 0.3 * rnd()
    R = torch.tensor([0.1, 0.7, 0.7, 0.0, 0.0, 0.0], dtype=D)                           # group 2 ties
    return dict(lp=lp, old_lp=old_lp, ref_lp=ref_lp, mask=mask, R=R, adv=torch.randn(B, generator=g, dtype=D),
                entropy=rnd().abs().requires_grad_(True), values=rnd().requires_grad_(True), old_values=rnd(),
                returns=rnd())


# ------------------------------------------------------------------ the reference: one sequence, one token at a time
def ref_aggregate(name, per_token, b, cfg):
    """per_token(i, t) -> a scalar; the objective's averaging written out (a new AGGREGATE row: the trainer's own)."""
    L = [int(n) for n in b["mask"].sum(1)]
    if name not in ("seq_mean", "token_mean", "max_len", "seq_sum"):
        x = torch.stack([torch.stack([per_token(i, t) if t < L[i] else torch.zeros((), dtype=D) for t in range(T)])
                         for i in range(B)])
        return tg.AGGREGATE[name].fn(x, b["mask"], cfg)
    seq_sums = [sum(per_token(i, t) for t in range(L[i])) for i in range(B)]
    return {"seq_mean": sum(s / L[i] for i, s in enumerate(seq_sums)) / B,
            "token_mean": sum(seq_sums) / sum(L),
            "max_len": sum(seq_sums) / (B * cfg.max_new_tokens),
            "seq_sum": sum(seq_sums) / B}[name]


def ref_loss(b, cfg):
    """The objective written out, then the KL in the loss and the entropy bonus. An objective this file has no
    reference for (a new row) takes the trainer's own loss for its part: its KL and entropy terms are still checked."""
    lp, old, A, el, eh = b["lp"], b["old_lp"], b["adv"], cfg.clip_eps, cfg.clip_eps_high
    agg = tg.OBJECTIVES[cfg.objective].agg
    adv = (lambda i, t: A[i, t]) if A.dim() == 2 else (lambda i, t: A[i])
    ratio = lambda i, t: torch.exp(lp[i, t] - old[i, t])
    clipped = lambda i, t: -torch.minimum(ratio(i, t) * adv(i, t), ratio(i, t).clamp(1 - el, 1 + eh) * adv(i, t))
    L = [int(n) for n in b["mask"].sum(1)]
    if cfg.objective in ("grpo", "dr_grpo", "dapo"):
        loss = ref_aggregate(agg, clipped, b, cfg)
    elif cfg.objective == "gspo":  # the sequence ratio: the geometric mean of the token ratios over |o_i| tokens
        s = [torch.exp(sum(lp[i, t] - old[i, t] for t in range(L[i])) / L[i]) for i in range(B)]
        loss = sum(-torch.minimum(s[i] * A[i], s[i].clamp(1 - el, 1 + eh) * A[i]) for i in range(B)) / B
    elif cfg.objective == "cispo":
        loss = ref_aggregate(agg, lambda i, t: -ratio(i, t).detach().clamp(max=1 + eh) * adv(i, t) * lp[i, t], b, cfg)
    elif cfg.objective in ("reinforce", "rloo"):
        loss = ref_aggregate(agg, lambda i, t: -adv(i, t) * lp[i, t], b, cfg)
    elif cfg.objective == "ppo":
        V, V0, ret = b["values"], b["old_values"], b["returns"]
        v_clip = lambda i, t: V0[i, t] + (V[i, t] - V0[i, t]).clamp(-cfg.vf_clip, cfg.vf_clip)
        v_loss = lambda i, t: 0.5 * torch.maximum((V[i, t] - ret[i, t]) ** 2, (v_clip(i, t) - ret[i, t]) ** 2)
        loss = ref_aggregate(agg, clipped, b, cfg) + cfg.vf_coef * ref_aggregate(agg, v_loss, b, cfg)
    elif cfg.objective == "online_dpo":  # best vs worst of each group; a tied group makes no pair and is not counted
        pairs = []
        for g in range(B // G):
            idx = list(range(g * G, (g + 1) * G))
            Rg = [b["R"][i].item() for i in idx]
            w, l = idx[Rg.index(max(Rg))], idx[Rg.index(min(Rg))]
            rho = lambda i: sum(lp[i, t] - b["ref_lp"][i, t] for t in range(L[i]))
            if max(Rg) > min(Rg):
                pairs.append(-F.logsigmoid(cfg.beta * (rho(w) - rho(l))))
        loss = sum(pairs) / max(len(pairs), 1)
    else:                                   # a new row: no exact reference for its own part
        loss = tg.OBJECTIVES[cfg.objective].loss(b, cfg, lambda x: tg.AGGREGATE[agg].fn(x, b["mask"], cfg))[0]
    if cfg.kl_placement == "loss":  # + beta * k(logpi - logpi_ref), averaged like the objective
        k = lambda i, t: tg.KL_ESTIMATORS[cfg.kl_estimator](lp[i, t] - b["ref_lp"][i, t])
        loss = loss + cfg.beta * ref_aggregate(agg, k, b, cfg)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * ref_aggregate(agg, lambda i, t: b["entropy"][i, t], b, cfg)
    return loss


def compare(b, cfg):
    """Same loss value and same gradients (log-probs, entropy, values) as the reference."""
    if tg.OBJECTIVES[cfg.objective].critic:           # token advantages, as GAE gives
        b["adv"] = torch.randn(B, T, generator=torch.Generator().manual_seed(1), dtype=D) * b["mask"]
    ours, ref = tg.policy_loss(b, cfg)[0], ref_loss(b, cfg)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-14)
    leaves = [b["lp"], b["entropy"], b["values"]]
    g_ours = torch.autograd.grad(ours, leaves, allow_unused=True, materialize_grads=True)
    g_ref = torch.autograd.grad(ref, leaves, allow_unused=True, materialize_grads=True)
    for a, r in zip(g_ours, g_ref):
        torch.testing.assert_close(a * b["mask"], r * b["mask"], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("objective", sorted(tg.OBJECTIVES))
def test_objective_matches_the_reference_off_policy(objective):
    b = make_batch()
    if objective == "gspo":  # its clip range is tiny: log-ratios of ~1e-4, some sequences inside, some outside
        b = make_batch(ratio_scale=1e-4, shift=GSPO_SHIFT)
    own_kl = tg.OBJECTIVES[objective].reference                          # its KL built in: beta is its own
    compare(b, cfg_for(objective=objective, beta=0.1 if own_kl else 0.0, kl_placement="none" if own_kl else None))


@pytest.mark.parametrize("estimator", sorted(tg.KL_ESTIMATORS))
@pytest.mark.parametrize("objective", sorted(k for k, row in tg.OBJECTIVES.items() if not row.reference))
def test_kl_in_the_loss_uses_the_objectives_averaging(objective, estimator):
    b = make_batch(ratio_scale=1e-4, shift=GSPO_SHIFT) if objective == "gspo" else make_batch()
    compare(b, cfg_for(objective=objective, kl_placement="loss", kl_estimator=estimator, beta=0.07))


@pytest.mark.parametrize("objective", ["grpo", "dr_grpo", "dapo", "reinforce"])
def test_entropy_bonus_uses_the_objectives_averaging(objective):
    compare(make_batch(), cfg_for(objective=objective, entropy_coef=0.03))


def test_the_batch_exercises_both_sides_of_every_clip():
    """Guard against a batch that is too easy: ratios lie inside and outside each clip range."""
    b = make_batch()
    r = torch.exp(b["lp"] - b["old_lp"])[b["mask"].bool()]
    assert (r > 1.2).any() and (r < 0.8).any() and ((r > 0.8) & (r < 1.2)).any()
    b = make_batch(ratio_scale=1e-4, shift=GSPO_SHIFT)
    L = b["mask"].sum(1)
    s = torch.exp(((b["lp"] - b["old_lp"]) * b["mask"]).sum(1) / L)
    inside = (s > 1 - 3e-4) & (s < 1 + 4e-4)
    assert inside.any() and not inside.all()
    s_sum = torch.exp(((b["lp"] - b["old_lp"]) * b["mask"]).sum(1))          # a sum-of-log-ratios bug would see this
    assert not torch.allclose(s, s_sum)


# ------------------------------------------------------------------ sequence KL, GAE and PPO advantages, by hand
def test_sequence_kl_ignores_padding():
    b = make_batch()
    for est in tg.KL_ESTIMATORS:
        kl_tok, kl_seq = tg.sequence_kl(b["lp"], b["ref_lp"], b["mask"], est)
        for i, n in enumerate(LENGTHS):
            by_hand = sum(tg.KL_ESTIMATORS[est](b["lp"][i, t] - b["ref_lp"][i, t]) for t in range(n))
            torch.testing.assert_close(kl_seq[i], by_hand.detach(), rtol=1e-12, atol=1e-14)
        assert (kl_tok[b["mask"] == 0] == 0).all()


def test_gae_ignores_rewards_and_values_after_the_last_token():
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in LENGTHS], dtype=D)
    rewards, values = torch.randn(B, T, generator=g, dtype=D), torch.randn(B, T, generator=g, dtype=D)  # garbage after
    A, ret = tg.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    for i, n in enumerate(LENGTHS):
        a, expect = 0.0, [0.0] * T
        for t in reversed(range(n)):
            next_v = values[i, t + 1].item() if t + 1 < n else 0.0
            a = rewards[i, t].item() + 0.9 * next_v - values[i, t].item() + 0.9 * 0.8 * a
            expect[t] = a
        torch.testing.assert_close(A[i], torch.tensor(expect, dtype=D), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(ret[i, :n], A[i, :n] + values[i, :n], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("placement", [p for p in tg.KL_PLACEMENTS if p != "none"])
def test_ppo_advantages_by_hand(placement):
    """Token rewards -beta*k_t (only when the KL is in the reward) plus R on the last token, GAE, then whitening."""
    cfg = cfg_for(objective="ppo", beta=0.2, kl_placement=placement, gamma=0.95, lam=0.9)
    b = make_batch()
    kl_tok, _ = tg.sequence_kl(b["lp"], b["ref_lp"], b["mask"], "k1")
    A, ret = tg.ppo_advantages(b["R"], kl_tok, b["old_values"], b["mask"], cfg)
    raw = []
    for i, n in enumerate(LENGTHS):
        r = [(-0.2 * kl_tok[i, t].item() if placement == "reward" else 0.0) + (b["R"][i].item() if t == n - 1 else 0.0)
             for t in range(n)]
        a, row = 0.0, [0.0] * n
        for t in reversed(range(n)):
            next_v = b["old_values"][i, t + 1].item() if t + 1 < n else 0.0
            a = r[t] + 0.95 * next_v - b["old_values"][i, t].item() + 0.95 * 0.9 * a
            row[t] = a
        raw.append(row)
    flat = torch.tensor([x for row in raw for x in row], dtype=D)
    mean, std = flat.mean(), flat.std()
    for i, n in enumerate(LENGTHS):
        torch.testing.assert_close(A[i, :n], (torch.tensor(raw[i], dtype=D) - mean) / std, rtol=1e-12, atol=1e-13)
        assert (A[i, n:] == 0).all()
        torch.testing.assert_close(ret[i, :n], torch.tensor(raw[i], dtype=D) + b["old_values"][i, :n], rtol=1e-12,
                                   atol=1e-13)


def test_ppo_whitens_over_the_tokens_of_every_process():
    """Two processes with half the batch each, given each other's GAE values (what gather_rows collects), whiten as one
    process with the whole batch does; a process that whitened its own tokens alone would not."""
    cfg = cfg_for(objective="ppo", beta=0.2, kl_placement="reward", gamma=0.95, lam=0.9)
    b = make_batch()
    kl_tok, _ = tg.sequence_kl(b["lp"], b["ref_lp"], b["mask"], "k1")
    args = lambda rows: (b["R"][rows], kl_tok[rows], b["old_values"][rows], b["mask"][rows], cfg)
    whole, _ = tg.ppo_advantages(*args(slice(None)))
    first, second = slice(0, 3), slice(3, 6)
    raw = [[], []]                                                        # each process's own A[mask], unwhitened
    own = [tg.ppo_advantages(*args(rows), lambda x, k=k: raw[k].append(x) or x)[0] for k, rows in
           enumerate((first, second))]
    together = torch.cat([tg.ppo_advantages(*args(first), lambda x: torch.cat([x, raw[1][0]]))[0],
                          tg.ppo_advantages(*args(second), lambda x: torch.cat([raw[0][0], x]))[0]])
    torch.testing.assert_close(together, whole, rtol=1e-12, atol=1e-13)
    assert (torch.cat(own) - whole).abs().max() > 1e-2


def test_online_dpo_counts_only_groups_that_make_a_pair():
    """Two groups per minibatch, one of them tied: the loss is the mean over the one real pair, not over 2 groups."""
    b = make_batch()
    cfg = cfg_for(objective="online_dpo", beta=0.1, kl_placement="none")
    loss, stats = tg.policy_loss(b, cfg)
    L = b["mask"].sum(1)
    rho = ((b["lp"] - b["ref_lp"]) * b["mask"]).sum(1)
    w, l = 1, 0                                                      # group 0: R = 0.1, 0.7, 0.7 -> best 1, worst 0
    torch.testing.assert_close(loss, -F.logsigmoid(0.1 * (rho[w] - rho[l])), rtol=1e-12, atol=1e-14)
    assert stats["dpo/pairs"] == 1 and L.numel() == 6


# ------------------------------------------------------------------ the trainer's advantage with several groups
def test_advantages_are_per_group():
    R = torch.tensor([[0.0, 1.0, 1.0], [0.2, 0.2, 0.5]], dtype=D)
    kl = torch.tensor([[0.1, 0.3, 0.2], [0.0, 0.4, 0.1]], dtype=D)
    A = tg.advantages(R, kl, cfg_for(beta=0.1, advantage="zscore"))
    for g in range(2):
        z = (R[g] - R[g].mean()) / R[g].std()
        loo = torch.stack([kl[g, i] - (kl[g].sum() - kl[g, i]) / 2 for i in range(3)])
        torch.testing.assert_close(A[g], z - 0.1 * loo, rtol=1e-12, atol=1e-14)


def test_a_new_objective_is_one_function_and_one_registry_row(tiny_model, tmp_path, monkeypatch):
    """Register a policy gradient with a token mean and no clip: the flag accepts it, its row's needs drive the checks
    (--clip_eps does nothing here: its row says it has no ratio) and the run trains with it, nothing else edited."""
    import json

    def token_pg(b, cfg, agg):  # -A logpi(y_t), averaged over every token of the minibatch
        return agg(-b["adv"][:, None] * b["lp"]), {"pg/calls": 1.0}
    monkeypatch.setitem(tg.OBJECTIVES, "token_pg", tg.Objective(token_pg, "token_mean", "mean", clips="none"))
    flags = ["--model", tiny_model, "--objective", "token_pg", "--group_size", "4", "--max_new_tokens", "6",
             "--num_steps", "2", "--output_dir", str(tmp_path / "out"), "--log_dir", str(tmp_path), "--run_name", "pg",
             "--eval_size", "0"]
    with pytest.raises(tg.ConfigError, match="--clip_eps=0.1 does nothing here: token_pg has no ratio"):
        tg.parse_config(flags + ["--clip_eps", "0.1"], cuda=False)
    cfg = tg.parse_config(flags, cuda=False)
    assert cfg.advantage == "mean"                                       # the row's own advantage
    tg.train(cfg, reward_fn=lambda text: sum(map(ord, text)) % 7 / 7)    # a reward that varies in a group
    rows = [json.loads(ln) for ln in open(tmp_path / "pg.jsonl")]
    assert [r["step"] for r in rows] == [0, 1] and all(r["pg/calls"] == 1.0 and r["optim/grad_norm"] > 0 for r in rows)
