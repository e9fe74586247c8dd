"""ablate: which cheaper stand-in for the frozen reference model can you use, and what does it cost?"""

__version__ = "0.1.0"


def _register_resolvers() -> None:
    """The resolver that names a sweep's job folders, in every process that imports ablate (a launcher's worker
    imports it while unpickling its job, before Hydra names the folder)."""
    from ablate.job_folders import register_resolver

    try:
        register_resolver()
    except ModuleNotFoundError:  # no omegaconf: the command line says which package is missing
        pass


_register_resolvers()
