#!/bin/bash
# The small recipe over 8 seeds on one GPU, two ways side by side: one GPU (fp32 weights, bf16 autocast) and DeepSpeed
# ZeRO-2 bf16 (one process a run). Then one table. Needs the real model at $M and the wheels on PYTHONPATH
# (../shared/gpu/prepare.sh carries both). Logs go to $L, every completion too (--log_samples); under a device call
# ($OUT set) they leave as ONE file, $OUT/<NAME>-runs.tgz: a call brings back only a few files (2026-11-27: 8 of 66).
# MINUTES stops every run after that many minutes of steps (--time_limit), so the table and the tarball come before
# the call's own limit kills everything. A candidate: its flags in EXTRA, its name in NAME; MODES picks one GPU, ZeRO-2
# or both. STOP=1 stops each run once it passes (seeds.py --stop_passed), leaving the GPU to the rest. STEPS (60):
# the GPU passed later than the CPU (cc1f15e: steps 28-53), so a sweep gives it more than the CPU's 28. Measured
# (cc1f15e, 2026-11-27): on an H200, 16 runs (both modes) held 85-110 GiB, ~9 s a step on one GPU and ~12 s under
# ZeRO-2; on an H100, 8 runs of one mode at a time: 40-46 GiB and 4.6-5.0 s a step on one GPU (60 steps in 5.6
# minutes), 50-55 GiB and 5.4-5.6 s under ZeRO-2; the first step 33-49 s. Never stop runs with `pkill -f <a word of
# this command line>`: it kills the call's own shell too.
#     MINUTES=7.5 bash tests/tools/gpu_sweep.sh                  # an H200
#     MINUTES=8 MODES=1gpu bash tests/tools/gpu_sweep.sh          # an H100: one mode a call (MODES=zero2 next)
#     SEEDS=100-107 NAME=nocons EXTRA="--consistency_bonus 0" bash tests/tools/gpu_sweep.sh
#     SEEDS=100-103 MODES=1gpu NAME=zs EXTRA="--advantage zscore" bash tests/tools/gpu_sweep.sh &
#     SEEDS=0-15 MODES=1gpu NAME=x SCRIPT=path/to/tool.py bash tests/tools/gpu_sweep.sh  # a tool that calls main()
#     STEPS=28 MODES=1gpu NAME=family EXTRA="--task family --eval_every 14 --eval_size 64" bash tests/tools/gpu_sweep.sh
#         (and NAME=problem --task problem): README's "Does it generalise?" on 8 seeds; the held-out table follows
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M=${M:-/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf}; L=${L:-/tmp/runs}; N=${NAME:-gpu-defaults}; mkdir -p "$L"
SEEDS=${SEEDS:-0-7}; P=$(python3 -c "import sys; sys.path.insert(0, 'tests/tools'); import seeds; \
print(len(seeds.seeds_of('$SEEDS')))")
S="python3 tests/tools/seeds.py --seeds $SEEDS --parallel $P --log_dir $L ${STOP:+--stop_passed}"
S="$S ${SCRIPT:+--script $SCRIPT}"
F="--model $M --output_dir /tmp/o --log_samples --num_steps ${STEPS:-60} ${MINUTES:+--time_limit $MINUTES} ${EXTRA:-}"
(while sleep 120; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; \
  tail -qn1 "$L"/$N-*seed*.log 2>/dev/null | cut -c1-100; done) & WATCH=$!
MODES=${MODES:-1gpu zero2}; RUNS=()
[[ " $MODES " == *" 1gpu "* ]] && { $S --name $N-1gpu -- $F > "$L/$N-1gpu.txt" 2>&1 & RUNS+=($!); }
[[ " $MODES " == *" zero2 "* ]] && { $S --zero2 --name $N-zero2 -- $F > "$L/$N-zero2.txt" 2>&1 & RUNS+=($!); }
wait "${RUNS[@]}"
kill $WATCH
python3 tests/tools/seeds.py --table "$L"/$N-*[0-9].jsonl | tee "$L/$N-table.md"
if ls "$L"/$N-*.eval.jsonl > /dev/null 2>&1; then                  # --eval_size: held-out accuracy before and after
  python3 tests/tools/seeds.py --held_out - "$L"/$N-*.eval.jsonl | tee "$L/$N-held-out.md"
fi
if [ -n "${OUT:-}" ]; then
  rm -f "$L"/*.console; tar czf "$OUT/$N-runs.tgz" -C "$L" . && echo "logs: \$OUT/$N-runs.tgz"
fi
