#!/usr/bin/env bash
# The GPU path in one call of at most five minutes on one GPU, from the repository root:
#
#   bash bench/gpu_check.sh [OUT]              on a CUDA machine (OUT defaults to $OUT, else bench/out/gpu_check)
#   bash bench/gpu_check.sh --dry-run [OUT]    every step's code path on tiny inputs on this CPU (~2 minutes)
#
# Steps, in the order of what a GPU is lent for, each with its own time limit on the GPU (seconds; the dry run's
# are larger, `limit` below); the limits and Python's start-ups fit in TOTAL_S (300) seconds, and a step that would
# overrun it is skipped:
#   env 10                the card, its bf16 peak, torch, CUDA, the packages (and that Biopython / Snakemake are absent)
#   inputs 30             only if bench/out/gpu_inputs is missing: `python bench/gpu_check.py prepare` makes it
#   gpu_tests 30          pytest -m gpu (tests/test_attention.py, test_dropout_attention.py, test_syncs.py,
#                         test_eval_precision.py); on a GPU a skip fails
#   throughput 120        bench_gpu_throughput.py: the recipe's step (262,144 tokens) of MLM-base and PMLM-base at
#                         micro-batches of 16,384 / 65,536 / 131,072 tokens, packed and padded, and HF EsmForMaskedLM
#                         of the same dims and dropouts; PMLM-xl at the trainer's micro-batch; per configuration step
#                         ms, non-pad tokens/s, MFU, peak memory beside `pmlm plan`'s estimate, allocator retries,
#                         synchronisations (counted ops and CUDA's own count)
#   compile 70            the same bench, PMLM-base packed at 131,072 tokens compiled whole: a cold Inductor build, then
#                         a second process on the first one's cache (the warm start a requeued job gets)
#   pretrain_resume 30    `python -m pmlm pretrain` of PMLM-base (bf16) on the carried shards, SIGTERM after step 5:
#                         exit 99 and a checkpoint, then the same command resumes from it and finishes step 20
#   fsdp 20               PMLM-large under torchrun --nproc_per_node 1 with fsdp: true for 4 steps
#   finetune 20           the ResNet contact head fine-tuned on pretrain_resume's encoder for 10 steps, then evaluated
#   coupling_curve <=120  if time is left: scripts/coupling_curves.py on the carried Potts family, read-outs as they come
#
# Each result is written as soon as it is known: OUT/summary.tsv (step, status, exit code, seconds, limit),
# OUT/results.jsonl (one JSON object per step), OUT/figures.md (the figures table of bench/README.md), OUT/check.log
# (every step's output), OUT/coupling_curve.jsonl, OUT/throughput.json (the throughput step's rows, for
# `pmlm throughput`). Scratch (run folders, checkpoints: ~5 GB) goes to WORK (default:
# a temporary folder). Exit status 0 only if every step passed (the curve is optional).
# Inputs: `python bench/gpu_check.py prepare bench/out/gpu_inputs` (CPU, ~1 minute; bench/README.md lists them);
# the device tool carries that folder. The GPU image has torch, transformers, pyarrow, safetensors, pyyaml and
# pytest, and no Snakemake or Biopython: the dry run blocks those imports (and jsonschema, isal) to prove it.
set -uo pipefail

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
# the rehearsal's limits are generous: a shared 2-core machine runs it several times slower than an idle one
[ "$DRY" = 1 ] && TOTAL_S=${TOTAL_S:-900}
OUT=${1:-${OUT:-bench/out/gpu_check}}
INPUTS=${INPUTS:-bench/out/gpu_inputs}
TOTAL_S=${TOTAL_S:-300}
if [ -z "${PYTHON:-}" ]; then
    if [ "$DRY" = 1 ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PY=$PYTHON
[ -f bench/gpu_check.sh ] || { echo "gpu_check: run from the repository root" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: > "$OUT/check.log"; : > "$OUT/results.jsonl"; : > "$OUT/coupling_curve.jsonl"
printf 'step\tstatus\texit_code\tseconds\tlimit_s\n' > "$OUT/summary.tsv"
if [ -n "${WORK:-}" ]; then mkdir -p "$WORK"; else WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
WORK=$(cd "$WORK" && pwd)
START=$SECONDS
FAILED=0
export PYTHONUNBUFFERED=1
# pmlm is not installed on the GPU image: every Python process (bench scripts too, whose own folder is their path)
# imports it from this checkout
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$DRY" = 1 ]; then
    # the GPU image lacks the data stage's packages, and pmlm is not installed there (bench/gpu_image)
    export PYTHONPATH="$PWD/bench/gpu_image:$PYTHONPATH"
    export CUDA_VISIBLE_DEVICES=""  # the rehearsal runs the CPU path even where a GPU is present
    INPUTS=$WORK/inputs
fi

# limit NAME: the step's time limit in seconds, GPU or dry run
limit() {
    case $1 in
        env) echo "10 60" ;; inputs) echo "30 120" ;; gpu_tests) echo "30 90" ;; throughput) echo "120 240" ;;
        compile) echo "70 300" ;; pretrain_resume) echo "30 120" ;; fsdp) echo "20 90" ;; finetune) echo "20 120" ;;
        coupling_curve) echo "120 60" ;;
    esac | awk -v dry="$DRY" '{print dry ? $2 : $1}'
}

# step NAME [optional] -- CMD...: run CMD (a command or a function of this script) in its own process group under
# its limit, never past TOTAL_S; log it; record its result (the last line of $WORK/NAME.json when CMD writes one).
# A step that no longer fits is skipped; one that runs past its limit gets SIGTERM (a trainer saves and stops),
# then SIGKILL 5 s later.
set -m
step() {
    local name=$1; shift
    local optional=0
    if [ "$1" = optional ]; then optional=1; shift; fi
    shift  # --
    local budget left code status pid
    budget=$(limit "$name")
    left=$((TOTAL_S - (SECONDS - START) - 3))
    [ "$left" -lt "$budget" ] && budget=$left
    echo "== $name (limit ${budget} s): $*" >> "$OUT/check.log"
    local began=$SECONDS
    if [ "$budget" -lt 5 ]; then
        code=-1; status=skipped
    else
        ( "$@" ) >> "$OUT/check.log" 2>&1 &
        pid=$!
        status=""
        while kill -0 "$pid" 2>/dev/null; do
            if [ $((SECONDS - began)) -ge "$budget" ]; then
                kill -TERM -- -"$pid" 2>/dev/null
                for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null && sleep 0.5; done
                kill -KILL -- -"$pid" 2>/dev/null
                status=timeout
                break
            fi
            sleep 0.2
        done
        wait "$pid"
        code=$?
        [ -n "$status" ] || { [ "$code" = 0 ] && status=ok || status=failed; }
    fi
    local seconds=$((SECONDS - began))
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$code" "$seconds" "$budget" >> "$OUT/summary.tsv"
    "$PY" bench/gpu_check.py record "$OUT" "$name" "$status" "$seconds" "$budget" "$WORK/$name.json" >> "$OUT/check.log" 2>&1
    echo "gpu_check: $name $status in ${seconds} s (limit ${budget} s)"
    if [ "$status" != ok ] && [ "$optional" = 0 ]; then FAILED=1; fi
    return 0
}

# into FILE CMD...: CMD's standard output to FILE (its errors to the log), for the steps whose result is JSON
into() { local file=$1; shift; "$@" > "$file"; }

# pretrain_sets STEPS: the --set options of a short run of the base recipe (tiny dims in the dry run)
pretrain_sets() {
    # a step of 16,384 tokens (the micro-batch of one GPU: data.tokens_per_batch auto), not the recipe's 262,144
    local sets=(optim.warmup_steps=2 "optim.total_steps=$1" tokens_per_step=16384 log_every=1 eval_every=0
                eval_batches=2 save_every=0 keep_last_checkpoints=1 tensorboard=false)
    if [ "$DRY" = 1 ]; then
        # test_train.py's compile test trains these dims: inductor's cache may hold their kernels already
        sets+=(model.preset=tiny model.overrides.num_layers=1 model.overrides.hidden=32 model.overrides.ffn=64
               model.overrides.heads=2 model.overrides.max_len=64 data.max_len=64 tokens_per_step=512
               data.num_workers=0)
    fi
    printf -- '--set\n%s\n' "${sets[@]}"
}

step env -- into "$WORK/env.json" "$PY" bench/gpu_check.py env
[ "$DRY" = 1 ] || nvidia-smi >> "$OUT/check.log" 2>&1
if [ ! -f "$INPUTS/shards/manifest.json" ]; then
    # the rehearsal's prepare stands for the one made beforehand on a CPU with the data stage's packages
    tiny=(); [ "$DRY" = 1 ] && tiny=(--tiny)
    GPU_CHECK_BLOCKED=snakemake step inputs -- into "$WORK/inputs.json" "$PY" bench/gpu_check.py prepare "${tiny[@]}" "$INPUTS"
fi
SHARDS=$INPUTS/shards TASKS=$INPUTS/tasks

gpu_flag=(); [ "$DRY" = 1 ] || gpu_flag=(--gpu)
run_gpu_tests() {
    "$PY" -m pytest -m gpu -p no:cacheprovider -q tests/test_attention.py tests/test_dropout_attention.py \
        tests/test_syncs.py tests/test_eval_precision.py \
        --junitxml "$WORK/gpu_tests.xml"
    "$PY" bench/gpu_check.py junit "$WORK/gpu_tests.xml" "${gpu_flag[@]}" > "$WORK/gpu_tests.json"
}
step gpu_tests -- run_gpu_tests

throughput_args() {  # the bench's configurations: the check's on a GPU, the smoke run's code paths in the dry run
    if [ "$DRY" = 1 ]; then
        echo --smoke --peak-tflops 1
    else
        echo --dims base,xl
    fi
}
# shellcheck disable=SC2046
step throughput -- "$PY" bench/bench_gpu_throughput.py --shards "$SHARDS" $(throughput_args) --out "$WORK/throughput"
# back with the other files: `pmlm throughput OUT/throughput.json -o config/throughput.yaml` fills pmlm plan's rates
[ -f "$WORK/throughput.json" ] && cp "$WORK/throughput.json" "$OUT/throughput.json"

run_compile() {  # a cold Inductor build, then a warm start on its cache, each in a fresh process
    local cache="$WORK/inductor-cache" args=(--compile-only --no-hf --objectives pmlm --layouts packed)
    if [ "$DRY" = 1 ]; then args+=(--smoke --micro-batches 1024 --steps 1); else args+=(--dims base --micro-batches 131072); fi
    rm -rf "$cache"
    TORCHINDUCTOR_CACHE_DIR=$cache "$PY" bench/bench_gpu_throughput.py "${args[@]}" --out "$WORK/compile_cold" || return
    TORCHINDUCTOR_CACHE_DIR=$cache "$PY" bench/bench_gpu_throughput.py "${args[@]}" --out "$WORK/compile_warm" || return
    "$PY" bench/gpu_check.py compile "$WORK/compile_cold.json" "$WORK/compile_warm.json" > "$WORK/compile.json"
}
step compile -- run_compile

# 20 steps on the GPU; tiny CPU steps take milliseconds, so more of them there, or the run ends before the signal
total=20; [ "$DRY" = 1 ] && total=40
mapfile -t SETS < <(pretrain_sets "$total")
step pretrain_resume -- into "$WORK/pretrain_resume.json" "$PY" bench/gpu_check.py pretrain-resume \
    --config config/train/base.yaml --shards "$SHARDS" --out "$WORK/runs/pmlm-base" --stop-at 5 --total-steps "$total" \
    --set objective.name=pmlm "${SETS[@]}"

run_short() {  # NAME LAUNCHER... -- KEY=VALUE...: a short pretrain run and its summary
    local name=$1; shift
    local launcher=() sets=()
    while [ "$1" != -- ]; do launcher+=("$1"); shift; done; shift
    for kv in "$@"; do sets+=(--set "$kv"); done
    "${launcher[@]}" pretrain --config "${RECIPE}" --shards "$SHARDS" --out "$WORK/runs/$name" \
        --final "$WORK/runs/$name/model.safetensors" "${SETS[@]}" "${sets[@]}" > "$WORK/runs/$name.log" 2>&1
    local code=$?
    cat "$WORK/runs/$name.log"
    local expect=(); [ -n "$EXPECT" ] && expect=(--expect "$EXPECT")
    "$PY" bench/gpu_check.py run "$WORK/runs/$name" --log "$WORK/runs/$name.log" --steps "$STEPS" "${expect[@]}" \
        > "$WORK/$name.json" || return 1
    return "$code"
}
mkdir -p "$WORK/runs"
mapfile -t SETS < <(pretrain_sets 4)
RECIPE=config/train/large.yaml STEPS=4 EXPECT="FSDP over 1 rank" step fsdp -- run_short fsdp \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 -m pmlm -- objective.name=pmlm fsdp=true

run_finetune() {
    local recipe=config/finetune/contact_resnet.yaml steps=10 crop=()
    [ "$DRY" = 1 ] && recipe=config/finetune/contact_resnet_tiny.yaml steps=3 crop=(--set data.crop=62)
    "$PY" -m pmlm finetune --config "$recipe" --encoder "$WORK/runs/pmlm-base/model.safetensors" \
        --train "$TASKS/train.jsonl" --valid "$TASKS/valid.jsonl" --out "$WORK/runs/contact" \
        --final "$WORK/runs/contact/head.safetensors" --set optim.warmup_steps=2 --set "optim.total_steps=$steps" "${crop[@]}" \
        --set grad_accum=1 --set eval_every=0 --set save_every=0 --set log_every=1 || return
    "$PY" -m pmlm evaluate --head "$WORK/runs/contact/head.safetensors" --test "check=$TASKS/test.jsonl" \
        --out "$WORK/contact_eval.tsv" || return
    "$PY" bench/gpu_check.py tsv "$WORK/contact_eval.tsv" > "$WORK/finetune.json"
}
step finetune -- run_finetune

run_curve() {
    cp -r "$INPUTS/coevolution" "$WORK/coevolution"
    # its read-out reads FASTA with Biopython: from the carried wheel on the image (the rehearsal lets it through)
    if [ "$DRY" = 1 ]; then
        export GPU_CHECK_BLOCKED=snakemake,jsonschema,isal
    elif ! "$PY" -c "import Bio" 2>/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$INPUTS"/wheels/*.whl || return
        export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    local steps=(--steps 20000 --eval-every 1000 --recipe config/train/coevolution_small.yaml)
    [ "$DRY" = 1 ] && steps=(--steps 4 --eval-every 2 --length 20 --sequences 300 --eval-sequences 2
                             --set optim.warmup_steps=1)
    # read-outs are appended to the file as they come; the limit ends the run where it is
    "$PY" scripts/coupling_curves.py --work "$WORK/coevolution" --out "$OUT/coupling_curve.jsonl" "${steps[@]}"
    tail -n 1 "$OUT/coupling_curve.jsonl" > "$WORK/coupling_curve.json"
    [ -s "$WORK/coupling_curve.json" ]
}
step coupling_curve optional -- run_curve

echo "gpu_check: $(($(wc -l < "$OUT/summary.tsv") - 1)) steps in $((SECONDS - START)) s; $OUT/summary.tsv, figures.md"
exit "$FAILED"
