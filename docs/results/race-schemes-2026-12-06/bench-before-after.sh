#!/bin/bash
# issue 47 item 4: the non-forward share, before (09dfe89) vs after (working tree), alone, interleaved
cd "$(git rev-parse --show-toplevel)"
BEFORE=${BEFORE:?a worktree of the commit before, e.g. git worktree add /tmp/before 09dfe89}
PY=${PY:-$PWD/.venv/bin/python}
ARGS="--target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --draft-dtype int8 --batch 1,8 --tree chain:4 --compare-cuts --repeats 3 --tokens ${TOK:-24}"
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for side in $order; do
    echo "=== round $round $side $(date +%T)"
    if [ $side = before ]; then
      (cd $BEFORE && PYTHONPATH=$BEFORE/src:$BEFORE OMP_NUM_THREADS=2 $PY -m research.profile_batch $ARGS 2>&1 | grep -v Warning)
    else
      PYTHONPATH=. OMP_NUM_THREADS=2 $PY -m research.profile_batch $ARGS 2>&1 | grep -v Warning
    fi
  done
done
