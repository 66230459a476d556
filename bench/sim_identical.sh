#!/usr/bin/env bash
# Is `egpu simulate` unchanged against another commit? Replays the built-in cluster and
# workload with this tree and with COMMIT's (a temporary worktree, run with this tree's .venv)
# for each seed and node policy, and compares byte for byte:
#   - the placements CSV (task, node, cards: every decision of the replay);
#   - stdout and the --json summary, with the replay's wall time masked (the one field that
#     differs between any two runs, even of one commit). In stdout the time sits in the table's
#     title, which the table wraps to its width, so a time with one more digit moves the line
#     break: stdout is compared with runs of spaces and line breaks read as one space.
# A refactoring of the engine must leave all three identical.
#
# Usage: bench/sim_identical.sh COMMIT [SEED...]      (seeds default: 42 43 44)
#   POLICIES="fgdx-auto binpack spread fgd random" overrides the node policies replayed.
set -euo pipefail

commit=${1:?usage: bench/sim_identical.sh COMMIT [SEED...]}
shift
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(42 43 44)
read -r -a policies <<< "${POLICIES:-fgdx-auto binpack spread fgd random}"

here=$(cd "$(dirname "$0")/.." && pwd)
python="$here/.venv/bin/python"
out=$(mktemp -d)
base="$out/base-tree"
git -C "$here" worktree add --detach --quiet "$base" "$commit"
trap 'git -C "$here" worktree remove --force "$base"; rm -rf "$out"' EXIT

mask_txt() {  # the wall time in the table title: "..., 3.678 s"
    tr -s ' \n' '  ' < "$1" | sed -E 's/(^|[ ,])[0-9]+\.[0-9]+ s /\1<wall> s /'
}

mask_json() {  # "wall_seconds": 3.678
    sed -E 's/"wall_seconds": [0-9.]+/"wall_seconds": <wall>/' "$1"
}

run() {  # tree-src tag seed policy
    PYTHONPATH="$1" "$python" -m elastic_gpu.cli.main simulate --seed "$3" --policy "$4" \
        --json "$out/$2.json" --placements "$out/$2.csv" > "$out/$2.txt"
    mask_txt "$out/$2.txt" > "$out/$2.txt.m"
    mask_json "$out/$2.json" > "$out/$2.json.m"
}

status=0
for seed in "${seeds[@]}"; do
    for policy in "${policies[@]}"; do
        run "$base/src" "old-$seed-$policy" "$seed" "$policy"
        run "$here/src" "new-$seed-$policy" "$seed" "$policy"
        for ext in csv txt.m json.m; do
            if cmp -s "$out/old-$seed-$policy.$ext" "$out/new-$seed-$policy.$ext"; then
                echo "identical  seed $seed  $policy  ${ext%.m}"
            else
                echo "DIFFERENT  seed $seed  $policy  ${ext%.m}"
                status=1
            fi
        done
    done
done
exit $status
