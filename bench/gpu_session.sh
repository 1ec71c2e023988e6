#!/usr/bin/env bash
# Every GPU path of pre-training, fine-tuning and evaluation once, the GPU tests and the GPU benchmarks,
# on one CUDA machine, from the repository root, writing logs and results under $OUT.
#
#   bash bench/gpu_session.sh STAGE...     STAGE: tests | pretrain | finetune | pair | throughput | all
#                                          (paths = pretrain finetune; finetune uses pretrain's PMLM-base)
#
# Needs: torch with CUDA, pyarrow, safetensors, pyyaml, numpy (transformers for the HF baseline); not
# snakemake or Biopython. Inputs made by the data stage on any machine and copied beside the code:
#   snakemake --cores 2 data results/demo/tasks/demo_pdb/test.jsonl
#   -> results/demo/data/demo/shards (1.6 MB) and results/demo/tasks/demo_pdb (4.5 MB)
# pytest, if the image lacks it: `pip download pytest -d bench/out/wheels` and copy that folder too
# (WHEELS=DIR elsewhere). Override the inputs with SHARDS=DIR and TASKS=DIR. Each stage is sized for
# under 10 minutes on one H100. Every step's exit code and wall time go to $OUT/summary.tsv, its output
# to $OUT/<stage>/<step>.log; a failing step does not stop the others; the script exits non-zero if
# any failed.
set -uo pipefail

OUT=${OUT:-bench/out/gpu_session}
SHARDS=${SHARDS:-results/demo/data/demo/shards}
TASKS=${TASKS:-results/demo/tasks/demo_pdb}
WHEELS=${WHEELS:-bench/out/wheels}
# run folders hold checkpoints (xl: ~8.5 GB each), so they live outside $OUT; their small files are copied there
RUNS=${RUNS:-bench/out/gpu_runs}
PY=${PYTHON:-python}
FAILED=0
mkdir -p "$OUT"
[ -f "$OUT/summary.tsv" ] || printf 'stage\tstep\texit_code\tseconds\n' > "$OUT/summary.tsv"

# step STAGE NAME CMD...: run CMD with its output in $OUT/STAGE/NAME.log, record exit code and seconds
step() {
    local stage=$1 name=$2; shift 2
    mkdir -p "$OUT/$stage"
    local start=$SECONDS
    echo "== $stage/$name: $*" | tee -a "$OUT/$stage/$name.log"
    "$@" >> "$OUT/$stage/$name.log" 2>&1
    local code=$?
    printf '%s\t%s\t%s\t%s\n' "$stage" "$name" "$code" "$((SECONDS - start))" | tee -a "$OUT/summary.tsv"
    [ "$code" -eq 0 ] || FAILED=1
    return "$code"
}

# pretrain_args NAME RECIPE KEY=VALUE...: arguments of a short `pmlm pretrain` run, as the pretrain rule calls it
pretrain_args() {
    local name=$1 recipe=$2; shift 2
    ARGS=(pretrain --config "$recipe" --shards "$SHARDS" --out "$RUNS/$name"
          --final "$RUNS/$name/model.safetensors")
    for kv in optim.warmup_steps=5 optim.total_steps=30 log_every=5 eval_every=0 eval_batches=5 save_every=15 \
              keep_last_checkpoints=1 tensorboard=false "$@"; do
        ARGS+=(--set "$kv")
    done
}

pretrain() {  # NAME RECIPE KEY=VALUE...
    pretrain_args "$@"
    step paths "$1" "$PY" -m pmlm "${ARGS[@]}"
}

# SIGTERM to a running GPU job after its 10th step: it must save a checkpoint and exit 99 (requeue)
stop_after_ten_steps() {
    "$PY" -m pmlm "${ARGS[@]}" &
    local pid=$! metrics="${ARGS[6]}/metrics.csv"
    until grep -q '^train,10,' "$metrics" 2>/dev/null || ! kill -0 "$pid" 2>/dev/null; do sleep 1; done
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    local code=$?
    echo "exit code $code (expected 99)"
    ls "${ARGS[6]}/checkpoints"
    [ "$code" -eq 99 ]
}

environment() {
    mkdir -p "$OUT/env"
    nvidia-smi > "$OUT/env/nvidia-smi.txt" 2>&1
    "$PY" - > "$OUT/env/versions.json" 2>&1 <<'EOF'
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
        "capability": torch.cuda.get_device_capability(0)}
try:
    from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    info["varlen_attn"] = True
except ImportError as exc:
    info["varlen_attn"] = f"absent: {exc}"
for name in ("transformers", "pyarrow", "safetensors", "yaml", "numpy", "tensorboard"):
    try:
        info[name] = getattr(__import__(name), "__version__", "present")
    except ImportError:
        info[name] = None
print(json.dumps(info, indent=1))
EOF
    cat "$OUT/env/versions.json"
}

stage_tests() {
    if ! "$PY" -c "import pytest" 2>/dev/null; then  # not in every GPU image: install it from carried wheels
        step tests install_pytest "$PY" -m pip install --no-index --find-links "$WHEELS" pytest
    fi
    # the `gpu` tests live in tests/test_attention.py; other modules import the data stage's Biopython
    step tests attention "$PY" -m pytest -v -p no:cacheprovider tests/test_attention.py
}

stage_pretrain() {
    # the three objectives at base dims, bf16 (auto on CUDA), the recipe's 4 x 16,384-token micro-batches
    pretrain mlm-base config/train/base.yaml objective.name=mlm
    pretrain pmlm-base config/train/base.yaml objective.name=pmlm
    pretrain pair-only-base config/train/base.yaml objective.name=pmlm_pair_only
    pretrain pmlm-base-padded config/train/base.yaml objective.name=pmlm attention=padded
    pretrain pmlm-base-fp32 config/train/base.yaml objective.name=pmlm bf16=false
    pretrain pmlm-base-compiled config/train/base.yaml objective.name=pmlm compile=true
    # stop a GPU run with SIGTERM (checkpoint, exit 99), then the same command resumes from that checkpoint
    pretrain_args pmlm-base-requeue config/train/base.yaml objective.name=pmlm optim.total_steps=40 log_every=1 save_every=0
    step paths pmlm-base-requeue stop_after_ten_steps
    step paths pmlm-base-requeue-resumed "$PY" -m pmlm "${ARGS[@]}"
    # FSDP (fully_shard per layer) with the xl preset on one GPU: torchrun gives it a process group of one
    pretrain_args xl-fsdp config/train/xl.yaml objective.name=pmlm_pair_only optim.warmup_steps=2 optim.total_steps=6 \
        grad_accum=1 log_every=1 eval_batches=2 save_every=3
    step paths xl-fsdp torchrun --standalone --nproc_per_node 1 -m pmlm "${ARGS[@]}"
    pretrain_args xl-fsdp config/train/xl.yaml objective.name=pmlm_pair_only optim.warmup_steps=2 optim.total_steps=9 \
        grad_accum=1 log_every=1 eval_batches=2 save_every=3
    step paths xl-fsdp-resumed torchrun --standalone --nproc_per_node 1 -m pmlm "${ARGS[@]}"
    collect
}

stage_finetune() {
    # fine-tuning (full, ResNet contact head on M+; per-residue secondary structure) and evaluation on the GPU
    local encoder="$RUNS/pmlm-base/model.safetensors"
    local ft=(--set optim.warmup_steps=5 --set optim.total_steps=40 --set log_every=5 --set eval_every=0 --set save_every=20)
    step paths finetune-contact "$PY" -m pmlm finetune --config config/finetune/contact_resnet.yaml --encoder "$encoder" \
        --train "$TASKS/train.jsonl" --valid "$TASKS/valid.jsonl" --out "$RUNS/ft-contact" \
        --final "$RUNS/ft-contact/head.safetensors" "${ft[@]}" --set grad_accum=1
    step paths finetune-ss3 "$PY" -m pmlm finetune --config config/finetune/ss3.yaml --encoder "$encoder" \
        --train "$TASKS/train.jsonl" --valid "$TASKS/valid.jsonl" --out "$RUNS/ft-ss3" \
        --final "$RUNS/ft-ss3/head.safetensors" "${ft[@]}"
    step paths evaluate-contact "$PY" -m pmlm evaluate --head "$RUNS/ft-contact/head.safetensors" \
        --test "demo_test=$TASKS/test.jsonl" --out "$RUNS/eval-contact.tsv"
    step paths evaluate-ss3 "$PY" -m pmlm evaluate --head "$RUNS/ft-ss3/head.safetensors" \
        --test "demo_test=$TASKS/test.jsonl" --out "$RUNS/eval-ss3.tsv"
    step paths evaluate-pair-kl "$PY" -m pmlm evaluate --head pair-kl --encoder "$encoder" \
        --test "demo_test=$TASKS/test.jsonl" --out "$RUNS/eval-pair-kl.tsv"
    collect
}

# the runs' small outputs (metrics, scores, sidecars, tables) and the notable log lines, into $OUT
collect() {
    mkdir -p "$OUT/runs" "$OUT/paths"
    local dest
    dest=$(cd "$OUT/runs" && pwd)
    (cd "$RUNS" && find . -maxdepth 2 \( -name '*.csv' -o -name '*.json' -o -name '*.tsv' \) -exec cp --parents -t "$dest" {} +)
    grep -H "resuming from\|FSDP over\|SIGTERM received" "$OUT"/paths/*.log > "$OUT/paths/notes.txt" 2>&1
}

stage_pair() {
    step pair pair_memory "$PY" bench/bench_pair_memory.py --out "$OUT/pair/pair_memory.json"
}

stage_throughput() {
    step throughput throughput "$PY" bench/bench_gpu_throughput.py --shards "$SHARDS" --out "$OUT/throughput/gpu_throughput"
    step throughput throughput_compiled "$PY" bench/bench_gpu_throughput.py --shards "$SHARDS" --dims base \
        --lengths 512 --layouts auto --compile --no-hf --out "$OUT/throughput/gpu_throughput_compiled"
}

[ $# -gt 0 ] || { echo "usage: bash bench/gpu_session.sh tests|pretrain|finetune|paths|pair|throughput|all ..." >&2; exit 2; }
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_session: no CUDA device visible to $PY" >&2
    exit 2
fi
for missing in "$SHARDS/manifest.json" "$TASKS/test.jsonl"; do
    [ -f "$missing" ] || { echo "gpu_session: $missing not found (see the header of this script)" >&2; exit 2; }
done
environment
for stage in "$@"; do
    case $stage in
        tests|pretrain|finetune|pair|throughput) "stage_$stage" ;;
        paths) stage_pretrain; stage_finetune ;;
        all) stage_tests; stage_pretrain; stage_finetune; stage_pair; stage_throughput ;;
        *) echo "gpu_session: unknown stage $stage" >&2; exit 2 ;;
    esac
done
echo "summary: $OUT/summary.tsv"
exit "$FAILED"
