"""Where the shared-prompt path's ~1e-7 gradient residual in float64 came from: HF's RMSNorm casts to float32.

    python tests/rmsnorm_residual_probe.py

Not a test. For a tiny Llama and Qwen2 in float64, the largest difference between token_logprobs' gradients (one
prompt pass, its KV cache repeated for 3 completions) and a naive full forward's, relative to the largest gradient:
with HF's RMSNorm (float32 inside) and with the same norm in float64 (tests/conftest.py's float64_norms).
"""
import os, sys, tempfile

import torch

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(os.path.abspath(__file__))]
import transparent_grpo as tg
from conftest import make_tiny_model, rmsnorm_in_input_dtype
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm


torch.manual_seed(0)
for arch, cls in (("llama", LlamaRMSNorm), ("qwen2", Qwen2RMSNorm)):
    folder = make_tiny_model(tempfile.mkdtemp(), arch=arch)
    ids = torch.randint(6, 60, (3, 12))
    ids[:, :6] = ids[0, :6]                                            # one prompt, 3 completions of 6 tokens
    mask = torch.ones(3, 6)
    mask[1, 3:] = 0
    stock = cls.forward
    for name, forward in (("HF RMSNorm (float32 inside)", stock), ("the same norm in float64", rmsnorm_in_input_dtype)):
        cls.forward = forward
        model = AutoModelForCausalLM.from_pretrained(folder).double()

        def grads(fn):
            model.zero_grad()
            fn().sum().backward()
            return torch.cat([p.grad.flatten() for p in model.parameters()])
        shared = grads(lambda: tg.token_logprobs(model, ids, 6, mask, 0.8)[0])
        naive = grads(lambda: torch.log_softmax(model(input_ids=ids).logits[:, 5:-1] / 0.8, -1).gather(
            -1, ids[:, 6:, None]).squeeze(-1) * mask)
        print(f"{arch:6s} {name:28s} max |shared - naive| / max |naive| = "
              f"{((shared - naive).abs().max() / naive.abs().max()).item():.2e}", flush=True)
    cls.forward = stock
