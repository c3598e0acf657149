"""The command line of ``msf-train``, built from the fields of :class:`msf.cfg.config.Config`."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing

from msf.cfg.config import Config
from msf.cfg.flags import FIXED, LAUNCH, PER_NODE

# What --help adds to the help of a flag of each scope (msf.cfg.flags)
SCOPE_NOTES = {
    FIXED: "fixed once the experiment exists",
    LAUNCH: "on resume, taken from this command line",
    PER_NODE: "may differ between nodes",
}


def str2bool(v: str) -> bool:
    """Parse Sample Factory style booleans: ``--flag=True``, ``--flag=false``, ``--flag=1``."""
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", "y", "t"):
        return True
    if s in ("false", "0", "no", "n", "f"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {v!r}")


def integer(v: str) -> int:
    """Integers also accepted as ``1e6`` (a whole number written in float notation)."""
    try:
        return int(v)
    except ValueError:
        f = float(v)
        if not f.is_integer():
            raise argparse.ArgumentTypeError(f"expected an integer, got {v!r}") from None
        return int(f)


class DefaultsOnceHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``(default: X)`` after each flag's help, except where the help already says what the default
    is (``--num_workers``: "the default is the number of CPU cores"): the value there (None, or this machine's
    core count) is what the help explains, and argparse's note printed the default a second time."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and re.search(r"\bdefault\b", action.help, re.IGNORECASE):
            return action.help
        return super()._get_help_string(action)


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``prog: error: ...``), exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(
    prog: str = "msf-train", description: str | None = None, scope_notes: dict[str, str] = SCOPE_NOTES
) -> argparse.ArgumentParser:
    """An ``argparse`` parser with one option per :class:`Config` field, grouped by stage; the help of a
    flag notes those of its scopes that ``scope_notes`` has."""
    parser = OneLineErrorParser(
        prog=prog,
        description=description,
        formatter_class=DefaultsOnceHelpFormatter,
        allow_abbrev=False,
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        meta = f.metadata
        group = groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        hint = hints[f.name]
        notes = [note for scope, note in scope_notes.items() if scope in meta["scope"]]
        kwargs: dict = {"default": default, "help": meta["help"] + (f" [{'; '.join(notes)}]" if notes else "")}
        if meta.get("choices"):
            kwargs["choices"] = meta["choices"]
        if hint is bool:
            kwargs.update(type=str2bool, metavar="True|False")
        elif hint is int:
            kwargs["type"] = integer
        elif hint == (int | None):
            kwargs["type"] = integer
        elif hint is float:
            kwargs["type"] = float
        elif hint is list:
            kwargs.update(type=meta["item_type"], nargs="*")
        elif hint == (str | None):
            kwargs["type"] = str
        else:
            kwargs["type"] = str
        group.add_argument(f"--{f.name}", **kwargs)
    return parser


def parse_args(argv: list[str] | None = None, description: str | None = None) -> tuple[Config, set[str]]:
    """Parse ``argv`` into a :class:`Config`; also return the names of the flags given explicitly."""
    import sys

    parser = build_parser(description=description)
    argv = sys.argv[1:] if argv is None else argv
    ns = parser.parse_args(argv)
    return Config(**vars(ns)), given_flags(argv, vars(ns))


def given_flags(argv: list[str], names) -> set[str]:
    """The flags of ``names`` that ``argv`` gives explicitly (``--name=value`` or ``--name value``)."""
    return {tok[2:].split("=", 1)[0] for tok in argv if tok.startswith("--")} & set(names)
