#!/usr/bin/env bash
# The equal-compute co-evolution study at GPU length in one call of at most five minutes on one GPU, from the
# repository root (config/coevolution_curves_gpu_length.yaml; docs/coevolution.md "At GPU length"):
#
#   bash bench/gpu_science.sh [OUT]              on a CUDA machine (OUT defaults to $OUT, else bench/out/gpu_science)
#   bash bench/gpu_science.sh --dry-run [OUT]    the same code path on tiny inputs on this CPU (under a minute)
#
# Inputs, prepared beforehand on a CPU and carried (the families, their shards, the baselines' rows, the Biopython
# wheel; a few MiB): `python bench/gpu_science.py prepare bench/out/gpu_science_inputs`. The call then
#   env       the card, torch, CUDA (OUT/env.json)
#   curves    `pmlm coevolution curves` on the carried inputs: the three arms (MLM, the paper's pair head, the
#             product base) at once, one process each, to 20,000 steps, every read-out at each budget; an arm rewrites
#             its rows after each budget, so the time limit (TOTAL_S, default 300 s, less what the report needs) ends
#             the run where it is and keeps the budgets reached
#   report    `pmlm coevolution curves --collect`: OUT/curves.tsv and OUT/curves.md (tables; the figure is made on a
#             CPU from curves.tsv), OUT/figures.md and OUT/summary.json (budgets reached, training steps/s per arm,
#             the answer's first line)
# OUT/science.log holds every process's output. Exit status 0 only if every arm reached the last budget.
# The dry run blocks the packages the GPU image lacks (bench/gpu_image) but Biopython, which the GPU call installs
# from the carried wheel.
set -uo pipefail

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
[ "$DRY" = 1 ] && TOTAL_S=${TOTAL_S:-600}
OUT=${1:-${OUT:-bench/out/gpu_science}}
INPUTS=${INPUTS:-bench/out/gpu_science_inputs}
TOTAL_S=${TOTAL_S:-300}
REPORT_S=25  # the report's share of TOTAL_S: two Python start-ups and the rows
if [ -z "${PYTHON:-}" ]; then
    if [ "$DRY" = 1 ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PY=$PYTHON
[ -f bench/gpu_science.sh ] || { echo "gpu_science: run from the repository root" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/science.log
: > "$LOG"
if [ -n "${WORK:-}" ]; then mkdir -p "$WORK"; else WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
WORK=$(cd "$WORK" && pwd)
START=$SECONDS
export PYTHONUNBUFFERED=1
# pmlm is not installed on the GPU image: every process imports it from this checkout
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
say() { echo "gpu_science: $* ($((SECONDS - START)) s)" | tee -a "$LOG"; }

if [ "$DRY" = 1 ]; then
    export PYTHONPATH="$PWD/bench/gpu_image:$PYTHONPATH"
    export GPU_CHECK_BLOCKED=snakemake,jsonschema,isal  # Biopython: the GPU call installs the carried wheel
    export CUDA_VISIBLE_DEVICES=""  # the rehearsal runs the CPU path even where a GPU is present
    INPUTS=$WORK/inputs
    "$PY" bench/gpu_science.py prepare --tiny "$INPUTS" >> "$LOG" 2>&1 || { say "prepare failed"; exit 1; }
fi
if [ ! -f "$INPUTS/config.yaml" ]; then
    echo "gpu_science: no $INPUTS/config.yaml: run 'python bench/gpu_science.py prepare $INPUTS' on a CPU and carry it" >&2
    exit 2
fi

timeout 20 "$PY" bench/gpu_check.py env > "$OUT/env.json" 2>> "$LOG"
[ "$DRY" = 1 ] || nvidia-smi >> "$LOG" 2>&1
say "env: $(tr -d '\n' < "$OUT/env.json" | cut -c1-200)"
if ! "$PY" -c "import Bio" 2>/dev/null; then
    # the families' FASTA is read with Biopython, which the GPU image lacks: the carried wheel
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$INPUTS"/wheels/*.whl >> "$LOG" 2>&1 \
        || { say "no Biopython and no wheel to install"; exit 1; }
    export PYTHONPATH="$WORK/site:$PYTHONPATH"
fi

cp -r "$INPUTS/run" "$WORK/run"
CURVES=("$PY" -m pmlm coevolution curves --config "$INPUTS/config.yaml" --out "$WORK/run" --no-figure)
limit=$((TOTAL_S - (SECONDS - START) - REPORT_S))
say "curves: limit ${limit} s"
set -m  # the run and its workers in a process group of their own: the limit stops them all
"${CURVES[@]}" >> "$LOG" 2>&1 &
pid=$!
status=""
while kill -0 "$pid" 2>/dev/null; do
    if [ $((SECONDS - START)) -ge $((TOTAL_S - REPORT_S)) ]; then
        kill -TERM -- -"$pid" 2>/dev/null
        for _ in 1 2 3 4 5 6; do kill -0 "$pid" 2>/dev/null && sleep 0.5; done
        kill -KILL -- -"$pid" 2>/dev/null
        status=timeout
        break
    fi
    sleep 0.5
done
wait "$pid"
code=$?
set +m
[ -n "$status" ] || { [ "$code" = 0 ] && status=ok || status=failed; }
say "curves: $status (exit $code)"

# the report: every unit that ended and the budgets the others reached
"${CURVES[@]}" --collect >> "$LOG" 2>&1 || say "report: no rows"
for f in curves.tsv curves.md; do [ -f "$WORK/run/$f" ] && cp "$WORK/run/$f" "$OUT/"; done
"$PY" bench/gpu_science.py summary "$WORK/run" "$OUT" >> "$LOG" 2>&1
[ -f "$OUT/figures.md" ] && cat "$OUT/figures.md"
say "done: $OUT/curves.tsv, curves.md, figures.md"
[ "$status" = ok ]
