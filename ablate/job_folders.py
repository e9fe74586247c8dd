"""The name of each job's folder in a sweep (``conf/config.yaml``: ``hydra.sweep.subdir``). Hydra names it by the job's
overrides (``hydra.job.override_dirname``), which outgrows a file name once a command line carries many or long
overrides, and the sweep would stop at its first job with a traceback. A name that does not fit is cut to its first
bytes and a hash of the whole: a function of the job's own overrides, as Hydra's name is, so a rerun of the
sweep, or of part of it, finds each job's folder again. The job's ``.hydra/overrides.yaml`` keeps them all.

The resolver is registered when ``ablate`` is imported: a launcher's worker process (joblib, submitit) imports it
while it unpickles the job, before Hydra names the job's folder.
"""

from __future__ import annotations

import hashlib

NAME_MAX = 255  # bytes in one file name: ext4, XFS, APFS, NTFS alike
RESOLVER = "ablate_job_folder"
_DIGEST = 16  # hex digits of sha256: distinct names stay distinct


def folder_name(name: str) -> str:
    """Hydra's name for a job's folder, kept where each of its parts fits a file name; otherwise, as one part, its
    first bytes, ``-`` and the first hex digits of its sha256."""
    if all(len(part.encode()) <= NAME_MAX for part in name.split("/")):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_DIGEST]
    head = name.replace("/", "_").encode()[: NAME_MAX - _DIGEST - 1].decode(errors="ignore")
    return f"{head}-{digest}"


def register_resolver() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, folder_name)
