"""The name of each job's folder in a sweep. Hydra names it by the job's overrides (``hydra.job.override_dirname``:
sorted, joined by commas), which outgrows a file name once a command line carries many or long overrides, and the
sweep would stop at its first job with a traceback. Then the folders name only what differs between the jobs (the
overrides every job shares are in each job's ``.hydra/overrides.yaml`` and ``config.yaml``); where even that is too
long, or names no job apart, they are named by the job's number.
"""

from __future__ import annotations

NAME_MAX = 255  # bytes in one file name: ext4, XFS, APFS, NTFS alike


def _parse(line: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (override,) = OverridesParser.create().parse_overrides([line])
    return override


def dirname(job: list[str], exclude: set[str]) -> str:
    """The folder name Hydra gives a job with these overrides (``key=value`` lines): the lines whose key is not in
    ``exclude``, sorted, joined by commas (``hydra.job.config.override_dirname``'s defaults)."""
    return ",".join(sorted(line for line in job if _parse(line).key_or_group not in exclude))


def _longest(name: str) -> int:
    return max(len(part.encode()) for part in name.split("/"))


def folder_overrides(jobs: list[list[str]], exclude: list[str]) -> tuple[list[str], str]:
    """Hydra overrides that keep every job's folder name within :data:`NAME_MAX` bytes, and a line that says what
    they changed (``([], "")`` when Hydra's own names fit). ``jobs``: each job's override lines; ``exclude``: the
    keys Hydra already leaves out of the names."""
    names = [dirname(job, set(exclude)) for job in jobs]
    longest = max((_longest(n) for n in names if n), default=0)
    if longest <= NAME_MAX:
        return [], ""
    lines = [{_parse(line).key_or_group: line for line in job} for job in jobs]
    shared = sorted(k for k in lines[0] if k not in exclude and all(job.get(k) == lines[0][k] for job in lines))
    keep = [*exclude, *shared]
    short = [dirname(job, set(keep)) for job in jobs]
    said = f"the jobs' folder names would run to {longest} bytes (a file name takes {NAME_MAX})"
    if all(short) and len(set(short)) == len(short) and max(_longest(n) for n in short) <= NAME_MAX:
        quoted = ",".join(f"'{k}'" for k in keep)
        return (
            [f"hydra.job.config.override_dirname.exclude_keys=[{quoted}]"],
            f"{said}: they name what differs between the jobs ({short[0]}, ...); what they share is in each job's "
            ".hydra/overrides.yaml",
        )
    return (
        ["hydra.sweep.subdir=job_${hydra.job.num}"],
        f"{said}: they are named by the job's number (job_0, ...); each job's overrides are in its "
        ".hydra/overrides.yaml",
    )
