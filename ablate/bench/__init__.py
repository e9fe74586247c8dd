"""``python -m ablate.bench``: what each reference regime costs and how close the harness runs to this
machine's limits, side by side in one process, as ratios (see ``__main__``)."""
