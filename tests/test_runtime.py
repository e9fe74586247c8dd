"""The allocator setting: glibc malloc maps blocks of 32 MiB and more on their own (returned whole on free) and
serves smaller ones from the heap, not every block below 1 GiB (which fragments the heap)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# in a fresh interpreter (the setting is process-wide): where malloc puts a 16 MiB and a 48 MiB block
PROBE = """
import ctypes
from ablate.runtime import tune_allocator

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
assert tune_allocator()
for mib in (16, 48):
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(mib << 20)
    print(mib, libc.mallinfo2().hblkhd - before >= mib << 20)
    libc.free(ctypes.c_void_p(block))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_blocks_of_32_mib_and_more_are_mapped_and_smaller_ones_come_from_the_heap():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split("\n")[:2] == ["16 False", "48 True"]
