"""GPU only: python tests/tools/gpu_sampler_variants.py MODEL_FOLDER G TOKENS [variants] (gpu_check.sh sampler).
ms per decode token of a random Qwen2.5-3B-shaped model, G rows of one prompt, full length (EOS disabled): our
fast sampler vs HF generate, fp32 weights under bf16 autocast (the one-GPU path) vs bf16 weights, and HF generate
with a static cache + torch.compile (reduce-overhead = CUDA graphs)."""
import sys, time, torch
sys.path.insert(0, ".")
import transparent_grpo as tg
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.generation.configuration_utils import CompileConfig

folder, G, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
variants = sys.argv[4].split(",") if len(sys.argv) > 4 else ["fast32", "hf32", "fast16", "hf16", "hf16compile"]
dev = "cuda" if torch.cuda.is_available() else "cpu"
tok = AutoTokenizer.from_pretrained(folder)
ids = tok.apply_chat_template(tg.toy_messages(False), add_generation_prompt=True, return_tensors="pt",
                              return_dict=True)["input_ids"].to(dev)
cfg = tg.Config(max_new_tokens=T, temperature=1.0)
m32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(dev).eval()
m16 = None


def sync_time(fn):
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    sync(); t = time.time(); out = fn(); sync()
    return time.time() - t, out


def hf(model, **kw):
    g = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=T, min_new_tokens=T,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **kw)
    x = ids.expand(G, -1)
    with torch.inference_mode():
        return model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=g)


for v in variants:
    if v.endswith(("16", "16compile")) and m16 is None:
        m16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(dev).eval()
    model = m32 if "32" in v else m16
    auto = torch.autocast(dev, dtype=torch.bfloat16, enabled="32" in v)
    for rep in range(3 if "compile" in v else 2):
        with auto:
            if v.startswith("fast"):
                s, out = sync_time(lambda: tg.sample(model, ids, G, cfg, [-1], tok.pad_token_id))
            elif v == "hf16compile":
                cc = CompileConfig(mode="reduce-overhead", fullgraph=False, dynamic=False)
                s, out = sync_time(lambda: hf(model, cache_implementation="static", compile_config=cc))
            else:
                s, out = sync_time(lambda: hf(model))
        n = out.shape[1] - ids.shape[1]
        print(f"{v:>12} rep {rep}: {s:6.2f} s for {n} tokens x {G} rows = {1000 * s / n:6.1f} ms/token, "
              f"peak {(torch.cuda.max_memory_allocated() if dev == 'cuda' else 0) / 2**30:.1f} GiB", flush=True)
