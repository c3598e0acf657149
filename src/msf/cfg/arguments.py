"""The command line of ``msf-train``, built from the fields of :class:`msf.cfg.config.Config`."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import typing

from msf.cfg.config import Config
from msf.cfg.flags import FIXED, LAUNCH, PER_NODE, EvaluationFlags

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


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest single-character insertions, deletions and substitutions from ``a`` to
    ``b`` (Wagner and Fischer 1974's dynamic programme)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``prog: error: ...``), exit code 2. An unknown flag one edit
    away from a known one is named in the error (``--num_worker=2``: did you mean --num_workers?)."""

    def error(self, message: str) -> typing.NoReturn:
        hints = []
        if message.startswith("unrecognized arguments: "):
            known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
            for tok in message.removeprefix("unrecognized arguments: ").split():
                name = tok.split("=", 1)[0]
                close = [k for k in known if name.startswith("--") and edit_distance(name, k) == 1]
                if close:
                    hints.append(f"{name}: did you mean {' or '.join(close)}?")
        hint = f" ({'; '.join(hints)})" if hints else ""
        self.exit(2, f"{self.prog}: error: {message}{hint} (see --help)\n")


def build_parser(
    prog: str = "msf-train", description: str | None = None, scope_notes: dict[str, str] = SCOPE_NOTES
) -> argparse.ArgumentParser:
    """An ``argparse`` parser with one option per :class:`Config` field, grouped by stage; the help of a
    flag notes those of its scopes that ``scope_notes`` has."""
    parser = OneLineErrorParser(
        prog=prog,
        description=description,
        formatter_class=DefaultsOnceHelpFormatter,
        # no abbreviations (Sample Factory's argparse takes unique prefixes): a prefix silently changes meaning when a
        # flag is added, and a near miss (--num_worker=2) is named in the error instead
        allow_abbrev=False,
    )
    add_flags(parser, Config, scope_notes)
    if prog == "msf-train":  # msf-enjoy's flags, parsed (a value of the wrong type is still an error) and dropped
        title = (
            "evaluation flags (msf-enjoy's; accepted and ignored by msf-train, as Sample Factory's scripts share them)"
        )
        add_flags(
            parser, EvaluationFlags, group=title, default=argparse.SUPPRESS, help="see msf-enjoy --help", choices=None
        )
    return parser


def add_flags(
    parser: argparse.ArgumentParser,
    flags: type,
    scope_notes: dict[str, str] = SCOPE_NOTES,
    group: str | None = None,
    **override: typing.Any,
) -> None:
    """One option per field of ``flags`` (a dataclass of :mod:`msf.cfg.flags`), in the ``--help`` group of its
    metadata (or ``group``), its type from its annotation (a ``bool`` also a switch, as in Sample Factory); the help
    notes those of its scopes that ``scope_notes`` has. ``override``: ``add_argument`` keywords for every flag."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    hints = typing.get_type_hints(flags)
    for f in dataclasses.fields(flags):
        meta = f.metadata
        if meta.get("cli") is False:  # not a command-line flag (Config.env_args)
            continue
        title = group or meta["group"]
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        hint = hints[f.name]
        notes = [note for scope, note in scope_notes.items() if scope in meta["scope"]]
        kwargs: dict = {"default": default, "help": meta["help"] + (f" [{'; '.join(notes)}]" if notes else "")}
        if meta.get("choices"):
            kwargs["choices"] = meta["choices"]
        if hint is bool:
            kwargs.update(type=str2bool, metavar="True|False", nargs="?", const=True)
        elif hint is int or hint == (int | None):
            kwargs["type"] = integer
        elif hint is float or hint == (float | None):
            kwargs["type"] = float
        elif hint is list:
            kwargs.update(type=meta["item_type"], nargs="*")
        else:
            kwargs["type"] = str
        groups[title].add_argument(f"--{f.name}", **{**kwargs, **override})


EVALUATION_FLAGS = frozenset(f.name for f in dataclasses.fields(EvaluationFlags))
"""msf-enjoy's flags (Sample Factory's evaluation flags), which msf-train accepts and ignores: Sample Factory's
parser has them in every script, so command lines and launch scripts pass them to training too."""


def parse_args(argv: list[str] | None = None, description: str | None = None) -> tuple[Config, set[str]]:
    """Parse ``argv`` into a :class:`Config`; also return the names of the flags given explicitly (the evaluation
    flags of :data:`EVALUATION_FLAGS` among them, though the config leaves them out)."""
    parser = build_parser(description=description)
    argv = sys.argv[1:] if argv is None else argv
    values = vars(parser.parse_args(argv))
    evaluation = {k: values.pop(k) for k in list(values) if k in EVALUATION_FLAGS}
    return Config(**values), given_flags(argv, [*values, *evaluation])


def given_flags(argv: list[str], names) -> set[str]:
    """The flags of ``names`` that ``argv`` gives explicitly (``--name=value`` or ``--name value``)."""
    return {tok[2:].split("=", 1)[0] for tok in argv if tok.startswith("--")} & set(names)
