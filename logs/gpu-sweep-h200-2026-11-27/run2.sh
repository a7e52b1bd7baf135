#!/bin/bash
# GPU sweep 2, 2026-11-27: candidate 2 (code of the commit that adds this log: the box that is the stated a + b pays,
# the right box without the right a and b is charged), seeds 100-107, one GPU, 8 runs side by side.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
L=$OUT/runs; mkdir -p $L; M=/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
timeout ${WALL:-240} python3 tests/tools/seeds.py --seeds 100-107 --parallel 8 --log_dir $L --name sum-1gpu -- \
  --model $M --output_dir /tmp/o --num_steps 100 --time_limit ${TL:-3.3} > $L/sum-1gpu.txt 2>&1
python3 tests/tools/seeds.py --table $L/*.jsonl | tee $OUT/table.txt
cd $OUT && tar czf runs.tgz runs && rm -rf runs
