"""``python -m ablate.serving.llama_server [llama_cpp.server's options]``: llama-cpp-python's server as ablate starts
it (:class:`ablate.serving.engine.LlamaCppServer`). On a CPU with AMX it is started with llama.cpp's extra weight
buffers off (``use_extra_bufts``: the AMX and repacked layouts, llama.cpp's ``--no-repack``): there ggml's AMX
matrix multiply crashes the server at its first forward of a quantised model (llama.cpp issue 20824; seen here with a
q8_0 copy of the tiny test model, SIGSEGV, on an Intel Xeon with AMX, llama-cpp-python 0.3.36, built natively by
``scripts/setup.sh``). Elsewhere it is llama-cpp-python's server unchanged.

llama-cpp-python's server takes no option for it, so this module sets it where the server reads its model's
parameters: the one private use of llama-cpp-python in ablate, checked before the server starts (one clear line,
exit 2, if the library no longer has it).
"""

from __future__ import annotations

import sys
from pathlib import Path

#: /proc/cpuinfo flags that mean ggml's AMX code may run
AMX_FLAGS = ("amx_int8", "amx_tile")


def has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU reports AMX (Linux; False where the file cannot be read)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return any(f in flags for f in AMX_FLAGS)


def without_extra_buffers() -> None:
    """Make every model llama-cpp-python loads in this process use no extra weight buffers: its default model
    parameters (which ``Llama`` starts from) with ``use_extra_bufts`` false."""
    from llama_cpp import llama_cpp as low

    default = low.llama_model_default_params
    if not hasattr(default(), "use_extra_bufts"):
        raise RuntimeError(
            "llama-cpp-python's model parameters have no use_extra_bufts (ablate/serving/llama_server.py)"
        )

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = params


def main() -> int:
    if has_amx():
        try:
            without_extra_buffers()
        except RuntimeError as e:
            print(f"ablate.serving.llama_server: error: {e}", file=sys.stderr)
            return 2
        print("ablate.serving.llama_server: AMX CPU: llama.cpp's extra weight buffers off", file=sys.stderr)
    from llama_cpp.server.__main__ import main as serve

    serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
