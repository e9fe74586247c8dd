"""The server launcher (ablate.serving.llama_server): AMX read off /proc/cpuinfo's flags, and llama-cpp-python's
default model parameters made to use no extra weight buffers (what keeps ggml's AMX matmul from crashing the server
on a quantised file: tests/refs/test_served.py's quantised copy crashed it on an AMX host without it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ablate.serving.llama_server import has_amx

pytest.importorskip("llama_cpp")


def test_amx_is_read_off_the_cpus_flags(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
    assert not has_amx(f)
    f.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    assert has_amx(f)
    assert not has_amx(tmp_path / "missing")


def test_every_model_loaded_after_it_uses_no_extra_buffers():
    """In a fresh process (the patch stays in the process it is made in), as the server's would be."""
    code = (
        "from llama_cpp import llama_cpp as low\n"
        "assert low.llama_model_default_params().use_extra_bufts\n"
        "from ablate.serving.llama_server import without_extra_buffers\n"
        "without_extra_buffers()\n"
        "assert not low.llama_model_default_params().use_extra_bufts\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
