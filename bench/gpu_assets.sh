#!/usr/bin/env bash
# Regenerate the embedded world's learned weights on one GPU machine, in parallel:
# both camera estimators, two base-model pretraining runs (composite_fraction 0.1 and 0.0,
# the candidates for the shipped base model; python -m wc_fast.eval picks between them) and
# the embedded Wan world model's three pretraining stages, one after another, each for the
# steps its CPU stage ran (docs/base_model.md; the GPU runs them in minutes).
#
#   bench/gpu_assets.sh OUT_DIR [MINUTES]      (MINUTES: wall-clock budget of each job, 4)
#
# Clips are rendered on the CPU (4 threads per job), the networks train on the GPU. Writes
# OUT_DIR/estimators.tgz (both estimators and every job's log), OUT_DIR/base_0.1.tgz and
# OUT_DIR/base_0.0.tgz (weights, card, loss log), OUT_DIR/wan_base.tgz (the last Wan stage's
# weights, every stage's card and loss log) and OUT_DIR/assets.log. Needs nothing from a
# registry but the wheels of bench/gpu_wheels.sh in .whl/ (diffusers): runs from the source tree
# with the machine's python3 and torch (bench/gpu_site.sh).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
out="${1:?usage: bench/gpu_assets.sh OUT_DIR [MINUTES]}"
minutes="${2:-4}"
py="${PYTHON:-python3}"
device="${DEVICE:-cuda}"  # DEVICE=cpu for a dry run without a GPU
# steps of the three Wan stages (WAN_STEPS="2 2 2" for a dry run)
read -r -a wan_steps <<<"${WAN_STEPS:-4471 4928 4999}"
work="$(mktemp -d)"
mkdir -p "$out" "$work/assets"
# the wheels the GPU image lacks (diffusers, for the Wan stages) and the source tree
source bench/gpu_site.sh
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4

pids=()
for which in reward eval; do
    "$py" -m wc_fast.tools.train_reward_models --which "$which" --device "$device" --threads 4 \
        --max-minutes "$minutes" --out "$work/assets" >"$work/estimator_$which.log" 2>&1 &
    pids+=($!)
done
for fraction in 0.1 0.0; do
    "$py" -m wc_fast.pretrain --preset cpu --out "$work/pretrain_$fraction" \
        --pretrain.composite_fraction "$fraction" --pretrain.max_minutes "$minutes" \
        --pretrain.ckpt_every 100000 --pretrain.device "$device" >"$work/pretrain_$fraction.log" 2>&1 &
    pids+=($!)
done
wan_stages() {
    # stage: steps, seed, learning rate, composite fraction (the CPU stages' settings)
    local init="" prev="" stage steps seed lr fraction
    for stage in "1 ${wan_steps[0]} 0 1e-3 0.0" "2 ${wan_steps[1]} 1 5e-4 0.0" \
                 "3 ${wan_steps[2]} 2 5e-4 0.2"; do
        read -r stage steps seed lr fraction <<<"$stage"
        [ -n "$prev" ] && init="--pretrain.init $prev/base_model.safetensors"
        # shellcheck disable=SC2086
        "$py" -m wc_fast.pretrain --base wan --out "$work/wan_s$stage" $init \
            --pretrain.steps "$steps" --pretrain.max_minutes 0 --pretrain.seed "$seed" \
            --pretrain.lr "$lr" --pretrain.composite_fraction "$fraction" \
            --pretrain.ckpt_every 100000 --pretrain.device "$device" || return 1
        prev="$work/wan_s$stage"
    done
}
wan_stages >"$work/pretrain_wan.log" 2>&1 &
pids+=($!)
status=0
wait_jobs "${pids[@]}" || status=1

log_summary "$work" | tee "$out/assets.log"
# one archive per base model: each stays under the 16 MiB a returned file may have
(cd "$work" && tar czf "$out/estimators.tgz" assets ./*.log)
for fraction in 0.1 0.0; do
    (cd "$work" && tar czf "$out/base_$fraction.tgz" "pretrain_$fraction"/base_model.* \
        "pretrain_$fraction"/loss.jsonl)
done
# the last stage's weights (the shipped model), every stage's card and loss log
(cd "$work" && tar czf "$out/wan_base.tgz" wan_s3/base_model.safetensors wan_s*/base_model.json \
    wan_s*/loss.jsonl)
echo "gpu_assets: status $status in ${SECONDS}s"; du -h "$out"/*.tgz
exit "$status"
