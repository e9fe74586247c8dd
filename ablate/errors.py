"""Errors that end a run before any model loads, with one line saying what is wrong and how to fix it."""


class AblateError(Exception):
    """A problem with the user's input or environment; printed as one line, exit code 2."""


class ConfigError(AblateError):
    """An invalid or impossible configuration."""


class MissingAsset(AblateError):
    """A package or file the configuration needs is not installed."""


class CacheCorrupted(AblateError):
    """A cache entry failed its checksum."""
