#!/bin/bash
# The small recipe over 8 seeds on one GPU, two ways side by side: one GPU (fp32 weights, bf16 autocast) and DeepSpeed
# ZeRO-2 bf16 (one process a run). 16 runs filled 92 GB of an H200 (2026-11-27): an H100 (78 GB) holds about 12
# (there: SEEDS=0-5). Then one table. Needs the real model at $M and the wheels on PYTHONPATH
# (../shared/gpu/prepare.sh carries both). Logs go to $L, every completion too (--log_samples). A candidate: its flags
# in EXTRA, its name in NAME; MODES picks one GPU, ZeRO-2 or both. Several candidates side by side: one call each, in
# the background, then `wait`.
#     bash tests/tools/gpu_sweep.sh
#     SEEDS=100-107 NAME=nocons EXTRA="--consistency_bonus 0" bash tests/tools/gpu_sweep.sh
#     SEEDS=100-103 MODES=1gpu NAME=zs EXTRA="--advantage zscore" bash tests/tools/gpu_sweep.sh &
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M=${M:-/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf}; L=${L:-${OUT:-/tmp}/runs}; N=${NAME:-gpu-defaults}; mkdir -p $L
SEEDS=${SEEDS:-0-7}; P=$(python3 -c "import sys; sys.path.insert(0, 'tests/tools'); import seeds; \
print(len(seeds.seeds_of('$SEEDS')))")
S="python3 tests/tools/seeds.py --seeds $SEEDS --parallel $P --log_dir $L"
F="--model $M --output_dir /tmp/o --log_samples ${EXTRA:-}"
(while sleep 120; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; \
  tail -qn1 $L/$N-*seed*.log 2>/dev/null | cut -c1-100; done) & WATCH=$!
MODES=${MODES:-1gpu zero2}; RUNS=()
[[ " $MODES " == *" 1gpu "* ]] && { $S --name $N-1gpu -- $F > $L/$N-1gpu.txt 2>&1 & RUNS+=($!); }
[[ " $MODES " == *" zero2 "* ]] && { $S --zero2 --name $N-zero2 -- $F > $L/$N-zero2.txt 2>&1 & RUNS+=($!); }
wait "${RUNS[@]}"
kill $WATCH
python3 tests/tools/seeds.py --table $L/$N-*.jsonl
