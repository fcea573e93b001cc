#!/usr/bin/env bash
# The device check, run on a lent GPU machine from the bundle `make device-bundle` builds (no network there):
#
#   bash .devrun/run.sh                    # from the folder holding .devrun/; results into $OUT
#   DEVRUN_DEVICE=cpu bash .devrun/run.sh  # the same steps on a CPU (a Python 3.12 stand-in for the GPU image)
#
# Steps, in order, each under its own time limit within one budget (DEVRUN_BUDGET_S, default 470 s: the device
# tool's 600-s command limit leaves room); a failing step does not stop the later ones:
#   env       the machine: GPU, Python and library versions                      -> $OUT/machine.json
#   setup     pip install of whl/ into a site folder, then depcheck.py (gaps filled from whl-fallback/)
#   imports   every main module imports (DeepSpeed's accelerator named)
#   bench     python -m benchmarks.gpu_update_bench (0.5B, in-process, synthetic batch) -> $OUT/bench-inprocess.json
#   lora      bench with --lora-rank 8: LoRA adapters (PEFT), not every weight    -> $OUT/bench-lora.json
#   launched  bench with --launcher torchrun --nproc 1                            -> $OUT/bench-torchrun.json
#   sokoban   the in-process bench on multi-turn Sokoban rows (1-2k tokens)       -> $OUT/bench-sokoban.json
#   profile   the in-process bench, its second update traced by torch.profiler   -> $OUT/profile/profile.{json,md}
#   tests     pytest -m gpu tests/gpu                                             -> $OUT/gpu-tests.txt
#   train     ragen train --config configs/bandit.yaml trainer.iterations=5       -> $OUT/train.json
#   report    the figures as RESULTS.md's GPU section                             -> $OUT/RESULTS.md, RESULTS-gpu.md
# Always: $OUT/log.txt (everything) and $OUT/summary.txt (one line per step: rc, limit, seconds).
#
# On an H100 all of it takes ~10 minutes, more than one command of the device tool may, so it runs as two calls on
# the same warm machine (a machine's /tmp outlives a call; the second call reuses the first's site folder and its
# report carries the first call's figures: $DEVRUN_TMP/ragen-devrun-keep, per bundle):
#   DEVRUN_SKIP="tests train" bash .devrun/run.sh                         # the figures (~6 min)
#   DEVRUN_SKIP="imports bench lora launched sokoban profile" bash .devrun/run.sh   # the tests and the train (~5 min)
# Knobs (environment): DEVRUN_DEVICE (cuda | cpu), DEVRUN_BUDGET_S (470), DEVRUN_TIME_SCALE (1; multiplies every
# limit, e.g. 6 on a 2-core CPU), DEVRUN_PYTHON (python3), DEVRUN_TMP (/tmp), DEVRUN_SKIP (steps to skip, e.g.
# "launched train"), DEVRUN_BENCH_ARGS (--iterations 3; on cpu --shape tiny --iterations 2 --peak-tflops 1),
# DEVRUN_TRAIN_ITERS (5), DEVRUN_TRAIN_EXTRA (more overrides for the train step; on cpu a smaller validation).
set -u
set +o pipefail

START=$(date +%s)
DEVRUN="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROJ="$DEVRUN/proj"
OUT="${OUT:-/tmp/devrun-out}"
mkdir -p "$OUT"
LOG="$OUT/log.txt"
SUMMARY="$OUT/summary.txt"
: >"$LOG"
: >"$SUMMARY"
DEVICE="${DEVRUN_DEVICE:-cuda}"
PY="${DEVRUN_PYTHON:-python3}"
TMPD="${DEVRUN_TMP:-/tmp}/ragen-devrun"
# what outlives a call, for the next call with the same bundle: the installed site folder, every call's result files
# and step lines (another bundle starts afresh)
KEEP="${DEVRUN_TMP:-/tmp}/ragen-devrun-keep"
SITE="$KEEP/site"
BUNDLE_ID="$(head -n 2 "$DEVRUN/BUNDLE.txt" 2>/dev/null | tr '\n' ' ')"
if [[ -z "$BUNDLE_ID" || "$(cat "$KEEP/BUNDLE" 2>/dev/null)" != "$BUNDLE_ID" ]]; then  # no id: nothing to share
  rm -rf "$KEEP"
fi
mkdir -p "$KEEP/results" && echo "$BUNDLE_ID" >"$KEEP/BUNDLE"
BUDGET="${DEVRUN_BUDGET_S:-470}"
SCALE="${DEVRUN_TIME_SCALE:-1}"
DEADLINE=$((START + BUDGET * SCALE))
SKIP=" ${DEVRUN_SKIP:-} "
TRAIN_ITERS="${DEVRUN_TRAIN_ITERS:-5}"
if [[ "$DEVICE" == cpu ]]; then
  BENCH_ARGS="${DEVRUN_BENCH_ARGS:---shape tiny --iterations 2 --peak-tflops 1}"
  TRAIN_EXTRA="${DEVRUN_TRAIN_EXTRA:-eval.instances=64 env.val_envs=[bandit]}"
else
  BENCH_ARGS="${DEVRUN_BENCH_ARGS:---iterations 3}"
  TRAIN_EXTRA="${DEVRUN_TRAIN_EXTRA:-}"
fi

# -- the environment: nothing under the user's home, no network, no telemetry -------------------------------------
rm -rf "$TMPD" && mkdir -p "$TMPD/home/.cache"
export HOME="$TMPD/home" XDG_CACHE_HOME="$TMPD/home/.cache"
export PYTHONPATH="$SITE:$PROJ" PATH="$SITE/bin:$PATH"
export PYTHONUNBUFFERED=1 PYTHONNOUSERSITE=1 PIP_CONSTRAINT="" PIP_FIND_LINKS="" PIP_DISABLE_PIP_VERSION_CHECK=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=180
export RAGEN_BENCH_CACHE="$TMPD/bench-cache" RAGEN_CACHE_DIR="$TMPD/ragen-cache" TORCH_EXTENSIONS_DIR="$TMPD/ext"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" NCCL_DEBUG="${NCCL_DEBUG:-WARN}"  # one node, loopback only
export RAGEN_GPU_TESTS_DEVICE="$DEVICE" COLUMNS=150
if [[ "$DEVICE" == cuda ]]; then
  export DS_ACCELERATOR=cuda CUBLAS_WORKSPACE_CONFIG=":4096:8"
else
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
unset PREFECT_API_URL PREFECT_HOME RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT

now() { date +%s; }
say() { echo "$*" | tee -a "$LOG"; }
# limit WANT RESERVE: WANT seconds (scaled), or less, keeping RESERVE seconds (scaled) of the budget for later steps;
# never below 20 s. The reserves set the priorities when time is short (expected on an H100: setup and imports ~1
# minute, tests ~3, each bench 1-2, train ~40 s): tests, then the in-process bench, the LoRA one, the launched one,
# the train.
limit() {
  local want=$(($1 * SCALE)) left=$((DEADLINE - $(now) - $2 * SCALE))
  ((left < want)) && want=$left
  ((want < 20)) && want=20
  echo "$want"
}
# step NAME LIMIT COMMAND: run COMMAND in $PROJ under `timeout`, output into the log, one line into the summary
step() {
  local name=$1 lim=$2 cmd=$3 t0 rc
  local file  # a result in $OUT from before this call (a reused folder) must not pass for this call's
  for file in ${OUTPUTS[$name]:-}; do rm -rf "${OUT:?}/$file"; done
  if [[ "$SKIP" == *" $name "* ]]; then
    say "=== [$name] skipped (DEVRUN_SKIP)"
    echo "$name skipped" >>"$SUMMARY"
    return 0
  fi
  t0=$(now)
  say ""
  say "=== [$name] start +$((t0 - START))s, limit ${lim}s: $cmd"
  (cd "$PROJ" && timeout -k 15 "$lim" bash -c "$cmd") >>"$LOG" 2>&1
  rc=$?
  ((rc == 124 || rc == 137)) && say "=== [$name] TIMED OUT after ${lim}s"
  say "=== [$name] rc=$rc in $(($(now) - t0))s (total +$(($(now) - START))s)"
  printf '%-9s rc=%-3s limit=%4ss elapsed=%4ss\n' "$name" "$rc" "$lim" "$(($(now) - t0))" | tee -a "$SUMMARY" \
    | sed "s/^/$(date -u +%H:%M:%S) /" >>"$KEEP/summary.txt"
  keep "$name"
  return "$rc"
}
# keep NAME: step NAME's result files replace an earlier call's in $KEEP/results (a failed rerun leaves none there)
keep() {
  local file
  for file in ${OUTPUTS[$1]:-}; do
    rm -rf "${KEEP:?}/results/$file"
    if [[ -e "$OUT/$file" ]]; then cp -r "$OUT/$file" "$KEEP/results/"; fi
  done
}
declare -A OUTPUTS=([env]="machine.json" [bench]="bench-inprocess.json" [lora]="bench-lora.json"
  [launched]="bench-torchrun.json" [sokoban]="bench-sokoban.json" [profile]="profile"
  [tests]="gpu-tests.txt gpu-tests-summary.txt" [train]="train.json")
# the time the later steps that will run need at least (unscaled seconds; skipped steps need none)
declare -A LEAST=([lora]=60 [launched]=90 [sokoban]=60 [profile]=45 [tests]=150 [train]=45)
reserve() {
  local total=0 name
  for name in "$@"; do [[ "$SKIP" == *" $name "* ]] || total=$((total + LEAST[$name])); done
  echo "$total"
}

say "device check: $(date -u), device $DEVICE, bundle $DEVRUN ($(head -1 "$DEVRUN/BUNDLE.txt" 2>/dev/null)), python $PY,"
say "  budget ${BUDGET}s x $SCALE, OUT $OUT"

step env "$(limit 30 440)" "
  (command -v nvidia-smi >/dev/null && nvidia-smi) || echo 'no nvidia-smi'
  nproc; free -g | head -2; df -h /tmp | tail -1; $PY -VV
  PYTHONPATH= $PY - '$OUT/machine.json' <<'EOF'
import importlib.metadata as md, json, platform, sys, torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
info = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda, 'gpu': gpu,
        'gpus': torch.cuda.device_count(), 'transformers': md.version('transformers'), 'deepspeed': '0.19.8 (carried)',
        'peft': '0.21.2 (carried)'}
print(json.dumps(info))
json.dump(info, open(sys.argv[1], 'w'), indent=2)
for n in ('transformers', 'tokenizers', 'accelerate', 'numpy', 'pandas', 'pyarrow', 'safetensors', 'pyyaml', 'typer',
          'rich', 'pytest', 'psutil', 'matplotlib', 'tensorboard', 'python-dateutil', 'httpx', 'jinja2', 'pydantic'):
    try: print(f'  {n} {md.version(n)}')
    except md.PackageNotFoundError: print(f'  {n} -')
EOF
"

step setup "$(limit 120 400)" "
  if [[ -f '$KEEP/site.ok' ]]; then echo 'site folder of an earlier call with this bundle: $SITE'; exit 0; fi
  rm -rf '$SITE' && mkdir -p '$SITE'
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target '$SITE' '$DEVRUN'/whl/*.whl || exit 1
  echo \"installed \$(ls '$DEVRUN'/whl/*.whl | wc -l) wheels into $SITE\"
  $PY '$DEVRUN/depcheck.py' --site '$SITE' --project '$PROJ/pyproject.toml' --fallback '$DEVRUN/whl-fallback' --fix \
    && touch '$KEEP/site.ok'
"

step imports "$(limit 60 380)" "
  $PY - <<'EOF'
import importlib, time
started = time.time()
names = ['torch', 'transformers', 'deepspeed', 'peft', 'prefect', 'prefect.server.api.server', 'duckdb', 'pyarrow',
         'pandas', 'pydantic', 'pandera.pandas', 'gymnasium', 'fastapi', 'sqlalchemy', 'uvicorn', 'aiosqlite',
         'psutil', 'ragen_core.storage', 'ragen_core.config', 'ragen_core.policy', 'ragen_core.policy.lora',
         'ragen_core.training.actor', 'ragen_core.training.group', 'ragen_core.training.worker', 'schemas.contracts',
         'flows.train', 'ragen_cli.main', 'benchmarks.gpu_update_bench', 'benchmarks.synthetic_batch',
         'tests.gpu.conftest']
failed = []
for name in names:
    try:
        module = importlib.import_module(name)
        print(f'ok   {name:34} {getattr(module, \"__version__\", \"\")}')
    except Exception as exc:  # every failure, not the first
        failed.append(name)
        print(f'FAIL {name:34} {type(exc).__name__}: {exc}')
from deepspeed.accelerator import get_accelerator
print('DeepSpeed accelerator', get_accelerator().device_name(), get_accelerator().communication_backend_name())
print(f'imports {time.time() - started:.1f} s; failed: {failed or \"none\"}')
raise SystemExit(1 if failed else 0)
EOF
"

# the bench writes benchmarks/results/gpu.json and its section of RESULTS.md in the carried copy: the JSON is kept in
# $OUT, RESULTS.md put back (the report step writes the section of both runs)
cp "$PROJ/benchmarks/RESULTS.md" "$TMPD/RESULTS.orig.md"
bench() {  # bench NAME LIMIT OUTFILE EXTRA-ARGS
  rm -f "$PROJ/benchmarks/results/gpu.json"
  step "$1" "$2" "
    $PY -m benchmarks.gpu_update_bench $BENCH_ARGS $4 --root '$TMPD/$1' >'$TMPD/$1.out' 2>&1
    rc=\$?
    tail -n 40 '$TMPD/$1.out'  # (into the log; a timed-out step leaves its file, shown below)
    ((rc)) && find '$TMPD/$1' -name 'group-*.log' -exec tail -n 80 {} + 2>/dev/null
    exit \$rc
  "
  if grep -q "\[$1\] TIMED OUT" "$LOG"; then  # what it had done by then: its last lines and the group's log
    { echo "--- [$1] its last output:"; tail -n 40 "$TMPD/$1.out" 2>/dev/null
      find "$TMPD/$1" -name 'group-*.log' -exec tail -n 40 {} + 2>/dev/null; } >>"$LOG"
  fi
  [[ -n "$3" ]] && cp "$PROJ/benchmarks/results/gpu.json" "$OUT/$3" 2>/dev/null && keep "$1"
  cp "$TMPD/RESULTS.orig.md" "$PROJ/benchmarks/RESULTS.md"
  rm -rf "${TMPD:?}/$1"
}
# each step keeps the least time of the later steps that run (reserve); a step that cannot have it all is cut short
bench bench "$(limit 150 "$(reserve lora launched sokoban profile tests train)")" bench-inprocess.json ""
bench lora "$(limit 120 "$(reserve launched sokoban profile tests train)")" bench-lora.json "--lora-rank 8"
bench launched "$(limit 150 "$(reserve sokoban profile tests train)")" bench-torchrun.json "--launcher torchrun --nproc 1"
bench sokoban "$(limit 120 "$(reserve profile tests train)")" bench-sokoban.json "--case sokoban"
bench profile "$(limit 90 "$(reserve tests train)")" "" "--iterations 2 --no-report --profile '$OUT/profile'"

step tests "$(limit 240 "$(reserve train)")" "
  $PY -m pytest -m gpu tests/gpu -p no:cacheprovider -q -s -rA --durations=0 2>&1 | tee '$TMPD/tests.txt'
  rc=\${PIPESTATUS[0]}
  grep -E '^(PASSED|FAILED|SKIPPED|ERROR)|on (cuda|cpu): |passed|failed' '$TMPD/tests.txt' >'$OUT/gpu-tests.txt'
  grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected).* in [0-9.]+s' '$TMPD/tests.txt' | tail -n 1 | sed 's/=//g; s/^ *//' >'$OUT/gpu-tests-summary.txt'
  exit \$rc
"

step train "$(limit 90 5)" "
  t0=\$(date +%s)
  $PY -m ragen_cli.main train --config configs/bandit.yaml --data-root '$TMPD/train' --run-id devrun \
    trainer.iterations=$TRAIN_ITERS $TRAIN_EXTRA 2>&1 | tail -n 30
  rc=\${PIPESTATUS[0]}
  $PY '$DEVRUN/report.py' train '$TMPD/train' devrun \$((\$(date +%s) - t0)) '$OUT/train.json'
  exit \$rc
"

# the figures of earlier calls with this bundle that this call did not make go into the report too
(cd "$KEEP/results" && find . -mindepth 1 -maxdepth 1 -printf '%P\n') | while read -r file; do
  [[ -e "$OUT/$file" ]] || cp -r "$KEEP/results/$file" "$OUT/"
done
cp "$KEEP/summary.txt" "$OUT/summary-all.txt"
step report 30 "$PY '$DEVRUN/report.py' results '$OUT' '$PROJ'"

say ""
say "=== device check done in $(($(now) - START))s"
tee -a "$LOG" <"$SUMMARY"
