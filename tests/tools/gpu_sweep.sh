#!/bin/bash
# Candidate recipes for the small model, side by side on one GPU (one process per run): seeds.py per candidate, then
# one table. Needs the real model at $M and the wheels on PYTHONPATH (../shared/gpu/prepare.sh). Logs go to $L.
#     SEEDS=100-103 TL=6.5 bash tests/tools/gpu_sweep.sh
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M=${M:-/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf}; L=${L:-${OUT:-/tmp}/runs}; mkdir -p $L
S="python3 tests/tools/seeds.py --seeds ${SEEDS:-100-103} --parallel 4 --log_dir $L"
B="--model $M --output_dir /tmp/o --time_limit ${TL:-6.5}"
E="--entropy_target 0.2 --entropy_step 5e-3 --entropy_coef_max 0.1 --halves_temperature 0.8"
$S --name g16 -- $B --group_size 16 --num_steps 64 > $L/g16.txt 2>&1 &
$S --name g16-ent -- $B --group_size 16 --num_steps 64 $E > $L/g16-ent.txt 2>&1 &
$S --name g8-ent -- $B --num_steps 120 $E > $L/g8-ent.txt 2>&1 &
for t in 60 120 240; do sleep 60; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; \
  tail -qn1 $L/*seed*.log 2>/dev/null | cut -c1-110; done
wait
python3 tests/tools/seeds.py --table $L/*.jsonl
