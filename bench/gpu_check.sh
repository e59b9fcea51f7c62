#!/usr/bin/env bash
# The GPU checks in one run, for a machine with an NVIDIA GPU (within 8 minutes on one H200):
# tests/gpu (detection, CUDA_VISIBLE_DEVICES, NCCL, Fleet with AMP, memory fraction, flight recorder,
# a PS trainer on CUDA) and a short NCCL/Fleet timing against torchrun.
#
#     bash bench/gpu_check.sh            # report in $OUT, or ./gpu-report without it
#
# Writes machine.txt (GPU, driver, torch), tests.txt (pytest's output), timing.json and report.md
# (all three together). Exits with pytest's code. Needs python3 with CUDA torch, click, psutil, pyyaml, pytest.
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
} > "$out/report.md"
cat "$out/report.md"
exit $tests
