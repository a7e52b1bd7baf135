#!/bin/bash
# GPU sweep, 2026-11-27: the candidate recipe (code 4749b17: the box counts beside the right a and b) on seeds 100-103
# (kept apart from the reported 0-7), one GPU and ZeRO-2 bf16, and two levers on top of it, one GPU: 16 runs side by side.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
L=$OUT/runs; mkdir -p $L; M=/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
S="python3 tests/tools/seeds.py --seeds 100-103 --parallel 4 --log_dir $L"
F="--model $M --output_dir /tmp/o --num_steps 100 --time_limit ${TL:-6}"
(while sleep 90; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; \
  tail -qn1 $L/*seed*.log 2>/dev/null | cut -c1-90; done) & WATCH=$!
timeout ${WALL:-500} bash -c "
$S --name stated-1gpu -- $F > $L/stated-1gpu.txt 2>&1 &
$S --zero2 --name stated-zero2 -- $F > $L/stated-zero2.txt 2>&1 &
$S --name stated-entmax0.3 -- $F --entropy_coef_max 0.3 > $L/stated-entmax0.3.txt 2>&1 &
$S --name stated-zscore -- $F --advantage zscore > $L/stated-zscore.txt 2>&1 &
wait"
kill $WATCH
python3 tests/tools/seeds.py --table $L/*.jsonl | tee $OUT/table.txt
grep -h "Error\|error" $L/*.console | sort | uniq -c | head -20
cd $OUT && tar czf runs.tgz runs && rm -rf runs
