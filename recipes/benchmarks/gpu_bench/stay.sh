#!/usr/bin/env bash
# One stay on a lent GPU machine (15 minutes, its start-up included): one `gpu_bench` step in one command, whose
# results come back as one archive. Two halves (docs/gpu.md, "One step in one stay"):
#
#   bash recipes/benchmarks/gpu_bench/stay.sh prepare      # on a CPU machine, the repository's root, its .venv active
#   bash .gpu/tree/recipes/benchmarks/gpu_bench/stay.sh run STEP...   # on the GPU machine, with .gpu/ carried there
#
# `prepare` fills .gpu/ (ignored by git, ~30 MB): the wheels the GPU image lacks (it has torch, transformers and
# accelerate, not datasets), the export of `builtin:python-source` (the image's torch cannot make the corpus) and the
# tokenizer trained on it, and the tree to run (`git archive HEAD`: commit first). `run` installs the wheels into
# /tmp/site, runs the steps from .gpu/tree with `python -m recipes.benchmarks.gpu_bench` (each stopped at 8 minutes;
# the corpus is tokenised there by one process a core) and writes $OUT/gpu-bench.tgz: the results folders, the logs
# and each launch's result files. Back on the CPU machine: `tar xzf gpu-bench.tgz -C .gpu/back`, copy its
# docs/results/gpu/<device>-<date>/ into the repository, `python -m recipes.benchmarks.gpu_bench --table`, commit.
set -euo pipefail

WHEELS=(datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
PYTHONS=(3.11 3.12 3.13)  # the GPU image's Python is one of these: a wheel for each, pip picks there

prepare() {
  local root
  root=$(git rev-parse --show-toplevel)
  cd "$root"
  if ! git diff --quiet HEAD; then
    echo "stay.sh prepare: the tree has uncommitted changes; .gpu/tree is HEAD (git archive): commit first" >&2
    exit 1
  fi
  rm -rf .gpu && mkdir -p .gpu/wheels .gpu/cache .gpu/tree
  for version in "${PYTHONS[@]}"; do
    python -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
      --platform manylinux_2_28_x86_64 -d .gpu/wheels "${WHEELS[@]}"
  done
  python -m adloco_hf.data.corpus_export .gpu/corpus
  # The tokenizer the steps use (trained on the corpus's sample, cached under its fingerprint): one less thing to do
  # on the GPU machine, where only the tokenising and packing remain.
  python -c "from adloco_hf.data import load_or_train_tokenizer, load_text_corpus; \
load_or_train_tokenizer(None, load_text_corpus('builtin:python-source'), vocab_size=4096, cache_dir='.gpu/cache')"
  git archive --format=tar HEAD | tar -x -C .gpu/tree
  git rev-parse HEAD > .gpu/tree/COMMIT
  du -sh .gpu
  echo "carry .gpu; on the GPU machine: bash .gpu/tree/recipes/benchmarks/gpu_bench/stay.sh run STEP"
}

run() {
  local gpu tree out
  gpu=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)  # .gpu, which holds tree/, wheels/, corpus/, cache/
  tree="$gpu/tree"
  out=${OUT:?set OUT to the folder the archive goes to}
  [ $# -gt 0 ] || { echo "stay.sh run STEP...: name the steps (python -m recipes.benchmarks.gpu_bench --help)" >&2; exit 2; }
  cd "$tree"
  local started=$SECONDS
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    --find-links "$gpu/wheels" "${WHEELS[@]}"
  export PYTHONPATH="/tmp/site:$tree" ADLOCO_SOURCE_CORPUS="$gpu/corpus" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import torch, transformers, accelerate, datasets; print('commit', open('COMMIT').read().strip(), \
'torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, \
'datasets', datasets.__version__, 'cpus', __import__('os').cpu_count())"
  echo "ready in $((SECONDS - started)) s"
  local code=0
  # GPU_BENCH_ARGS: more arguments (`--tiny`: the steps' CPU versions, to check a prepared .gpu/ on a CPU machine).
  # shellcheck disable=SC2086
  python3 -m recipes.benchmarks.gpu_bench --steps "$@" --cache_dir "$gpu/cache" ${GPU_BENCH_ARGS:-} || code=$?
  # What comes back: the results and the logs, and each launch's small files (never a model's weights).
  find outputs/gpu_bench -type f \( -name "*.json" -o -name "*.jsonl" -o -name "*.log" \) -size -20M > /tmp/back.txt
  find outputs/gpu_bench -type f -name "*.png" -path "*/tiny/*" >> /tmp/back.txt 2>/dev/null || true
  tar czf "$out/gpu-bench.tgz" docs/results/gpu docs/gpu.md COMMIT -T /tmp/back.txt
  ls -la "$out"
  echo "stay: $((SECONDS - started)) s in all, gpu_bench exit $code"
  return "$code"
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  *) echo "usage: stay.sh prepare | stay.sh run STEP..." >&2; exit 2 ;;
esac
