"""Exact-math tests (float64, full enumeration, no Monte Carlo): KL estimators, where the KL goes, every objective.

Expected gradients are computed as  sum_outcomes P(outcome) * grad(loss(outcome))  with P detached: exactly what
a Monte Carlo gradient estimates. They go through the trainer's own functions: sequence_kl, advantages,
policy_loss (and completion_mask and token_logprobs for the 2-step sequence model).
"""
import itertools
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import transparent_grpo as tg

D = torch.float64
K = 4
THETA = torch.tensor([0.3, -0.7, 1.1, 0.2], dtype=D)
REF_THETA = torch.tensor([-0.2, 0.4, 0.5, 0.0], dtype=D)
R_ARM = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D)  # binary task reward of each outcome


def cfg_for(**kw):
    kw.setdefault("group_size", 2)
    kw.setdefault("max_new_tokens", 4)
    return tg.resolve(tg.Config(model="/x", **kw), cuda=False)


def kl(p_log, q_log):
    return (p_log.exp() * (p_log - q_log)).sum()


# ------------------------------------------------------------------ estimators
def test_estimator_expectations_exact():
    logp, logq = torch.log_softmax(THETA, 0), torch.log_softmax(REF_THETA, 0)
    l = logp - logq                                         # one value per outcome
    p = logp.exp()
    true = kl(logp, logq)
    assert (p * tg.KL_ESTIMATORS["k1"](l)).sum() == pytest.approx(true.item(), rel=1e-12)
    assert (p * tg.KL_ESTIMATORS["k3"](l)).sum() == pytest.approx(true.item(), rel=1e-12)
    assert (p * tg.KL_ESTIMATORS["k3+"](l)).sum() == pytest.approx(true.item(), rel=1e-12)
    assert torch.all(tg.KL_ESTIMATORS["k3"](torch.linspace(-5, 5, 101, dtype=D)) >= -1e-15)  # 0 up to rounding
    assert (tg.KL_ESTIMATORS["k1"](l) < 0).any()            # k1 can be negative per sample
    # k2 = l^2/2: biased; its expectation is half the second moment, and it matches KL to second order only
    assert (p * tg.KL_ESTIMATORS["k2"](l)).sum() == pytest.approx((0.5 * p * l ** 2).sum().item(), rel=1e-12)
    assert abs((p * tg.KL_ESTIMATORS["k2"](l)).sum() - true) > 1e-3
    for eps in (1e-2, 1e-3):
        lq2 = torch.log_softmax(THETA + eps * REF_THETA, 0)
        l2 = logp - lq2
        assert (p * 0.5 * l2 ** 2).sum() / kl(logp, lq2) == pytest.approx(1.0, abs=10 * eps)


# ------------------------------------------------------------------ expected gradients, one-token outcomes
def expected_grad(cfg, task_reward=None, ref_theta=REF_THETA, theta=THETA):
    """sum over all G-tuples of outcomes of P(tuple) * grad(policy_loss(tuple)), through the trainer's functions."""
    theta = theta.clone().requires_grad_(True)
    logp, ref = torch.log_softmax(theta, 0), torch.log_softmax(ref_theta, 0)
    total = 0.0
    for ys in itertools.product(range(K), repeat=cfg.group_size):
        y = torch.tensor(ys)
        lp, ref_lp, mask = logp[y][:, None], ref[y][:, None], torch.ones(len(ys), 1, dtype=D)  # [G, 1]
        kl_tok, kl_seq = tg.sequence_kl(lp, ref_lp, mask, cfg.kl_estimator)
        R = task_reward[y] if task_reward is not None else torch.zeros(len(ys), dtype=D)
        A = tg.advantages(R.view(1, -1), kl_seq.view(1, -1), cfg).flatten()
        b = dict(lp=lp, old_lp=lp.detach(), ref_lp=ref_lp, mask=mask, adv=A, R=R, entropy=torch.zeros_like(lp))
        if tg.OBJECTIVES[cfg.objective].critic:      # a value head at V = 0: GAE's advantages (R on the one token)
            b["values"] = b["old_values"] = torch.zeros_like(lp)
            b["adv"], b["returns"] = tg.ppo_advantages(R, kl_tok, b["old_values"], mask, cfg)
        loss, _ = tg.policy_loss(b, cfg)
        total = total + lp.sum().exp().detach() * loss       # P(tuple) is not differentiated
    return torch.autograd.grad(total, theta)[0]


def grad_reverse_kl():  # d/dtheta_k KL(pi || ref) = pi_k (l_k - KL)   (softmax parameterisation)
    logp, logq = torch.log_softmax(THETA, 0), torch.log_softmax(REF_THETA, 0)
    return logp.exp() * ((logp - logq) - kl(logp, logq))


def grad_forward_kl():  # d/dtheta_k KL(ref || pi) = pi_k - ref_k
    return torch.softmax(THETA, 0) - torch.softmax(REF_THETA, 0)


def grad_expected_reward():  # d/dtheta_k E[R] = pi_k (R_k - E[R])
    p = torch.softmax(THETA, 0)
    return p * (R_ARM - (p * R_ARM).sum())


BETA = 0.05
ESTIMATOR_CLAIMS = {  # what each known row claims (README's table), checked exactly by enumeration; a new row claims
    # nothing: it gets the checks every row must pass (test_registries.py). mean: E_pi[k(l)]; loss, reward: the
    # expected gradient / beta with the estimator placed there
    "k1": dict(mean=lambda p, l: (p * l).sum(), reward=grad_reverse_kl,   # unbiased, reverse-KL gradient (default)
               loss=lambda: torch.zeros(K, dtype=D)),                     # zero expected gradient: beta only adds noise
    "k2": dict(mean=lambda p, l: (0.5 * p * l ** 2).sum(), loss=grad_reverse_kl),  # biased; l*grad(l): reverse KL
    "k3": dict(mean=lambda p, l: (p * l).sum(), nonneg=True, loss=grad_forward_kl),  # in the loss: the FORWARD KL
    "k3+": dict(mean=lambda p, l: (p * l).sum(), nonneg=True, loss=grad_reverse_kl),  # k3 value, k2 gradient
}
KL_CASES = [(e, placement, claim[placement]) for e, claim in ESTIMATOR_CLAIMS.items() for placement in tg.KL_PLACEMENTS
            if placement in claim]  # (estimator, placement, expected gradient / beta)


@pytest.mark.parametrize("objective", ["grpo", "reinforce", "rloo", "dapo", "cispo"])
@pytest.mark.parametrize("estimator,placement,target", KL_CASES)
def test_kl_gradient_by_estimator_and_placement(objective, estimator, placement, target):
    cfg = cfg_for(objective=objective, kl_estimator=estimator, kl_placement=placement, beta=BETA)
    g = expected_grad(cfg)
    torch.testing.assert_close(g, BETA * target(), rtol=1e-10, atol=1e-13)


def test_k3_in_reward_is_not_the_kl_gradient():
    g = expected_grad(cfg_for(kl_estimator="k3", kl_placement="reward", beta=BETA))
    assert (g - BETA * grad_reverse_kl()).abs().max() > 1e-4


@pytest.mark.parametrize("objective", ["reinforce", "rloo"])
def test_kl_gradient_needs_the_detach(monkeypatch, objective):
    """Without the detach the expected gradient is wrong, and this suite notices. (For ratio-based objectives at
    ratio 1 the extra term is sum_i grad(A_i) = 0, because the leave-one-out KL advantages sum to zero.)"""
    monkeypatch.setattr(tg, "sequence_kl", lambda lp, ref, m, e: ((lp - ref) * m, ((lp - ref) * m).sum(1)))
    g = expected_grad(cfg_for(objective=objective, kl_placement="reward", beta=BETA))
    assert (g - BETA * grad_reverse_kl()).abs().max() > 1e-4


# ------------------------------------------------------------------ objectives on-policy (ratio 1)
OBJECTIVE_SCALES = {  # expected gradient = -scale * grad E[R]  (G = 2, binary reward, one-token outcomes)
    "reinforce": 1.0, "rloo": 1.0,                      # unbiased policy gradient
    "grpo": 1 / math.sqrt(2), "dapo": 1 / math.sqrt(2), "gspo": 1 / math.sqrt(2), "cispo": 1 / math.sqrt(2),
    "dr_grpo": 0.5 / 4,                                 # mean-only advantage (G-1)/G, divided by max_new_tokens=4
}


@pytest.mark.parametrize("objective", sorted(OBJECTIVE_SCALES))
def test_objective_on_policy_gradient(objective):
    # z-score with G=2 binary rewards: A = +-(1/2)/std = +-1/sqrt(2) exactly, i.e. (R_i - R_j)/sqrt(2)
    g = expected_grad(cfg_for(objective=objective, beta=0.0), task_reward=R_ARM)
    torch.testing.assert_close(g, -OBJECTIVE_SCALES[objective] * grad_expected_reward(), rtol=1e-10, atol=1e-13)


def test_online_dpo_gradient_at_the_reference():
    """At pi = pi_ref: d/dtheta -log sigmoid(beta(rho_w - rho_l)) = -beta/2 (grad logpi_w - grad logpi_l),
    and E[1{R_1 != R_2}(grad logpi_w - grad logpi_l)] = 2 grad E[R] for binary rewards."""
    g = expected_grad(cfg_for(objective="online_dpo", beta=0.1), task_reward=R_ARM, ref_theta=THETA)
    torch.testing.assert_close(g, -0.1 * grad_expected_reward(), rtol=1e-10, atol=1e-13)


# ------------------------------------------------------------------ 2-step autoregressive toy (vocab a, b, EOS)
A_, B_, EOS, BOS = 0, 1, 2, 3


class Bigram(torch.nn.Module):
    """logits(y_t | y_{t-1}) = W[:, y_{t-1}]: a 2-step sequence model with the trainer's model interface."""

    def __init__(self, W):
        super().__init__()
        self.head = torch.nn.Linear(4, 3, bias=False).to(D)
        self.head.weight = torch.nn.Parameter(W.clone())

    def forward(self, input_ids, **kw):  # a bigram needs no cache: a stand-in lets the shared-prompt path run
        cache = SimpleNamespace(batch_repeat_interleave=lambda n: None)
        return SimpleNamespace(hidden_states=(F.one_hot(input_ids, 4).to(D),), past_key_values=cache)

    def get_output_embeddings(self):
        return self.head


SEQS = torch.tensor([[BOS, EOS, EOS]] + [[BOS, a, c] for a in (A_, B_) for c in (A_, B_, EOS)])  # pad == EOS
W0 = torch.tensor([[0.2, -0.4, 0.9, 0.3], [-0.1, 0.6, -0.3, 0.1], [0.5, 0.1, 0.0, -0.2]], dtype=D)
W_REF = torch.tensor([[0.0, 0.3, 0.2, -0.5], [0.4, -0.2, 0.1, 0.2], [-0.3, 0.2, 0.4, 0.6]], dtype=D)
R_SEQ = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], dtype=D)  # any fixed task reward per sequence


def seq_logprobs(model):
    mask, truncated = tg.completion_mask(SEQS[:, 1:], [EOS])
    lp = tg.token_logprobs(model, SEQS, 1, mask.to(D), 1.0)[0]            # [7, 2], the trainer's path
    return lp, mask.to(D), truncated


def test_toy_masks_and_probabilities():
    lp, mask, truncated = seq_logprobs(Bigram(W0))
    assert mask.tolist() == [[1, 0]] + [[1, 1]] * 6
    assert truncated.tolist() == [False, True, True, False, True, True, False]
    assert (lp * mask).sum(1).exp().sum().item() == pytest.approx(1.0, abs=1e-12)


def expected_grad_seq(cfg, task_reward):
    policy, ref = Bigram(W0), Bigram(W_REF)
    lp, mask, _ = seq_logprobs(policy)
    ref_lp = seq_logprobs(ref)[0].detach()
    P = (lp * mask).sum(1).exp().detach()                                   # [7] sequence probabilities
    total = 0.0
    for ys in itertools.product(range(len(SEQS)), repeat=cfg.group_size):
        y = torch.tensor(ys)
        kl_tok, kl_seq = tg.sequence_kl(lp[y], ref_lp[y], mask[y], cfg.kl_estimator)
        A = tg.advantages(task_reward[y].view(1, -1), kl_seq.view(1, -1), cfg).flatten()
        b = dict(lp=lp[y], old_lp=lp[y].detach(), ref_lp=ref_lp[y], mask=mask[y], adv=A, R=task_reward[y],
                 entropy=torch.zeros_like(lp[y]))
        total = total + P[y].prod() * tg.policy_loss(b, cfg)[0]
    return torch.autograd.grad(total, policy.head.weight)[0]


def exact_seq_grads():
    policy = Bigram(W0)
    lp, mask, _ = seq_logprobs(policy)
    ref_lp = seq_logprobs(Bigram(W_REF))[0].detach()
    logP, logQ = (lp * mask).sum(1), (ref_lp * mask).sum(1)
    seq_kl = (logP.exp() * (logP - logQ)).sum()                             # KL between sequence distributions
    g_kl = torch.autograd.grad(seq_kl, policy.head.weight, retain_graph=True)[0]
    g_r = torch.autograd.grad((logP.exp() * R_SEQ).sum(), policy.head.weight)[0]
    return g_kl, g_r


@pytest.mark.parametrize("objective,scale", [("reinforce", 1.0), ("rloo", 1.0), ("dr_grpo", 1 / 2)])
def test_sequence_k1_in_reward_is_the_sequence_kl_gradient(objective, scale):
    """Sequences of length 1 and 2: k1 summed over the sequence, in the reward, gives beta * grad KL_seq exactly
    (dr_grpo divides by max_new_tokens = 2)."""
    g_kl, _ = exact_seq_grads()
    g = expected_grad_seq(cfg_for(objective=objective, beta=BETA, max_new_tokens=2), torch.zeros(7, dtype=D))
    torch.testing.assert_close(g, BETA * scale * g_kl, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("objective,scale", [("reinforce", 1.0), ("rloo", 1.0), ("dr_grpo", 0.5 / 2)])
def test_sequence_policy_gradient_is_unbiased(objective, scale):
    """RLOO is unbiased; Dr.GRPO is the policy gradient up to a constant: no length bias."""
    _, g_r = exact_seq_grads()
    g = expected_grad_seq(cfg_for(objective=objective, beta=0.0, max_new_tokens=2), R_SEQ)
    torch.testing.assert_close(g, -scale * g_r, rtol=1e-10, atol=1e-13)


def test_grpo_length_normalisation_is_biased():
    """GRPO's 1/|o_i| (with the mean-only advantage, to isolate it) is not proportional to grad E[R]."""
    _, g_r = exact_seq_grads()
    g = expected_grad_seq(cfg_for(objective="grpo", advantage="mean", beta=0.0, max_new_tokens=2), R_SEQ)
    cos = (g * -g_r).sum() / (g.norm() * g_r.norm())
    assert cos < 1 - 1e-4


def test_dr_grpo_weights_every_token_equally():
    """Two answers of lengths 2 and 5 with the same advantage: dr_grpo gives each token the same weight
    (so a long answer's total weight is not shrunk to that of a short one); grpo gives 1/|o_i|."""
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=D)
    for objective, expected in (("dr_grpo", [[-1 / 10] * 2, [-1 / 10] * 5]), ("grpo", [[-1 / 4] * 2, [-1 / 10] * 5])):
        lp = torch.zeros(2, 5, dtype=D, requires_grad=True)
        b = dict(lp=lp, old_lp=lp.detach(), mask=mask, adv=torch.ones(2, dtype=D), R=torch.zeros(2, dtype=D))
        g = torch.autograd.grad(tg.policy_loss(b, cfg_for(objective=objective, max_new_tokens=5, beta=0.0))[0], lp)[0]
        got = [g[0, :2].tolist(), g[1].tolist()]
        assert got == [pytest.approx(e, abs=1e-15) for e in expected]


# ------------------------------------------------------------------ clipping: who keeps a gradient
def grad_at_ratio(objective, ratio, adv, **kw):
    lp = torch.zeros(1, 1, dtype=D, requires_grad=True)
    old = torch.full((1, 1), -math.log(ratio), dtype=D)                     # r = exp(lp - old) = ratio
    b = dict(lp=lp, old_lp=old, mask=torch.ones(1, 1, dtype=D), adv=torch.tensor([adv], dtype=D),
             R=torch.zeros(1, dtype=D))
    return torch.autograd.grad(tg.policy_loss(b, cfg_for(objective=objective, beta=0.0, **kw))[0], lp)[0].item()


@pytest.mark.parametrize("objective,ratio,adv,expected", [
    ("grpo", 1.3, +1, 0.0), ("grpo", 1.3, -1, 1.3),       # above 1+eps: only A<0 keeps its gradient
    ("grpo", 0.7, -1, 0.0), ("grpo", 0.7, +1, -0.7),      # below 1-eps: only A>0 keeps its gradient
    ("grpo", 1.1, +1, -1.1),                               # inside the trust region: -A r
    ("grpo", 1.25, +1, 0.0), ("dapo", 1.25, +1, -1.25),    # dapo's clip_eps_high = 0.28 lets 1.25 through
    ("dapo", 1.3, +1, 0.0), ("dapo", 0.75, -1, 0.0),
    ("gspo", 1.001, +1, 0.0), ("gspo", 1.0002, +1, -1.0002),  # gspo's eps is tiny: 4e-4 above
    ("cispo", 10.0, +1, -5.0),                             # cispo: weight capped at 1+4, gradient kept
    ("cispo", 0.1, -1, 0.1),                               # no lower cap
])
def test_clipping(objective, ratio, adv, expected):
    assert grad_at_ratio(objective, ratio, adv) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_gae_matches_hand_computation():
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=D)
    v = torch.tensor([[0.5, 0.2, 0.4, 9.0]], dtype=D)
    m = torch.tensor([[1, 1, 1, 0]], dtype=D)
    A, ret = tg.gae(r, v, m, gamma=0.9, lam=0.8)
    d = [0 + 0.9 * 0.2 - 0.5, 0 + 0.9 * 0.4 - 0.2, 1 + 0 - 0.4]
    a2 = d[2]; a1 = d[1] + 0.72 * a2; a0 = d[0] + 0.72 * a1
    torch.testing.assert_close(A, torch.tensor([[a0, a1, a2, 0]], dtype=D))
    torch.testing.assert_close(ret[:, :3], A[:, :3] + v[:, :3])


# ------------------------------------------------------------------ bandit demo: every objective finds the best arm
@pytest.mark.parametrize("objective", sorted(tg.OBJECTIVES))
def test_bandit_every_objective_finds_the_best_arm(objective):
    arm_reward = torch.tensor([0.2, 0.5, 1.0, 0.0], dtype=D)
    row = tg.OBJECTIVES[objective]                                       # its KL built in: beta is its own
    cfg = cfg_for(objective=objective, group_size=8, minibatch_size=8, beta=0.1 if row.reference else 0.01)
    theta = torch.zeros(4, dtype=D, requires_grad=True)
    value = torch.zeros(1, dtype=D, requires_grad=True)
    opt = torch.optim.Adam([theta, value], lr=0.1)
    gen = torch.Generator().manual_seed(0)
    ref_lp_all = torch.log_softmax(torch.zeros(4, dtype=D), 0)
    for _ in range(150):
        logp = torch.log_softmax(theta, 0)
        arms = torch.multinomial(logp.exp().detach(), 8, replacement=True, generator=gen)
        lp, mask = logp[arms][:, None], torch.ones(8, 1, dtype=D)             # [G, 1]
        ref_lp, R = ref_lp_all[arms][:, None], arm_reward[arms]
        kl_tok, kl_seq = tg.sequence_kl(lp, ref_lp, mask, cfg.kl_estimator)
        b = dict(lp=lp, old_lp=lp.detach(), ref_lp=ref_lp, mask=mask, R=R, entropy=torch.zeros_like(lp),
                 adv=tg.advantages(R.view(1, -1), kl_seq.view(1, -1), cfg).flatten())
        if row.critic:
            b["values"] = value.expand(8, 1)
            b["old_values"] = b["values"].detach()
            b["adv"], b["returns"] = tg.ppo_advantages(R, kl_tok, b["old_values"], mask, cfg)
        loss, _ = tg.policy_loss(b, cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.softmax(theta, 0)[2] > 0.9, torch.softmax(theta, 0)


def test_entropy_bonus_raises_entropy():
    """loss -= c * H: the gradient of the loss with respect to each token's entropy is -c / |o| (seq_mean)."""
    H = torch.full((2, 4), 1.5, dtype=D, requires_grad=True)
    lp = torch.zeros(2, 4, dtype=D, requires_grad=True)
    b = dict(lp=lp, old_lp=lp.detach(), mask=torch.ones(2, 4, dtype=D), adv=torch.zeros(2, dtype=D),
             R=torch.zeros(2, dtype=D), entropy=H)
    g = torch.autograd.grad(tg.policy_loss(b, cfg_for(entropy_coef=0.1, beta=0.0))[0], H)[0]
    torch.testing.assert_close(g, torch.full((2, 4), -0.1 / 4 / 2, dtype=D))
