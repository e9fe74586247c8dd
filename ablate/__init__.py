"""ablate: which cheaper stand-in for the frozen reference model can you use, and what does it cost?"""

__version__ = "0.1.0"
