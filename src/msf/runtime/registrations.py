"""What a process has registered (envs, encoders, declared spaces), carried to the processes it spawns.

msf starts its ranks with ``spawn`` and its workers from a fork server that imported only torch and msf's worker
modules: a child imports the other modules it needs anew, so a registration made at import of a module reaches it,
and one made in a script's ``main()`` does not (Sample Factory's launch
scripts register in ``main()``: its processes receive its registries pickled). Every registry of msf is a named
dict of this module (:func:`registry`); :func:`snapshot` gives the entries that pickle (functions and classes by
reference, including those of the script run as ``__main__``, which a spawned child imports again), and
:func:`restore`, called first in every child msf spawns, adds them there.
"""

from __future__ import annotations

import pickle
from typing import Any

_REGISTRIES: dict[str, dict[str, Any]] = {}
# (kind, name) -> why the launching process could not send that entry (it did not pickle): filled by restore()
_UNSENT: dict[tuple[str, str], str] = {}
_UNSENT_KIND = "__unsent__"  # the snapshot's entry listing them, "kind:name" -> the reason (utf-8)


def registry(kind: str) -> dict[str, Any]:
    """The registry ``kind`` (``"env"``, ``"encoder"``, ...): one dict per kind and process."""
    return _REGISTRIES.setdefault(kind, {})


def snapshot() -> dict[str, dict[str, bytes]]:
    """Every entry of every registry that pickles, pickled (a lambda does not: it is left out, and reaches a
    child only if the module that registers it is imported there; the snapshot lists it with the reason, for
    :func:`why_missing` in the child)."""
    out: dict[str, dict[str, bytes]] = {}
    for kind, entries in _REGISTRIES.items():
        for name, value in entries.items():
            try:
                out.setdefault(kind, {})[name] = pickle.dumps(value)
            except Exception as e:  # noqa: BLE001 - unpicklable (a lambda, a local function): left out
                out.setdefault(_UNSENT_KIND, {})[f"{kind}:{name}"] = f"{type(e).__name__}: {e}".encode()
    return out


def why_missing(kind: str, name: str) -> str | None:
    """Why ``name`` of registry ``kind`` is missing in this spawned process although the process that started it
    had registered it (it did not pickle; see :func:`snapshot`); None when that is not the case."""
    reason = _UNSENT.get((kind, name))
    if reason is None:
        return None
    return (
        f"it was registered in the launching process, but could not be sent to this one ({reason}): register a "
        "function or class defined at the top level of a module or of the script (not a lambda or a nested "
        "function), or register it at import of a module that every process imports"
    )


def restore(snap: dict[str, dict[str, bytes]] | None) -> None:
    """Add the entries of a :func:`snapshot` that this process does not have yet (an entry that cannot be
    unpickled here is skipped: using it raises the registry's own "not registered" error)."""
    for kind, entries in (snap or {}).items():
        if kind == _UNSENT_KIND:
            for key, reason in entries.items():
                entry_kind, _, name = key.partition(":")
                _UNSENT[(entry_kind, name)] = reason.decode()
            continue
        target = registry(kind)
        for name, blob in entries.items():
            if name in target:
                continue
            try:
                target[name] = pickle.loads(blob)
            except Exception:  # noqa: BLE001 - e.g. a module this child cannot import
                continue
