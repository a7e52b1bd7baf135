"""Shared fixtures: tiny random-weight models with a character-level tokenizer, built offline in the test."""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(2)
# the processes the tests start skip DeepSpeed's CPU kernel build: tests/ds_gloo/sitecustomize.py says why
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "tests", "ds_gloo"),
                                                         os.environ.get("PYTHONPATH")]))

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 =+-*/\\{}()[]<>|_:;.,$'\"!?\n")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def make_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    specials = ["<unk>", "</s>", "<s>", "<|system|>", "<|user|>", "<|assistant|>"]
    vocab = {t: i for i, t in enumerate(specials + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"<\|\w+\|>|[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="</s>", bos_token="<s>",
                                  pad_token="</s>", additional_special_tokens=specials[3:])  # pad == eos on purpose
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_tiny_model(folder, arch="llama", hidden=32, layers=2, seed=0):
    """A random-weight Llama or Qwen2 with the character tokenizer, saved to `folder`."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config
    tok = make_tokenizer()
    C = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = C(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
               tie_word_embeddings=arch == "qwen2")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_qwen"), arch="qwen2")


def rmsnorm_in_input_dtype(self, h):  # HF's formula: weight * h / sqrt(mean(h^2) + eps), without the cast to float32
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@pytest.fixture
def float64_norms(monkeypatch):
    """Llama's and Qwen2's RMSNorm in the input's dtype. HF's computes in float32 even in a float64 model, so two
    orders of summing the same gradients (the shared prompt's rows before the norm's backward, the naive path's
    after it) differ at float32 rounding, ~1e-7; with this the exact-math tests are exact to float64 rounding."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    for cls in (LlamaRMSNorm, Qwen2RMSNorm):
        monkeypatch.setattr(cls, "forward", rmsnorm_in_input_dtype)

