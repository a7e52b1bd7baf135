"""Real Qwen2.5 ids: the tokenizer, chat template and config of Qwen2.5-Coder-0.5B-Instruct, read from a GGUF that
holds them alone (tests/data/qwen2.5-tokenizer.gguf.gz, made by tests/tools/qwen_coder_05b.py --tokenizer_only; no
weights). Its pad <|endoftext|> (151643) is not its EOS <|im_end|> (151645): a completion ends at the first EOS only."""
import gzip
import os
import shutil
from types import SimpleNamespace

import pytest
import torch

import transparent_grpo as tg

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "qwen2.5-tokenizer.gguf.gz")
IM_END, ENDOFTEXT = 151645, 151643


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen_ids") / "qwen2.5-tokenizer.gguf")
    with gzip.open(DATA, "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    from transformers import GenerationConfig
    with tg.gguf_read_once(path):   # the config and the tokenizer read one parse of the file (~20 s), as load_model
        config = tg.model_config(path, False)
        model = SimpleNamespace(generation_config=GenerationConfig.from_model_config(config), config=config)
        tok = tg.tokenizer_of(path)
    assert list(tg.GGUF_READS) == [path]
    tg.GGUF_READS.clear()
    return tok, model, path


def test_the_ids_are_qwens(qwen):
    tok, model, _ = qwen
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == \
        ("<|im_end|>", IM_END, "<|endoftext|>", ENDOFTEXT)
    assert len(tok) == model.config.vocab_size == 151936                 # the GGUF lists every embedding row
    assert tg.eos_ids(tok, model) == [IM_END]                             # <|endoftext|> does not end a completion


def test_the_chat_prompt_ends_where_the_assistant_starts(qwen):
    tok, model, _ = qwen
    cfg = SimpleNamespace(max_new_tokens=256)
    ids = tok.apply_chat_template(tg.toy_messages(2), add_generation_prompt=True, return_dict=True)["input_ids"]
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert text.count("<|im_start|>assistant\n") == 3 and text.count("<|im_end|>") == 6   # system, 2 solved, asked
    assert "\\boxed{0}" not in text and tg.TOY.statement in text                         # the asked one's answer hidden
    assert IM_END in ids and ENDOFTEXT not in ids


def completion(tok, text, *tail):
    return tok(text, add_special_tokens=False)["input_ids"] + list(tail)


def test_the_mask_ends_at_im_end_not_at_the_pad(qwen):
    tok, model, _ = qwen
    eos = tg.eos_ids(tok, model)
    right = "So a + b = -3 + 3 = 0, and the answer is \\boxed{0}."
    rows = [completion(tok, right, IM_END, ENDOFTEXT, ENDOFTEXT),           # ends, then the sampler's pads
            completion(tok, "x = 2", ENDOFTEXT, *completion(tok, " then \\boxed{0}."), IM_END),  # a pad id inside
            completion(tok, right, ENDOFTEXT)]                              # ends in the pad only: no EOS
    T = max(map(len, rows))
    ids = torch.tensor([r + [ENDOFTEXT] * (T - len(r)) for r in rows])      # [3, T] right-padded with the pad id
    mask, truncated = tg.completion_mask(ids, eos)                          # [3, T], [3]
    ends = [rows[0].index(IM_END), rows[1].index(IM_END)]
    assert mask[0].sum() == ends[0] + 1 and mask[1].sum() == ends[1] + 1    # up to and including <|im_end|>
    assert mask[1, rows[1].index(ENDOFTEXT)] == 1                           # the pad id inside is a kept token
    assert truncated.tolist() == [False, False, True] and mask[2].sum() == T  # no <|im_end|>: truncated, all kept
    texts, _, cut = tg.decode(tok, ids, eos)
    assert texts[0] == right and texts[1] == "x = 2 then \\boxed{0}." and cut.tolist() == [False, False, True]
    assert "<|endoftext|>" not in texts[2] and texts[2].startswith(right)   # special tokens leave the text
    assert tg.toy_reward(texts[0]) == tg.toy_reward(right)


def test_sampling_stops_a_row_at_im_end_only(qwen, tmp_path):
    """A random Qwen2-shaped model (the real vocabulary) scripted to emit <|endoftext|> twice, then <|im_end|>: the
    textbook loop runs past the pad id and stops at <|im_end|>."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    tok, model, _ = qwen
    torch.manual_seed(0)
    net = Qwen2ForCausalLM(Qwen2Config(vocab_size=151936, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)).eval()
    step, forward = {"n": 0}, net.forward

    def scripted(*a, **k):  # the pad id twice, then <|im_end|>
        out = forward(*a, **k)
        step["n"] += 1
        out.logits[...] = -1e4
        out.logits[..., ENDOFTEXT if step["n"] <= 2 else IM_END] = 0.0
        return out
    net.forward = scripted
    cfg = SimpleNamespace(max_new_tokens=8, temperature=1.0, sampler="plain")
    prompt = torch.tensor([tok.apply_chat_template(tg.toy_messages(0), add_generation_prompt=True,
                                                   return_dict=True)["input_ids"]])   # [1, P]
    seqs = tg.sample(net, prompt, 2, cfg, tg.eos_ids(tok, model), tok.pad_token_id)      # [2, P+T]
    tail = seqs[:, prompt.shape[1]:]                                                    # [2, T]
    mask, truncated = tg.completion_mask(tail, tg.eos_ids(tok, model))
    assert tail.tolist() == [[ENDOFTEXT, ENDOFTEXT, IM_END]] * 2 and not truncated.any()
    assert mask.sum(1).tolist() == [3, 3]                                  # the pad ids before it are kept tokens


def test_the_model_picks_its_preset(monkeypatch):
    path = "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert tg.preset_for(path, cuda=False) == tg.preset_for(path, cuda=True) == "qwen2.5-coder-0.5b"
    cfg = tg.resolve(tg.Config(model=path), cuda=False)
    own = tg.PRESETS["qwen2.5-coder-0.5b"]
    assert (cfg.task, cfg.group_size, cfg.learning_rate, cfg.worked_examples, cfg.micro_batch_size) == \
        (own["task"], own["group_size"], own["learning_rate"], own["worked_examples"], own["micro_batch_size"])
    assert tg.resolve(tg.Config(model=path, learning_rate=3e-6), cuda=False).learning_rate == 3e-6   # a flag wins
    assert tg.resolve(tg.Config(), cuda=False).preset == "smollm2-135m"                               # the default
    assert "qwen2.5-coder-0.5b" in tg.CPU_AMP and "smollm2-135m" not in tg.CPU_AMP   # the default stays fp32
