"""The troubleshooting page against the code, both ways: every message the page lists is in ``src/msf``, and every
user-facing one-line error or warning of ``src/msf`` is on the page.

How a message is matched. A message site in the code is a string (or f-string) given to one of the sites in
:data:`RULES`; its *fixed text* is its literal parts with each ``{...}`` replaced by ``…``. Its *key* is the first
:data:`KEY_CHARS` characters of its longest literal part, and the page must hold the key in one of its listed
messages. A listed message is a code span in the first cell of a table row of ``docs/troubleshooting.md``, written
as the message reads with ``…`` for each variable part; each of its pieces between ``…`` must be in the fixed text
of one site. So rewording a message in the code fails this test until the page says it the same way, and a new
user-facing message fails it until the page lists it.

The per-flag checks of ``msf.cfg.validation`` (``Problems.check``: ``--flag: what is valid``, one line per flag) are
one row of the page, ``--<flag>: …``, not one row each: ``msf-train --help`` documents every flag.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "msf"
PAGE = ROOT / "docs" / "troubleshooting.md"
KEY_CHARS = 50
MIN_PART = 12  # shorter literal parts ("--", ": ") say nothing of which message it is

# Exception classes whose message is for the user, wherever they are raised (their __init__'s f-strings too).
USER_ERRORS = {
    "ConfigError",
    "JoinRefused",
    "CheckpointError",
    "CheckpointRefused",
    "NoReadableCheckpoint",
    "Sf2Refused",
    "CheckpointWriteFailed",
    "ExportFailed",
    "OneLineFailure",
    "ReplicaMismatch",
    "AgreementTimedOut",
    "ChildDied",
    "RunFailed",
    "Refused",
    "JobLost",
    "EnvStepFailed",
}
# Built-in exceptions whose message reaches the user from these modules (bad input from a user's env or flags,
# a rank or node that did not come); elsewhere they mark broken internal invariants.
MODULE_ERRORS = {
    "envs/": {"ValueError"},
    "model/encoders.py": {"ValueError"},
    "sf2.py": {"ValueError"},
    "plot.py": {"FileNotFoundError"},
    "distributed/rendezvous.py": {"RuntimeError", "TimeoutError"},
    "runner/launch.py": {"RuntimeError"},
    "runner/experiment.py": {"RuntimeError"},
    "sampling/rollout_worker.py": {"TimeoutError"},
}
# Modules whose log warnings and errors are one-line messages about the run (besides every print to stderr).
LOGGING_MODULES = ("runner/run_health.py", "runtime/semaphore_records.py", "sampling/sampler_endpoint.py")
RULES = (USER_ERRORS, MODULE_ERRORS, LOGGING_MODULES)


@dataclass(frozen=True)
class Site:
    where: str
    parts: tuple[str, ...]

    @property
    def fixed(self) -> str:
        return "…".join(self.parts)

    @property
    def key(self) -> str:
        return max(self.parts, key=len)[:KEY_CHARS].strip()


def _norm(text: str) -> str:
    return " ".join(text.split())


def _parts(node: ast.AST, constants: dict[str, str]) -> list[str] | None:
    """The literal parts of a message expression, a placeholder as None; None when it is not a string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in constants:
        return _parts(constants[node.id], constants)
    if isinstance(node, ast.JoinedStr):
        out: list = []
        for v in node.values:
            inner = _parts(v.value, constants) if isinstance(v, ast.FormattedValue) else None
            out += [v.value] if isinstance(v, ast.Constant) else inner or [None]
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _parts(node.left, constants), _parts(node.right, constants)
        return None if left is None and right is None else (left or [None]) + (right or [None])
    return None


def _site(where: str, node: ast.AST, constants: dict[str, str]) -> Site | None:
    raw = _parts(node, constants)
    if raw is None:
        return None
    text = "".join("\0" if p is None else p for p in raw)
    text = re.sub(r"%(\.\d+)?[dsf]", "\0", text) if where.startswith(LOGGING_MODULES) else text
    parts = tuple(p for p in (_norm(s) for s in text.split("\0")) if p)
    return Site(where, parts) if parts and max(map(len, parts)) >= MIN_PART else None


def _called(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _string_names(tree: ast.AST) -> dict[str, ast.AST]:
    """The names assigned a string expression exactly once in a module (``line = f"..."`` printed later; an
    upper-case constant), to read a message given by name."""
    seen: dict[str, list[ast.AST]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            seen.setdefault(n.targets[0].id, []).append(n.value)
        elif isinstance(n, (ast.For, ast.comprehension)):  # a loop variable is many strings
            for t in ast.walk(n.target):
                if isinstance(t, ast.Name):
                    seen.setdefault(t.id, []).extend([t, t])
    return {k: v[0] for k, v in seen.items() if len(v) == 1 and isinstance(v[0], (ast.Constant, ast.JoinedStr))}


def _message_nodes(rel: str, tree: ast.AST) -> list[ast.AST]:
    """The message expressions of one module (``rel``: its path under ``src/msf``) by :data:`RULES`."""
    builtin = set().union(*(v for k, v in MODULE_ERRORS.items() if rel.startswith(k)))
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in USER_ERRORS:  # a message built in __init__
            inits = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
            calls = [c for f in inits for c in ast.walk(f) if isinstance(c, ast.Call) and _called(c) == "__init__"]
            found += [c.args[0] for c in calls if c.args]
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            name = _called(node.exc)
            if name in USER_ERRORS or name in builtin:
                found.append(node.exc.args[0])
        if not isinstance(node, ast.Call):
            continue
        name = _called(node)
        if name == "_fail" and len(node.args) == 2:  # distributed/nodes.py: ConfigError(f"--{flag}: {msg}")
            flag, msg = node.args
            prefix = ast.JoinedStr([ast.Constant("--"), ast.FormattedValue(flag, -1, None), ast.Constant(": ")])
            whole = ast.copy_location(ast.BinOp(prefix, ast.Add(), msg), msg)
            whole.anchor = msg  # type: ignore[attr-defined] # where its names are looked up
            found.append(whole)
        elif name == "error" and rel == "sampler.py" and len(node.args) == 2:  # msf-sampler: error: LINE
            found.append(node.args[0])
        elif name == "_fail" and len(node.args) == 1:  # sampling/device_sampler.py: the env's name, then the line
            found.append(node.args[0])
        elif name == "print" and any(k.arg == "file" and ast.unparse(k.value) == "sys.stderr" for k in node.keywords):
            found += node.args[:1]
        elif name == "_once" and rel in LOGGING_MODULES and len(node.args) == 3:  # the endpoint's once-per-node lines
            found.append(node.args[2])
        elif name in ("warning", "error", "info") and rel in LOGGING_MODULES and node.args:
            found.append(node.args[0])
    if rel in LOGGING_MODULES:  # messages made by a function and logged by its caller
        found += [n.value for n in ast.walk(tree) if isinstance(n, ast.Return) and n.value is not None]
    return found


@functools.cache
def code_sites() -> tuple[Site, ...]:
    """Every user-facing message of ``src/msf`` by :data:`RULES`."""
    sites: list[Site] = []
    trees = {p.relative_to(SRC).as_posix(): ast.parse(p.read_text()) for p in sorted(SRC.rglob("*.py"))}
    shared = {k: v for t in trees.values() for k, v in _string_names(t).items() if k.isupper()}
    for rel, tree in trees.items():
        scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
        scope_of = {id(n): scope for scope in scopes for n in ast.walk(scope)}  # the innermost: functions last
        names = {id(scope): {**shared, **_string_names(scope)} for scope in scopes}
        for node in _message_nodes(rel, tree):
            site = _site(
                f"{rel}:{getattr(node, 'lineno', 0)}", node, names[id(scope_of[id(getattr(node, "anchor", node))])]
            )
            sites += [site] if site else []
    return tuple(sites)


def page_messages() -> list[str]:
    """The messages the page lists: code spans in the first cell of its tables' rows."""
    out = []
    for line in PAGE.read_text().splitlines():
        if line.startswith("|") and not re.match(r"^\|\s*-", line):
            first = line.split("|")[1]
            out += [_norm(m) for m in re.findall(r"`([^`]+)`", first)]
    return out


def test_every_message_the_page_lists_is_in_the_code():
    fixed = [s.fixed for s in code_sites()]
    missing = []
    for message in page_messages():
        pieces = [p.strip() for p in message.split("…") if len(p.strip()) >= 4]
        if message.startswith("--<flag>:"):  # the per-flag validation row
            continue
        if not any(all(p in f for p in pieces) for f in fixed):
            missing.append(message)
    assert not missing, "listed on docs/troubleshooting.md, found in no message of src/msf:\n" + "\n".join(missing)


def test_every_user_facing_message_of_the_code_is_on_the_page():
    listed = page_messages()
    missing = [f"{s.where}: {s.fixed}" for s in code_sites() if not any(s.key in m for m in listed)]
    assert not missing, "not on docs/troubleshooting.md (add a row, the message as it reads):\n" + "\n".join(missing)


def test_the_rules_find_what_they_should():
    """The extraction itself, on messages known to exist: a ConfigError, a checkpoint error's __init__, a run
    health warning, the rollout worker's non-finite check, and a print to stderr."""
    fixed = [s.fixed for s in code_sites()]
    for expected in (
        "--env: unknown doom scenario",
        "no checkpoint in",
        "of the trajectories of the last",
        "returned a non-finite",
        "msf-train: a device group failed:",
    ):
        assert any(expected in f for f in fixed), expected
    assert len(fixed) > 100
