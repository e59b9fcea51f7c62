#!/usr/bin/env bash
# Run some pytest modules N times in a row beside K CPU-burning processes, to find the tests that
# fail only on a busy machine (CI has 2 cores).
#
#   bash tests/soak.sh MODULE... [--runs N] [--load K]
#
# MODULE: a test file or node id, as pytest takes it. N runs (default 10), each one
# `python -m pytest -q -p no:cacheprovider -n 0 -x -rfE MODULE...` (in one process: the load is the K
# loops, not the suite's own parallel workers), beside K busy loops (default 2),
# started before the first run and always killed at the end (also on Ctrl-C or an error).
# Prints each run's result, then `soak: P passed, F failed of N runs (load K)` and, for each
# failing run, its first failed test id and its output (kept in a folder from mktemp -d).
# Exit code: 0 when every run passed, 1 when one failed, 2 for a usage error, 130/143 when stopped.
# The interpreter is $PYTHON, else `python` from PATH.
set -u

usage() {
    sed -n '4,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

runs=10
load=2
modules=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) [ $# -ge 2 ] || usage; runs=$2; shift 2 ;;
        --runs=*) runs=${1#--runs=}; shift ;;
        --load) [ $# -ge 2 ] || usage; load=$2; shift 2 ;;
        --load=*) load=${1#--load=}; shift ;;
        -h|--help) usage ;;
        -*) echo "soak: unknown option $1" >&2; usage ;;
        *) modules+=("$1"); shift ;;
    esac
done
[ ${#modules[@]} -gt 0 ] || { echo "soak: no test module given" >&2; usage; }
[[ "$runs" =~ ^[0-9]+$ ]] && [ "$runs" -ge 1 ] || { echo "soak: --runs takes a whole number >= 1, not '$runs'" >&2; exit 2; }
[[ "$load" =~ ^[0-9]+$ ]] || { echo "soak: --load takes a whole number >= 0, not '$load'" >&2; exit 2; }

python=${PYTHON:-python}
burners=()
run_pid=
out_dir=$(mktemp -d "${TMPDIR:-/tmp}/soak.XXXXXX") || exit 2

stop_all() {
    if [ -n "$run_pid" ]; then
        kill -TERM "$run_pid" 2>/dev/null
        wait "$run_pid" 2>/dev/null
        run_pid=
    fi
    if [ ${#burners[@]} -gt 0 ]; then
        kill -TERM "${burners[@]}" 2>/dev/null
        wait "${burners[@]}" 2>/dev/null
        burners=()
    fi
}
trap stop_all EXIT
trap 'stop_all; echo "soak: stopped (failing runs so far in $out_dir)" >&2; exit 130' INT
trap 'stop_all; echo "soak: stopped (failing runs so far in $out_dir)" >&2; exit 143' TERM HUP

for ((i = 0; i < load; i++)); do
    ( trap - INT TERM; while :; do :; done ) &
    burners+=($!)
done

echo "soak: ${modules[*]}: $runs runs beside $load busy processes; failing runs' output in $out_dir"
passed=0
failed=0
failures=()
for ((run = 1; run <= runs; run++)); do
    log="$out_dir/run-$run.log"
    # in the background, so that a signal to this script is handled at once (traps wait for a
    # foreground command); it ignores SIGINT then: stop_all ends it with SIGTERM
    "$python" -m pytest -q -p no:cacheprovider -n 0 -x -rfE "${modules[@]}" >"$log" 2>&1 &
    run_pid=$!
    wait "$run_pid"
    code=$?
    run_pid=
    last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
    if [ "$code" -eq 0 ]; then
        passed=$((passed + 1))
        rm -f "$log"
        echo "run $run/$runs: passed ($last)"
    else
        failed=$((failed + 1))
        first=$(grep -m 1 -E '^(FAILED|ERROR) ' "$log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*$//')
        [ -n "$first" ] || first="(no failed test id: pytest exit code $code)"
        failures+=("run $run: $first (output: $log)")
        echo "run $run/$runs: FAILED, exit code $code: $first ($last)"
    fi
done

stop_all
echo "soak: $passed passed, $failed failed of $runs runs (load $load)"
if [ "$failed" -gt 0 ]; then
    echo "failing runs (output in $out_dir):"
    printf '  %s\n' "${failures[@]}"
    exit 1
fi
rmdir "$out_dir" 2>/dev/null
exit 0
