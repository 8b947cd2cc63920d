#!/usr/bin/env bash
# A small KernelBench-format corpus where one candidate's gates outweigh the others' together: upstream
# KernelBench's level 3 DenseNet121 (batch 4, 32 x 32 images: 121 weighted layers, light inputs) beside eight
# problems of the red-team corpus, each problem's own Model as its candidate (ModelNew = Model: every gate
# passes). For bench/audit_throughput.py --unsplit on a machine without a GPU: what judging the long
# candidate's gates in parts gains.
#
#   bash bench/split_corpus.sh KERNELBENCH_CHECKOUT OUT_DIR
#   python bench/audit_throughput.py --problems OUT_DIR/problems --candidates OUT_DIR/candidates \
#       --device cpu --jobs 2 --gates-only --unsplit --out DIR --json audit-throughput.json
set -eu
[ $# -eq 2 ] || { echo "usage: bash bench/split_corpus.sh KERNELBENCH_CHECKOUT OUT_DIR" >&2; exit 2; }
dense="$1/KernelBench/level3/15_DenseNet121.py"
[ -f "$dense" ] || { echo "no $dense: give a checkout of github.com/ScalingIntelligence/KernelBench" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$2/problems" "$2/candidates"
sed -e 's/^batch_size = 10$/batch_size = 4/' -e 's/^height, width = 224, 224.*/height, width = 32, 32/' \
  "$dense" >"$2/problems/15_DenseNet121.py"
for p in softmax layernorm matmul mean cumsum rms_norm logsumexp variance; do
  cp "$here/tests/data/redteam/problems/$p.py" "$2/problems/"
done
for f in "$2"/problems/*.py; do
  { cat "$f"; printf '\nModelNew = Model\n'; } >"$2/candidates/$(basename "$f" .py)__self.py"
done
echo "$(ls "$2/candidates" | wc -l) candidates in $2"
