"""Sweeps: named presets (``sweeps/*.yaml`` as the Hydra group ``sweep``), their W&B sweep files, the
end-of-sweep report, and how many parallel workers this machine takes."""
