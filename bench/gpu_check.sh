#!/usr/bin/env bash
# The GPU checks in one run, for a machine with an NVIDIA GPU (within 8 minutes on one H200):
# tests/gpu (detection, CUDA_VISIBLE_DEVICES, NCCL, Fleet with AMP, memory fraction, flight recorder,
# a PS trainer on CUDA), a short NCCL/Fleet timing against torchrun and Fleet's knobs (bench/fleet_knobs.py) on NCCL.
#
#     bash bench/gpu_check.sh            # report in $OUT, or ./gpu-report without it
#
# Writes machine.txt (GPU, driver, torch), tests.txt (pytest's output), timing.json, knobs.json (where a GPU
# was measured) and report.md (all of them together). Exits with pytest's code. Needs python3 with CUDA torch, click, psutil, pyyaml, pytest.
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu-report}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"
    "$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")' 2>&1
} > "$out/machine.txt"

# its report whatever PYTEST_ADDOPTS says, in one process (one GPU; pytest-xdist need not be there)
env -u PYTEST_ADDOPTS timeout 330 "$py" -m pytest -o addopts= -q -rs -p no:cacheprovider tests/gpu > "$out/tests.txt" 2>&1
tests=$?
timeout 150 "$py" bench/gpu_timing.py > "$out/timing.json" 2> "$out/timing.err"
timing=$?
# Fleet's knobs with NCCL, one worker per GPU, against DDP under torchrun (bench/fleet_knobs.py): 150 s at most,
# less when the steps above leave less of the 8 minutes; its runs stop starting 35 s before its limit. knobs.json
# only when it measured something (without a GPU it says so in one line, which goes to report.md).
knobs_s=$(( 470 - SECONDS ))
[ "$knobs_s" -gt 150 ] && knobs_s=150
knobs_dir=$(mktemp -d)
if [ "$knobs_s" -ge 60 ]; then
    timeout "$knobs_s" "$py" bench/fleet_knobs.py --device cuda --steps 200 --rounds 2 --models mlp,conv \
        --only ddp,model,optimizer,optimizer-nccl2 --budget $(( knobs_s - 35 )) --json "$knobs_dir/knobs.json" \
        > "$knobs_dir/table.txt" 2> "$knobs_dir/err.txt"
    knobs=$?
    [ -s "$knobs_dir/knobs.json" ] && cp "$knobs_dir/knobs.json" "$out/knobs.json"
else
    knobs="skipped"
    echo "not run: only ${knobs_s} s were left of the 8 minutes" > "$knobs_dir/err.txt"
fi

{
    echo "# GPU check"
    echo
    echo '```'
    cat "$out/machine.txt"
    echo '```'
    echo
    echo "## tests/gpu (exit $tests)"
    echo
    echo '```'
    grep -E '^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed|skipped|error' "$out/tests.txt" | tail -40
    echo '```'
    echo
    echo "## timing (exit $timing)"
    echo
    echo '```'
    cat "$out/timing.json"
    tail -5 "$out/timing.err"
    echo '```'
    echo
    echo "## Fleet knobs (exit $knobs)"
    echo
    echo '```'
    cat "$knobs_dir/table.txt" 2>/dev/null
    grep -E 'error|budget|fleet_knobs:|not run' "$knobs_dir/err.txt" | tail -8
    echo '```'
} > "$out/report.md"
rm -rf "$knobs_dir"
cat "$out/report.md"
exit $tests
