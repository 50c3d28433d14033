#!/usr/bin/env bash
# Continue pretraining an embedded Wan world model on one GPU machine, variants in parallel,
# each for a wall-clock budget; python -m wc_fast.eval picks between them on the CPU afterwards
# (docs/base_model.md, "The embedded Wan world model").
#
#   bash bench/gpu_wan_base.sh OUT_DIR [MINUTES]      (MINUTES: each job's budget, 7)
#
# WAN_INIT: the weights to start from (default: the shipped wc_fast/assets/wan_base_model.
# safetensors). WAN_VARIANTS: one variant per ';'-separated entry, "name seed batch lr fraction
# clips" (fraction: of the clips with a two-key combination; clips: per sequence); the default
# compares what a GPU makes cheap against stage 3's settings (batch 4, lr 5e-4, 2 clips):
#   more:  stage 3's settings, only more steps
#   batch: 16 sequences a step
#   combo: 16 sequences, lr 3e-4, a two-key combination in 30% of the clips
# Clips are rendered on the CPU (4 threads per job), the networks train on the GPU. Writes
# OUT_DIR/wan_NAME.tgz (EMA weights, card, loss log) per variant and OUT_DIR/wan_base.log.
# Needs nothing from a registry but the wheels of bench/gpu_wheels.sh in .whl/ (diffusers).
# DEVICE=cpu and a MINUTES of 0.1 check the script without a GPU.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
out="${1:?usage: bash bench/gpu_wan_base.sh OUT_DIR [MINUTES]}"
minutes="${2:-7}"
py="${PYTHON:-python3}"
device="${DEVICE:-cuda}"
init="${WAN_INIT:-wc_fast/assets/wan_base_model.safetensors}"
variants="${WAN_VARIANTS:-more 3 4 5e-4 0.2 2;batch 4 16 5e-4 0.2 2;combo 5 16 3e-4 0.3 2}"
mkdir -p "$out" || exit 1
# a world model file travels with its card (model sizes), which pretraining reads
if [[ ! -f "$init" || ! -f "${init%.safetensors}.json" ]]; then
    echo "gpu_wan_base: WAN_INIT $init needs the file and its card ${init%.safetensors}.json" >&2
    exit 1
fi
source bench/gpu_site.sh
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=4
work="$(mktemp -d)"

pids=()
IFS=';' read -r -a variant_list <<<"$variants"
for variant in "${variant_list[@]}"; do
    read -r name seed batch lr fraction clips <<<"$variant"
    "$py" -m wc_fast.pretrain --base wan --out "$work/wan_$name" --pretrain.init "$init" \
        --pretrain.steps 1000000 --pretrain.max_minutes "$minutes" --pretrain.seed "$seed" \
        --pretrain.batch_size "$batch" --pretrain.num_clips "$clips" --pretrain.lr "$lr" \
        --pretrain.composite_fraction "$fraction" --pretrain.ckpt_every 1000000 \
        --pretrain.device "$device" >"$work/wan_$name.log" 2>&1 &
    pids+=($!)
done
status=0
wait_jobs "${pids[@]}" || status=1
log_summary "$work" "held-out loss\|stopping\|exported\|Error" | tee "$out/wan_base.log"
for dir in "$work"/wan_*/; do
    name=$(basename "$dir")
    (cd "$work" && tar czf "$out/$name.tgz" "$name"/base_model.safetensors \
        "$name"/base_model.json "$name"/loss.jsonl)
done
echo "gpu_wan_base: status $status in ${SECONDS}s"; du -h "$out"/*.tgz
exit "$status"
