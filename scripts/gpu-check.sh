#!/usr/bin/env bash
# One call on a lent GPU machine (issue 39): the gpu-marked tests, calibration in four precisions, `gpualloc run`
# of three models against prediction (on the torch-native engine: torchrun, NCCL), `gpualloc launch` with its
# run record read back by `gpualloc place --calibration`, and NVML telemetry beside nvidia-smi. Every result
# lands as a file under one archive, $OUT/gpu-check.tgz (JSON and each step's log); scripts/gpu_report.py turns
# it into the docs' tables.
#
#   bash scripts/gpu-check.sh            # on the GPU machine: torch there, our deps from .whl/ (see below)
#   GPU_CHECK_REHEARSE=1 OUT=/tmp/x bash scripts/gpu-check.sh   # here, on the CPU: same steps, tiny models
#   GPU_CHECK_ONLY="calibrate tests bf16" bash scripts/gpu-check.sh   # some parts only (a second call's budget):
#   GPU_CHECK_CALIBRATION=src/gpualloc/cost/data/calibration-H200.json   # plan and predict with it (no calibrate)
#       calibrate, tests, fp32 (step 3), telemetry, launch, bf16 (step 6), optimizer (step 7)
#
# The GPU machine has its own torch (2.11 + CUDA): the pinned 2.13 CPU wheel is not carried. Our package runs
# from src/ on top of it; what that machine lacks travels as wheels in .whl/ (bash scripts/gpu-wheels.sh).
# Each step has its own time limit; a failed step is recorded and the next one runs.
set -u
OUT=${OUT:-/tmp/gpu-check-out}  # the device tool brings back at most 8 files: everything goes to one archive there
RES=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$RES"' EXIT  # everything it holds is in the archive (packed after every step)
mkdir -p "$OUT"
pack() { tar czf "$OUT/gpu-check.tgz.tmp" -C "$RES" . && mv "$OUT/gpu-check.tgz.tmp" "$OUT/gpu-check.tgz"; }
REHEARSE=${GPU_CHECK_REHEARSE:-0}
T0=$(date +%s)
export PYTHONUNBUFFERED=1 GPUALLOC_CACHE_DIR=/tmp/gpualloc-cache MPLBACKEND=Agg

if [ "$REHEARSE" = 1 ]; then
    PY=${PY:-.venv/bin/python}
    DEV=cpu; AS=cpu; MODELS="resnet-tiny:4 bert-tiny:4 gpt-tiny:2"; CAL_MODELS="resnet-tiny:4"; REPEATS=1
    OPT_MODELS=resnet-tiny,bert-tiny,gpt-tiny
    PRECS=fp32  # the catalog's CPU has no bf16 peak: no bf16 fit or plan there
    CLUSTER1=1xcpu
else
    PY=${PY:-python3}
    if [ -d .whl ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            > "$RES/wheels.log" 2>&1 || echo "wheel install failed (see wheels.log)"
        export PYTHONPATH=/tmp/site
    fi
    DEV=cuda:0
    MODELS="resnet50:64 bert-base:16 gpt2-small:8"; CAL_MODELS="resnet50:64,bert-base:16,gpt2-small:8"; REPEATS=5
    OPT_MODELS=resnet50,bert-base,gpt2-small
    PRECS=fp32,bf16
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [ "$REHEARSE" != 1 ]; then
    # the catalog type of the lent GPU (an H100 or an H200), by its name and memory, as calibrate guesses it
    AS=${GPU_CHECK_AS:-$("$PY" -c "from gpualloc.cost.microbench import catalog_type_for; \
print(catalog_type_for('cuda:0').name)" 2> "$RES/as.log" || echo H100-SXM)}
    CLUSTER1="1x$AS"
fi
GA=("$PY" -m gpualloc.cli.main)

ONLY=" ${GPU_CHECK_ONLY:-calibrate tests fp32 telemetry launch bf16 optimizer} "
want() { [[ "$ONLY" == *" $1 "* ]]; }
DEADLINE=${GPU_CHECK_DEADLINE:-400}  # seconds: a step that would start later is skipped (one call must end in time)

# step NAME LIMIT_S CMD...: run with a time limit (cut to what is left before DEADLINE); stdout to $RES/NAME.out,
# stderr to $RES/NAME.log, one line per step to $RES/steps.jsonl (rc 124: timed out; skipped: no time left)
step() {
    local name=$1 limit=$2; shift 2
    local left=$(( DEADLINE - ($(date +%s) - T0) ))
    if [ "$left" -lt 15 ]; then
        echo "{\"step\": \"$name\", \"skipped\": true}" >> "$RES/steps.jsonl"; echo "$name: skipped"; return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local s; s=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$RES/$name.out" 2> "$RES/$name.log"
    local rc=$?
    echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - s )), \"limit_s\": $limit}" \
        >> "$RES/steps.jsonl"
    echo "[$(( $(date +%s) - T0 )) s] $name: rc=$rc"
    pack  # after every step: a call cut short still brings back what was measured
    return "$rc"
}

# 0. the machine and the environment
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader 2>&1 || true
    "$PY" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())" 2>&1
} > "$RES/env.txt"
# the engine (every `gpualloc run` and `gpualloc launch` runs on it: the op-level queue runner is gone) and NVML
step import 60 "$PY" -c "import gpualloc.cli.main, gpualloc.cli.run, gpualloc.cli.launch, gpualloc.execute.engine.rank, \
gpualloc.execute.engine.record, gpualloc.execute.measure, gpualloc.telemetry.nvml; print('ok')" \
    || { cat "$RES/import.log"; exit 1; }  # nothing else can run: stop at once, so that a rerun has the time

# 1. calibration: matmul peaks in FP32, TF32, FP16 and BF16, copies, and per-op times of the three models in FP32
# and in the engine's BF16 recipe, each precision fitted apart
want calibrate && { step calibrate 180 "${GA[@]}" calibrate --device "$DEV" --as "$AS" --models "$CAL_MODELS" \
    --precisions "$PRECS" --repeats "$REPEATS" -o "$RES/calibration.json" --json \
|| step calibrate-small 90 "${GA[@]}" calibrate --device "$DEV" --as "$AS" --models "${CAL_MODELS%%,*}" \
    --precisions "$PRECS" --repeats "$REPEATS" -o "$RES/calibration.json" --json; }
CAL=()  # this call's calibration, else GPU_CHECK_CALIBRATION (e.g. the one a previous call shipped)
[ -n "${GPU_CHECK_CALIBRATION:-}" ] && [ ! -s "$RES/calibration.json" ] && cp "$GPU_CHECK_CALIBRATION" "$RES/calibration.json"
[ -s "$RES/calibration.json" ] && CAL=(--calibration "$RES/calibration.json")

# 2. the gpu-marked tests (the files by name: collecting whole folders would import the service's modules,
# whose packages the GPU machine may lack): calibration on cuda:0, an op-level plan split between cuda:0 and the
# CPU run by the engine (`gpualloc run`), the CUDA memory probe, NVML
want tests && step tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/execute/test_gpu.py tests/execute/test_memory.py \
    tests/telemetry/test_nvml.py --junitxml="$RES/tests.xml"

# 3. gpualloc run of each model on the GPU: a hybrid plan (DP=PP=TP=1 on one GPU), whose memory rule is the one
# every planner uses, run on the torch-native engine (torchrun, one NCCL rank on cuda:0); step time, compute and
# peak memory against predicted, and the checks against the unsplit model (output, loss, gradients, weights)
want fp32 && for mb in $MODELS; do
    m=${mb%%:*}; b=${mb##*:}
    step "place-$m" 60 "${GA[@]}" place "$m" --cluster "$CLUSTER1" --batch "$b" --method hybrid "${CAL[@]}" \
        -o "$RES/plan-$m.json" \
    && step "run-$m" 90 "${GA[@]}" run "$m" --plan "$RES/plan-$m.json" --steps 10 --warmup 3 --devices "$DEV" \
        "${CAL[@]}" --json
done

# 4. telemetry under load: gpu_sampling.py runs a matmul load, times NVML sampling and each NVML query, and reads
# nvidia-smi beside it; meanwhile `gpualloc monitor --once --json`, nvidia-smi and the exporter are read too
if [ "$REHEARSE" != 1 ] && want telemetry; then
    "$PY" scripts/gpu_sampling.py --seconds 6 > "$RES/sampling.json" 2> "$RES/sampling.log" &
    SAMPLER=$!
    sleep 5
    for i in 1 2; do
        nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw,clocks.sm,temperature.gpu \
            --format=csv,noheader,nounits >> "$RES/nvidia-smi.csv" 2>&1
        "${GA[@]}" monitor --backend nvml --once --json >> "$RES/monitor.jsonl" 2>> "$RES/monitor.log"
    done
    step exporter 30 "$PY" scripts/gpu_sampling.py --exporter
    wait "$SAMPLER"
    echo "{\"step\": \"sampling\", \"rc\": $?}" >> "$RES/steps.jsonl"
fi

# 5. the engine through `gpualloc launch` on CUDA, and the loop closed: the first model's plan from step 3
# launched under torchrun (one NCCL rank on the GPU: the engine runs one rank per device, so no second rank can
# share it), its run record written as a calibration (--calibration-out), then `gpualloc place --calibration`
# planning with what was measured. A check that launch, the run record and the calibration read back work on a
# GPU, not a timing (step 3 has the timings); GPU_CHECK_SKIP_LAUNCH=1 leaves it out
if [ "${GPU_CHECK_SKIP_LAUNCH:-0}" != 1 ] && want launch; then
    m=${MODELS%%:*}; b=${MODELS%% *}; b=${b##*:}
    if [ -s "$RES/plan-$m.json" ]; then
        step launch 90 "${GA[@]}" launch "$RES/plan-$m.json" --model "$m" --steps 5 --warmup 2 --out "$RES/launch" \
            "${CAL[@]}" --calibration-out "$RES/launch-calibration.json" --json \
        && step place-measured 60 "${GA[@]}" place "$m" --cluster "$CLUSTER1" --batch "$b" --method hybrid \
            --calibration "$RES/launch-calibration.json" -o "$RES/plan-measured.json" --json
    else
        echo "{\"step\": \"launch\", \"skipped\": true, \"why\": \"no plan-$m.json from step 3\"}" >> "$RES/steps.jsonl"
    fi
fi
# 6. mixed precision: each model in BF16 (the engine's recipe: bf16 weights and activations, norms in fp32, fp32
# master weights and Adam states), step time and peak memory against the BF16 rule and the BF16 calibration
if [ "$REHEARSE" != 1 ] && want bf16; then
    for mb in $MODELS; do
        m=${mb%%:*}; b=${mb##*:}
        step "place-$m-bf16" 60 "${GA[@]}" place "$m" --cluster "$CLUSTER1" --batch "$b" --method hybrid \
            --precision bf16 "${CAL[@]}" -o "$RES/plan-$m-bf16.json" \
        && step "run-$m-bf16" 90 "${GA[@]}" run "$m" --plan "$RES/plan-$m-bf16.json" --steps 10 --warmup 3 \
            --devices "$DEV" "${CAL[@]}" --json
    done
fi
# 7. the optimizer step alone (torch's Adam and SGD, FP32 and BF16 master weights): synthetic parameter sets give
# its cost per tensor and per byte, the three models' parameters are predicted by the cost model and by that fit
want optimizer && step optimizer 150 "$PY" benchmarks/optimizer_step.py --device "$DEV" --models "$OPT_MODELS" \
    --out "$RES/optimizer_step.json"
pack
echo "done in $(( $(date +%s) - T0 )) s; results in $OUT/gpu-check.tgz"
