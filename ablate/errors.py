"""Errors that end a run before any model loads, with one line saying what is wrong and how to fix it.

:func:`one_line` turns a Hydra/OmegaConf composition error (several lines, library wording) into such a line.
"""

from __future__ import annotations

import re


class AblateError(Exception):
    """A problem with the user's input or environment; printed as one line, exit code 2."""


class ConfigError(AblateError):
    """An invalid or impossible configuration."""


class MissingAsset(AblateError):
    """A package or file the configuration needs is not installed."""


class CacheCorrupted(AblateError):
    """A cache entry failed its checksum."""


CFG_HINT = "list the keys with `python -m ablate --cfg job`"


def sweep_hint(key: str, values: str, group: bool = False) -> str:
    """What to write instead of several values (or config group options) for one key in one job."""
    one = "one option" if group else "one value per job"
    return f"{key} takes {one}; to run several, sweep: python -m ablate -m {key}={values}"


def first_line(e: BaseException) -> str:
    """The first line of an error, prefixed with its ``full_key`` when OmegaConf names one."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    msg = lines[0] if lines else type(e).__name__
    full_key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
    return f"{full_key}: {msg}" if full_key and full_key not in msg else msg


def parse_error(e: BaseException) -> str:
    """One line for an override Hydra's grammar rejects, saying how to quote it."""
    text = str(e)
    m = re.search(r"Error parsing override '([^']*)'", text) or re.search(r"LexerNoViableAltException: (\S+)", text)
    what = repr(m.group(1)) if m else first_line(e)
    return (
        f"cannot parse the command line at {what}: quote a value that holds special characters "
        f"(key='value'); see https://hydra.cc/docs/advanced/override_grammar/basic"
    )


def _key(text: str) -> str | None:
    """The dotted key a composition error is about (OmegaConf's ``full_key``, else Hydra's override)."""
    m = (
        re.search(r"full_key: (\S+)", text)
        or re.search(r"override [+~]*(\S+?)=", text)
        or re.search(r"override [+~]*(\S+)", text)
    )
    return m.group(1) if m else None


def _missing_option(text: str) -> str | None:
    m = re.search(r"Could not find '(.+)/([^/']+)'", text)
    if not m:
        return None
    group, value = m.groups()
    options = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)*)", text)
    names = ", ".join(o.strip() for o in options.group(1).splitlines() if o.strip()) if options else ""
    return f"unknown {group} {value!r} (choose from: {names})"


def _unknown_group(text: str) -> str | None:
    m = re.search(r"Could not override '([^']+)'", text)
    if m and "No match in the defaults list" in text:
        return f"unknown config group {m.group(1)!r}; groups are: model, task, judge, safety, algo, ref, logger"
    return None


def _unknown_key(text: str) -> str | None:
    m = re.search(r"Key '([^']+)' (?:is )?not in", text)
    if not m:
        return None
    key = re.search(r"full_key: (\S+)", text) or re.search(r"Could not override '([^']+)'", text)
    return f"unknown key {key.group(1) if key else m.group(1)!r}; check the spelling, or {CFG_HINT}"


def _list_for_scalar(text: str) -> str | None:
    m = re.search(r"Value '\[(.*)\]' of type 'list' could not be converted", text)
    if not m:
        return None
    return sweep_hint(_key(text) or "key", ",".join(v.strip().strip("'") for v in m.group(1).split(",")))


def _wrong_type(text: str) -> str | None:
    m = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", text)
    if m:
        return f"{_key(text) or 'a value'}: {m.group(1)!r} is not a valid {m.group(2)}"
    m = re.search(r"Value '([^']*)' is not a valid bool", text)
    if m:
        return f"{_key(text) or 'a value'}: {m.group(1)!r} is not a valid bool (true or false)"
    if "is not a ListConfig, list or tuple" in text:
        key = _key(text) or "key"
        return f"{key} takes a list: {key}=[a,b]"
    return None


def _group_list(text: str) -> str | None:
    """``ref=[full,int8]``: Hydra merges the listed options and fails on their schemas."""
    m = re.search(r"In 'schema/(\w+)/[^']*': ValidationError raised while composing", text)
    if m and "is not a subclass of" in text:
        return sweep_hint(m.group(1), "a,b", group=True)
    return None


def _sweep_without_m(text: str) -> str | None:
    m = re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", text)
    if not m:
        return None
    key, values = m.groups()
    return f"{sweep_hint(key.lstrip('+~'), values)} (for a list-valued key: {key}=[{values}])"


def _plus_on_existing(text: str) -> str | None:
    m = re.search(r"An item is already at '([^']+)'", text)
    return f"{m.group(1)} is already a setting: drop the '+' ({m.group(1)}=...)" if m else None


def _deletion(text: str) -> str | None:
    if "does not support deletion" not in text:
        return None
    key = _key(text) or "a setting"
    return f"{key} cannot be removed with '~': every key of the schema stays; set it instead ({key}=...)"


def _mandatory(text: str) -> str | None:
    if "missing mandatory value" not in text.lower():
        return None
    key = re.search(r"full_key: (\S+)", text)
    key = key.group(1) if key else "a required value"
    return f"{key} is required: set it on the command line ({key}=...)"


_RULES = (
    _missing_option,
    _unknown_group,
    _unknown_key,
    _list_for_scalar,
    _wrong_type,
    _group_list,
    _sweep_without_m,
    _plus_on_existing,
    _deletion,
    _mandatory,
)


def one_line(e: BaseException) -> str:
    """One line saying what is wrong, from a Hydra/OmegaConf composition error and its cause."""
    text = str(e)
    cause = e.__cause__ or e.__context__
    if cause is not None:
        text += "\n" + str(cause)
    for rule in _RULES:
        msg = rule(text)
        if msg:
            return msg
    return first_line(e)
