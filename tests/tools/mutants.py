"""Can the fast tests fail? Make one small wrong edit of transparent_grpo.py at a time and run them.

    python tests/tools/mutants.py            # every mutant: "killed" (a test failed) or "SURVIVED"
    python tests/tools/mutants.py gspo_sum   # one of them

Each mutant is a bug shape a reader or a refactor could plausibly introduce. The edited file lives in a temporary
copy of the repository; the working tree is never touched. Not collected by pytest (the name does not start with
test_). Exit code 1 if any mutant survives.
"""
import os, shutil, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = ["tests/test_objectives.py", "tests/test_math.py", "tests/test_core.py", "tests/test_reward.py",
        "tests/test_tasks.py"]
MUTANTS = {  # name: (exact text in transparent_grpo.py, its replacement), or a list of such pairs
    "gspo_sum": ('s = torch.exp(((b["lp"] - b["old_lp"]) * mask).sum(1) / mask.sum(1).clamp(min=1))',
                 's = torch.exp(((b["lp"] - b["old_lp"]) * mask).sum(1))'),
    "gspo_width_mean": ('s = torch.exp(((b["lp"] - b["old_lp"]) * mask).sum(1) / mask.sum(1).clamp(min=1))',
                        's = torch.exp(((b["lp"] - b["old_lp"]) * mask).sum(1) / mask.shape[1])'),
    "kl_in_loss_token_mean": ('loss = loss + cfg.beta * agg(KL_ESTIMATORS', 'loss = loss + cfg.beta * (lambda x: '
                              '(x * b["mask"]).sum() / b["mask"].sum())(KL_ESTIMATORS'),
    "ppo_no_whitening": ("return (A - A_all.mean()) / A_all.std().clamp(min=1e-6) * mask, returns",
                         "return A * mask, returns"),
    "ppo_whitens_per_process": ("A_all = everyone(A[mask.bool()])", "A_all = A[mask.bool()]"),
    "ppo_kl_reward_sign": ('r = -cfg.beta * kl_tok if', 'r = cfg.beta * kl_tok if'),
    "ppo_value_min": ("v_loss = 0.5 * torch.maximum(", "v_loss = 0.5 * torch.minimum("),
    "dpo_counts_tied_groups": ("/ valid.sum().clamp(min=1)", "/ valid.numel()"),
    "sequence_kl_no_mask": [("l = (lp - ref_lp).detach() * mask", "l = (lp - ref_lp).detach()"),
                            ("kl_tok = KL_ESTIMATORS[estimator](l) * mask", "kl_tok = KL_ESTIMATORS[estimator](l)")],
    "gae_no_mask": ("last = (delta + gamma * lam * last) * mask[:, t]", "last = delta + gamma * lam * last"),
    "k1_in_reward_not_detached": ("l = (lp - ref_lp).detach() * mask", "l = (lp - ref_lp) * mask"),
    "left_pads_positions_from_zero": ("pos = None if attn is None else (attn.cumsum(1) - 1).clamp(min=0)",
                                      "pos = None"),
    "advantage_sign": ("torch.where(std < 1e-6, 0.0, (R - R.mean(1, keepdim=True))",
                       "torch.where(std < 1e-6, 0.0, (R.mean(1, keepdim=True) - R)"),
    "tied_group_pushed": ("torch.where(std < 1e-6, 0.0, (R - R.mean(1, keepdim=True))",  # the float32 tie residue
                          "torch.where(std < 0, 0.0, (R - R.mean(1, keepdim=True))"),
    "gdpo_sums_before_zscore": ("A = (zscore(C if C.dim() == 3 else C[..., None]) * w).sum(-1)",
                                "A = zscore(((C if C.dim() == 3 else C[..., None]) * w).sum(-1))"),  # zscore of R
    "gdpo_no_batch_scale": ("A / std.clamp(min=1e-6))", "A)"),
    "gdpo_not_given_the_columns": ("C = R[..., None] if C is None else C", "C = R[..., None]"),
    "gdpo_ignores_its_weights": ('"gdpo": lambda R, C, w: gdpo(C, w)', '"gdpo": lambda R, C, w: gdpo(C)'),
    "truncation_weight_on_the_wrong_column": ("[cfg.truncation_weight, 1.0]", "[1.0, cfg.truncation_weight]"),
    "preset_beats_objective": ('for src in ({"advantage": objective.advantage} | objective.defaults, PRESETS.get('
                               'cfg.preset, {}), declared):', 'for src in (PRESETS.get(cfg.preset, {}), {"advantage":'
                               ' objective.advantage} | objective.defaults, declared):'),
    "ppo_takes_the_preset_advantage": ("cfg.advantage = passed_advantage", "pass"),
    "columns_truncation_sign": ("[[*part.values(), -cfg.truncation_penalty * cut,",
                                "[[*part.values(), cfg.truncation_penalty * cut,"),
    "kl_loo_includes_self": ("* G / (G - 1)", "* 1"),
    "clip_high_uses_low_eps": ("r.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps_high)",
                               "r.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps)"),
    "cispo_no_detach": ("r = torch.exp(b[\"lp\"] - b[\"old_lp\"]).detach()",
                        "r = torch.exp(b[\"lp\"] - b[\"old_lp\"])"),
    "logprobs_ignore_temperature": ("/ temperature                 # at least fp32",
                                    "                 # at least fp32"),
    "mask_excludes_eos": ("<= first[:, None]", "< first[:, None]"),
    "entropy_sign": ('loss = loss - c * agg(b["entropy"])', 'loss = loss + c * agg(b["entropy"])'),
    "entropy_control_backwards": ("(1 if H < cfg.entropy_target else -1)", "(-1 if H < cfg.entropy_target else 1)"),
    "entropy_control_uncapped": ("0.0), cfg.entropy_coef_max)", "0.0), math.inf)"),
    "reward_equation_continues": [('AFTER = r"', 'AFTER = r"(?![\\d.]*\\d)" or r"')],  # the old rule: digits only
    "value_takes_the_last_statement": ("text[s:]) for s in starts]", "text[s:]) for s in starts[-1:]]"),  # hedges pay
    "box_takes_the_last_box": ('for box in re.findall(r"\\\\boxed\\{([^{}]*)\\}", text)]',
                               'for box in re.findall(r"\\\\boxed\\{([^{}]*)\\}", text)[-1:]]'),
    "sampler_ignores_temperature": ("torch.multinomial(torch.softmax(logits.float() / cfg.temperature, -1), 1))",
                                    "torch.multinomial(torch.softmax(logits.float(), -1), 1))"),
    "sampler_plain_ignores_temperature": ("torch.softmax(out.logits[:, -1].float() / cfg.temperature, -1)",
                                          "torch.softmax(out.logits[:, -1].float(), -1)"),
    "sampler_plain_no_pad_after_eos": ("torch.where(done[:, None], pad_id, y)", "y"),
    "sampler_cache_old_keyword": ('return {"cache" if "cache" in params else "past_key_values": cache}',
                                  'return {"past_key_values": cache}'),
    "sampler_sharper_after_first": ("use_cache=True, logits_to_keep=1).logits[:, -1]              # [live, V]",
                                    "use_cache=True, logits_to_keep=1).logits[:, -1] * 50"),
    "sampler_keeps_sampling_after_eos": ("if not going.all():                                                         #",
                                         "if False:                                                         #"),
    "sampler_cache_not_advanced": ("self.len += k.shape[2]", "self.len += 0"),
    "sampler_twin_not_refreshed": ("t.copy_(weights[name])", "t.copy_(weights[name]) if False else None"),
    # the reference's log-prob path (checked by its own test in tests/test_e2e.py)
    "reference_path_by_training_mode": ('checkpointing = any(getattr(m, "gradient_checkpointing", False)',
                                        'checkpointing = model.training and any(getattr(m, "gradient_checkpointing", '
                                        'False)'),
    # the consistency shaping (checked by its table in tests/test_reward.py)
    "consistent_no_charge": (" - int(box == p.answer and not (a == p.a and b == p.b))", ""),
    "consistent_charge_needs_a_only": ("and not (a == p.a and b == p.b))", "and not a == p.a)"),
    "consistent_any_box": ("and box == a + b)", ")"),
}
SAMPLER = ["tests/test_sampler.py"]
REFERENCE = ["tests/test_e2e.py::test_with_gradient_checkpointing_the_reference_computes_what_the_policy_computes"]


def run(name, edits):
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(ROOT, "tests"), os.path.join(tmp, "tests"))
        src = open(os.path.join(ROOT, "transparent_grpo.py")).read()
        for old, new in edits if isinstance(edits, list) else [edits]:
            if src.count(old) != 1:
                return f"{name}: the text to edit is found {src.count(old)} times (update this script)"
            src = src.replace(old, new)
        open(os.path.join(tmp, "transparent_grpo.py"), "w").write(src)
        tests = SAMPLER if name.startswith("sampler") else REFERENCE if name.startswith("reference") else FAST
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests], cwd=tmp,
                           capture_output=True, text=True)
        failed = [ln.split(" ")[1] for ln in p.stdout.splitlines() if ln.startswith("FAILED")]
        return f"{name}: " + (f"killed by {failed[0] if failed else 'an error'}" if p.returncode else "SURVIVED")


if __name__ == "__main__":
    names = sys.argv[1:] or list(MUTANTS)
    results = []
    for n in names:
        results.append(run(n, MUTANTS[n]))
        print(results[-1], flush=True)
    sys.exit(1 if any("SURVIVED" in r or "found" in r for r in results) else 0)
