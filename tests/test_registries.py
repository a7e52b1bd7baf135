"""Every row of the registries against what any row must do, and one new row in each: the suite stays green.

KL_ESTIMATORS, ADVANTAGES and OBJECTIVES (and AGGREGATE) are edited one row at a time. Every row meets the checks any
row must pass: finite values and gradients, nothing from the padding, the right sign on a bandit (a better sample's
probability goes up), no push at all where the policy is its reference. Where the suite knows the name it also meets
its exact reference (test_math's ESTIMATOR_CLAIMS, ADVANTAGE_REFERENCES below, test_objectives's ref_loss); a name it
does not know gets the generic checks only, it never fails for being new. The last tests register new rows and run
them through those checks, the per-name tests of the other files and short training runs.
"""
import json

import pytest
import torch

import test_core
import test_e2e
import test_math
import test_objectives
import transparent_grpo as tg

D = torch.float64


# ------------------------------------------------------------------ KL estimators
def check_estimator(name):
    k = tg.KL_ESTIMATORS[name]
    l = torch.linspace(-5, 5, 101, dtype=D).requires_grad_(True)
    v = k(l)
    (g,) = torch.autograd.grad(v.sum(), l)
    assert v.shape == l.shape and torch.isfinite(v).all() and torch.isfinite(g).all(), name
    assert (k(torch.zeros(2, 3, dtype=D)) == 0).all(), f"{name}: pi = pi_ref must estimate exactly 0 KL"
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0), dtype=D)
    by_token = torch.stack([torch.stack([k(x[i, t]) for t in range(5)]) for i in range(4)])
    torch.testing.assert_close(k(x), by_token, rtol=1e-12, atol=1e-14)    # per token: a mask can hide one
    for placement in [p for p in tg.KL_PLACEMENTS if p != "none"]:
        cfg = test_math.cfg_for(kl_estimator=name, kl_placement=placement, beta=test_math.BETA)
        at_ref = test_math.expected_grad(cfg, ref_theta=test_math.THETA)  # pi = pi_ref: nothing to pull back
        torch.testing.assert_close(at_ref, torch.zeros_like(at_ref), rtol=0, atol=1e-13)
        assert torch.isfinite(test_math.expected_grad(cfg)).all(), (name, placement)
    claim = test_math.ESTIMATOR_CLAIMS.get(name, {})                         # a new row claims nothing
    logp, logq = torch.log_softmax(test_math.THETA, 0), torch.log_softmax(test_math.REF_THETA, 0)
    if "mean" in claim:                                                      # E_pi[k], by exact enumeration
        p, lr = logp.exp(), logp - logq
        assert (p * k(lr)).sum().item() == pytest.approx(claim["mean"](p, lr).item(), rel=1e-12), name
    if claim.get("nonneg"):
        assert (k(torch.linspace(-5, 5, 101, dtype=D)) >= -1e-15).all(), name
    for placement in [p for p in tg.KL_PLACEMENTS if p in claim]:          # the expected gradient it claims
        cfg = test_math.cfg_for(kl_estimator=name, kl_placement=placement, beta=test_math.BETA)
        torch.testing.assert_close(test_math.expected_grad(cfg), test_math.BETA * claim[placement](), rtol=1e-10,
                                   atol=1e-13)


@pytest.mark.parametrize("name", sorted(tg.KL_ESTIMATORS))
def test_every_kl_estimator_row(name):
    check_estimator(name)


# ------------------------------------------------------------------ advantages
R_GROUPS = torch.tensor([[0.0, 1.0, 0.5, 0.2], [0.3, 0.3, 0.3, 0.3], [1.0, 0.0, 0.0, 0.7]], dtype=D)  # one tied


def ref_zscore(r):
    m = sum(r) / len(r)
    s = (sum((x - m) ** 2 for x in r) / (len(r) - 1)) ** 0.5
    return [0.0 if s < 1e-6 else (x - m) / s for x in r]


def ref_gdpo(Rs):  # one part: each group's z-scores, over the batch's std of them
    z = [ref_zscore(r) for r in Rs]
    flat = [x for row in z for x in row]
    m = sum(flat) / len(flat)
    s = (sum((x - m) ** 2 for x in flat) / (len(flat) - 1)) ** 0.5
    return [[0.0 if s < 1e-6 else x / s for x in row] for row in z]


ADVANTAGE_REFERENCES = {  # name: the advantages of a batch of groups (lists of rewards), written out
    "zscore": lambda Rs: [ref_zscore(r) for r in Rs],
    "mean": lambda Rs: [[x - sum(r) / len(r) for x in r] for r in Rs],
    "rloo": lambda Rs: [[x - (sum(r) - x) / (len(r) - 1) for x in r] for r in Rs],
    "none": lambda Rs: [list(r) for r in Rs],
    "gdpo": ref_gdpo,
}


def check_advantage(name):
    R, (Q, G) = R_GROUPS, R_GROUPS.shape
    A = tg.advantages(R, torch.zeros_like(R), test_math.cfg_for(advantage=name, group_size=G, beta=0.1))  # [Q, G]
    assert A.shape == (Q, G) and torch.isfinite(A).all(), name
    torch.testing.assert_close(A, tg.ADVANTAGES[name](R, R[..., None], torch.ones(1, dtype=D)))
    for q in range(Q):
        for i in range(G):
            for j in range(G):
                if R[q, i] > R[q, j]:
                    assert A[q, i] > A[q, j], f"{name}: a better sample of group {q} must get a larger advantage"
                if R[q, i] == R[q, j]:
                    assert A[q, i] == A[q, j], f"{name}: equal rewards of group {q} must get equal advantages"
    perm = torch.tensor([2, 0, 3, 1])                                        # the order within a group is no signal
    torch.testing.assert_close(tg.ADVANTAGES[name](R[:, perm], R[:, perm, None], torch.ones(1, dtype=D)), A[:, perm])
    for q in range(Q):                     # within its group: alone, a group's advantages are the same up to a scale
        alone = tg.ADVANTAGES[name](R[q:q + 1], R[q:q + 1, :, None], torch.ones(1, dtype=D))[0]  # (gdpo: batch std)
        if alone.abs().max() > 0:
            c = (A[q] * alone).sum() / (alone * alone).sum()
            assert c > 0, name
            torch.testing.assert_close(A[q], c * alone, rtol=1e-10, atol=1e-12, msg=f"{name}: group {q} not alone")
    g = test_math.expected_grad(test_math.cfg_for(objective="grpo", advantage=name, beta=0.0),
                                task_reward=test_math.R_ARM)                 # G = 2, every outcome enumerated
    assert (g * test_math.grad_expected_reward()).sum() < 0, f"{name}: descending the loss must raise E[R]"
    if name in ADVANTAGE_REFERENCES:
        torch.testing.assert_close(A, torch.tensor(ADVANTAGE_REFERENCES[name](R.tolist()), dtype=D), rtol=1e-12,
                                   atol=1e-14)


@pytest.mark.parametrize("name", sorted(tg.ADVANTAGES))
def test_every_advantage_row(name):
    check_advantage(name)


# ------------------------------------------------------------------ aggregations
@pytest.mark.parametrize("name", sorted(tg.AGGREGATE))
def test_every_aggregation_row(name):
    """per_token: a mean over the minibatch's tokens (token_share, passes weigh it by tokens); otherwise a mean over its
    rows of each row's own value (DDP's mean over processes and passes' weights by rows are then exact)."""
    agg, cfg = tg.AGGREGATE[name], test_objectives.cfg_for()
    b = test_objectives.make_batch()
    x, m = b["entropy"].detach(), b["mask"]
    whole = agg.fn(x, m, cfg)
    assert torch.isfinite(whole) and whole.dim() == 0
    torch.testing.assert_close(agg.fn(x + 1e3 * (1 - m), m, cfg), whole)    # the padding counts for nothing
    rows = torch.stack([agg.fn(x[i:i + 1], m[i:i + 1], cfg) for i in range(len(x))])
    weights = m.sum(1) / m.sum() if agg.per_token else torch.full((len(x),), 1 / len(x), dtype=D)
    torch.testing.assert_close(whole, (weights * rows).sum(), rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ objectives
def objective_cfg(name, module, **kw):  # its KL built in: beta is its own and nothing is placed
    own_kl = tg.OBJECTIVES[name].reference
    return module.cfg_for(objective=name, beta=0.1 if own_kl else 0.0, kl_placement="none" if own_kl else None, **kw)


def check_objective(name):
    row = tg.OBJECTIVES[name]
    assert row.agg in tg.AGGREGATE and row.clips in ("both", "high", "none"), name
    assert row.advantage is None or row.advantage in tg.ADVANTAGES, name
    # off-policy, lengths differ, garbage in the padding: finite, and the padding gets no gradient
    b, cfg = test_objectives.make_batch(), objective_cfg(name, test_objectives)
    if row.critic:
        b["adv"] = torch.randn(*b["mask"].shape, generator=torch.Generator().manual_seed(1), dtype=D) * b["mask"]
    loss, stats = tg.policy_loss(b, cfg)
    assert loss.dim() == 0 and torch.isfinite(loss), name
    assert all(isinstance(v, float) and v == v for v in stats.values()), (name, stats)
    leaves = [b["lp"], b["entropy"], b["values"]]
    for g in torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True):
        assert torch.isfinite(g).all() and (g[b["mask"] == 0] == 0).all(), name
    # one group of one-token answers at pi = pi_old = pi_ref: the best answer's log-prob goes up, more than the worst's
    R = torch.tensor([0.2, 1.0, 0.0], dtype=D)
    lp = torch.tensor([[-1.2], [-0.7], [-1.5]], dtype=D, requires_grad=True)
    mask = torch.ones(3, 1, dtype=D)
    cfg = objective_cfg(name, test_objectives, group_size=3)
    kl_tok, kl_seq = tg.sequence_kl(lp, lp.detach(), mask, cfg.kl_estimator)
    b = dict(lp=lp, old_lp=lp.detach(), ref_lp=lp.detach(), mask=mask, R=R, entropy=torch.zeros_like(lp),
             adv=tg.advantages(R.view(1, -1), kl_seq.view(1, -1), cfg).flatten())
    if row.critic:                                                           # a value head at V = 0
        b["values"] = b["old_values"] = torch.zeros_like(lp)
        b["adv"], b["returns"] = tg.ppo_advantages(R, kl_tok, b["old_values"], mask, cfg)
    (g,) = torch.autograd.grad(tg.policy_loss(b, cfg)[0], lp)
    assert g[1, 0] < 0 and g[1, 0] < g[2, 0], f"{name}: the best sample's probability must rise: {g.flatten()}"
    # the bandit, every outcome enumerated (G = 2): descending the loss raises the expected reward
    cfg = objective_cfg(name, test_math)
    g = test_math.expected_grad(cfg, task_reward=test_math.R_ARM,
                                ref_theta=test_math.THETA if row.reference else test_math.REF_THETA)
    assert (g * test_math.grad_expected_reward()).sum() < 0, f"{name}: descending the loss must raise E[R]"


@pytest.mark.parametrize("name", sorted(tg.OBJECTIVES))
def test_every_objective_row(name):
    check_objective(name)


# ------------------------------------------------------------------ one new row in each registry
def reinforce_again(b, cfg, agg):  # REINFORCE under a new name: -A_i sum_t logpi(y_t)
    return agg(-b["adv"][:, None] * b["lp"]), {}


def register_new_rows(monkeypatch):
    monkeypatch.setitem(tg.KL_ESTIMATORS, "k4", lambda l: l.abs())
    monkeypatch.setitem(tg.ADVANTAGES, "centered", lambda R, C, w: R - R.mean(1, keepdim=True))
    monkeypatch.setitem(tg.OBJECTIVES, "reinforce_again", tg.Objective(reinforce_again, "seq_sum", "centered",
                                                                        clips="none"))


def test_one_new_row_in_each_registry_keeps_the_suite_green(monkeypatch, tmp_path, tiny_model, tiny_qwen):
    """k4 = |l|, advantages R - mean, a copy of reinforce (its own advantage: the new row): the generic checks, the
    tests of the other files that loop over the registries or take a name, and 2-step training runs all pass."""
    register_new_rows(monkeypatch)
    check_estimator("k4")
    check_advantage("centered")
    check_objective("reinforce_again")
    test_objectives.test_objective_matches_the_reference_off_policy("reinforce_again")
    for objective in ("reinforce_again", "grpo", "dapo"):
        test_objectives.test_kl_in_the_loss_uses_the_objectives_averaging(objective, "k4")
    test_objectives.test_kl_in_the_loss_uses_the_objectives_averaging("reinforce_again", "k1")
    test_objectives.test_entropy_bonus_uses_the_objectives_averaging("reinforce_again")
    test_objectives.test_sequence_kl_ignores_padding()                        # loops over KL_ESTIMATORS
    test_math.test_bandit_every_objective_finds_the_best_arm("reinforce_again")
    test_core.test_defaults_beside_their_flags_and_presets_as_differences_give_the_two_recipes(False,
                                                                                               test_core.THE_SMALL)
    test_core.test_only_objectives_with_their_own_advantages_run_without_one(tmp_path / "core")
    with pytest.raises(tg.ConfigError, match="--kl_estimator='not_an_estimator'"):
        tg.parse_config(["--model", tiny_model, "--kl_estimator", "not_an_estimator"], cuda=False)
    for sub in ("objective", "reward", "loss"):
        (tmp_path / sub).mkdir()
    test_e2e.test_every_objective_runs(tmp_path / "objective", tiny_qwen, "reinforce_again")  # 2 steps, its advantage
    for placement in ("reward", "loss"):                                     # k4 in the advantage, then in the loss
        test_e2e.test_every_estimator_and_placement_runs(tmp_path / placement, tiny_model, "k4", placement)
    rows = [json.loads(ln) for ln in open(tmp_path / "loss" / "logs" / "t.jsonl")]
    assert all("kl/k4" in r for r in rows) and rows[0]["kl/k4"] == 0.0      # logged like every estimator


def reinforce_with_kl(b, cfg, agg):  # REINFORCE with its own KL term: + beta * k1(logpi - logpi_ref) per token
    kl = agg(b["lp"] - b["ref_lp"])
    return agg(-b["adv"][:, None] * b["lp"]) + cfg.beta * kl, {"own/kl": kl.item()}


def test_an_objective_with_its_own_kl_gets_a_reference_without_comparing_pairs(monkeypatch, tmp_path, tiny_model):
    """reference=True, pairs=False: a reference model is loaded although no KL is placed, the minibatches need not keep
    groups whole (online_dpo's pairs do), and --beta is read (not IGNORED with --kl_placement none)."""
    monkeypatch.setitem(tg.OBJECTIVES, "reinforce_kl", tg.Objective(reinforce_with_kl, "seq_mean", "mean",
                                                                     clips="none", reference=True,
                                                                     defaults=dict(kl_placement="none")))
    check_objective("reinforce_kl")
    flags = ["--model", tiny_model, "--objective", "reinforce_kl", "--group_size", "4", "--minibatch_size", "2",
             "--max_new_tokens", "6", "--num_steps", "2", "--beta", "0.05", "--output_dir", str(tmp_path / "out"),
             "--log_dir", str(tmp_path), "--run_name", "kl", "--eval_size", "0"]
    cfg = tg.parse_config(flags, cuda=False)
    assert cfg.kl_placement == "none" and tg.needs_reference(cfg)
    with pytest.raises(tg.ConfigError, match="--kl_placement='reward' is invalid: reinforce_kl has its KL built in"):
        tg.parse_config(flags + ["--kl_placement", "reward"], cuda=False)
    tg.train(cfg, reward_fn=lambda text: sum(map(ord, text)) % 7 / 7)
    rows = [json.loads(ln) for ln in open(tmp_path / "kl.jsonl")]
    assert [r["step"] for r in rows] == [0, 1] and all("own/kl" in r and "kl/k1" in r for r in rows)
    assert rows[0]["kl/k1"] == 0.0 and rows[1]["own/kl"] != 0.0             # the reference stayed, the policy moved
