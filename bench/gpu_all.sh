#!/usr/bin/env bash
# The whole device check in one command, for a GPU lent for minutes: gpu_e2e, then
# gpu_fp8_linear, then gpu_rollout, each within its share of BUDGET_S, then one summary
# table against the goals of docs/benchmarks.md.
#
#   bench/gpu_all.sh [--smoke] OUT_DIR [BUDGET_S]        BUDGET_S: default 420 seconds
#
# Runs the scripts with ${PYTHON:-python3} from this checkout (no install). OUT_DIR gets at
# most 8 files, rewritten after every part so that a run cut short keeps what it measured:
# <part>.json and <part>.log for the three parts, summary.md and summary.json.
# A part gets weight/(weights left) of the seconds left when it starts (5 : 2 : 3), stops
# starting new work at 4/5 of its share (--budget-s), and is killed at its share.
# Exit status 0 when every part exited 0; 2 on bad usage.
set -u

usage() {
    echo "usage: bench/gpu_all.sh [--smoke] OUT_DIR [BUDGET_S]" >&2
    exit 2
}
smoke=()
if [ "${1:-}" = "--smoke" ]; then
    smoke=(--smoke)
    shift
fi
[ $# -ge 1 ] && [ $# -le 2 ] || usage
out=$1
budget=${2:-420}
case $budget in
    '' | *[!0-9]*)
        echo "gpu_all.sh: error: BUDGET_S must be a whole number of seconds, got '$budget'" >&2
        exit 2
        ;;
esac
py=${PYTHON:-python3}
command -v "$py" > /dev/null 2>&1 || { echo "gpu_all.sh: error: no python '$py' (set PYTHON)" >&2; exit 2; }
command -v timeout > /dev/null 2>&1 || { echo "gpu_all.sh: error: no 'timeout' command (coreutils)" >&2; exit 2; }
mkdir -p "$out" || { echo "gpu_all.sh: error: cannot create OUT_DIR '$out'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)

names=(gpu_e2e gpu_fp8_linear gpu_rollout)
weights=(5 2 3)
grace=10      # seconds between SIGTERM and SIGKILL, inside the share
start=$SECONDS
parts=()
status=0
echo "gpu_all.sh: ${smoke[*]:-device run}, budget $budget s, $("$py" -c 'import sys; print("python", sys.version.split()[0])')"
for i in 0 1 2; do
    name=${names[$i]}
    rest=0
    for w in "${weights[@]:$i}"; do rest=$((rest + w)); done
    left=$((budget - (SECONDS - start)))
    share=$((left * weights[i] / rest))
    t0=$SECONDS
    if [ "$share" -lt $((2 * grace)) ]; then
        echo "not started: $left s of the $budget s budget were left" > "$out/$name.log"
        code=125
    else
        timeout --kill-after="$grace" "$((share - grace))" "$py" "$here/$name.py" ${smoke[@]+"${smoke[@]}"} \
            --out "$out/$name.json" --budget-s "$((share * 4 / 5))" > "$out/$name.log" 2>&1
        code=$?
    fi
    took=$((SECONDS - t0))
    parts+=(--part "$name:$code:$took:$share")
    echo "[$name] exit $code after $took s (share $share s); log: $out/$name.log"
    if [ "$code" -ne 0 ]; then
        status=1
        tail -n 5 "$out/$name.log" | sed 's/^/    /'
    fi
    "$py" "$here/gpu_summary.py" "$out" --quiet "${parts[@]}" || status=1
done
echo
"$py" "$here/gpu_summary.py" "$out" "${parts[@]}" || status=1
echo "total $((SECONDS - start)) s of a $budget s budget; files in $out"
exit $status
