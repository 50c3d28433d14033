#!/usr/bin/env bash
# Continue pretraining the shipped embedded Wan world model on one GPU machine, three
# variants in parallel, each for a wall-clock budget; python -m wc_fast.eval picks between
# them on the CPU afterwards (docs/base_model.md, "The embedded Wan world model").
#
#   bash bench/gpu_wan_base.sh OUT_DIR [MINUTES]      (MINUTES: each job's budget, 7)
#
# The variants start from wc_fast/assets/wan_base_model.safetensors at stage 3's data (a
# two-key combination in a fifth of the clips) and differ in what a GPU makes cheap:
#   more:  stage 3's settings (batch 4, lr 5e-4), only more steps
#   batch: 16 sequences a step
#   combo: 16 sequences, lr 3e-4, a two-key combination in 30% of the clips
# Clips are rendered on the CPU (4 threads per job), the networks train on the GPU. Writes
# OUT_DIR/wan_NAME.tgz (EMA weights, card, loss log) per variant and OUT_DIR/wan_base.log.
# Needs nothing from a registry but the wheels of bench/gpu_wheels.sh in .whl/ (diffusers).
# DEVICE=cpu MINUTES=0.1 checks the script without a GPU.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
out="${1:?usage: bash bench/gpu_wan_base.sh OUT_DIR [MINUTES]}"
minutes="${2:-7}"
py="${PYTHON:-python3}"
device="${DEVICE:-cuda}"
mkdir -p "$out" || exit 1
source bench/gpu_site.sh
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=4
work="$(mktemp -d)"

pids=()
# name, seed, batch size, learning rate, composite fraction
for variant in "more 3 4 5e-4 0.2" "batch 4 16 5e-4 0.2" "combo 5 16 3e-4 0.3"; do
    read -r name seed batch lr fraction <<<"$variant"
    "$py" -m wc_fast.pretrain --base wan --out "$work/wan_$name" \
        --pretrain.init wc_fast/assets/wan_base_model.safetensors --pretrain.steps 1000000 \
        --pretrain.max_minutes "$minutes" --pretrain.seed "$seed" \
        --pretrain.batch_size "$batch" --pretrain.lr "$lr" \
        --pretrain.composite_fraction "$fraction" --pretrain.ckpt_every 1000000 \
        --pretrain.device "$device" >"$work/wan_$name.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
for log in "$work"/*.log; do
    echo "== $(basename "$log")"
    tr '\r' '\n' <"$log" | grep -a -e "held-out loss" -e "stopping" -e "exported" -e "Error" | tail -n 4
done | tee "$out/wan_base.log"
for dir in "$work"/wan_*/; do
    name=$(basename "$dir")
    (cd "$work" && tar czf "$out/$name.tgz" "$name"/base_model.safetensors \
        "$name"/base_model.json "$name"/loss.jsonl)
done
echo "gpu_wan_base: status $status in ${SECONDS}s"; du -h "$out"/*.tgz
exit "$status"
