"""Rendering without a display, for ``msf-enjoy``'s videos.

Gymnasium's classic-control renderers (pygame) need SDL's dummy driver. MuJoCo needs an OpenGL backend that
works without a display, and it picks one at its import from ``MUJOCO_GL``: unset, gymnasium's MuJoCo renderer
tries GLFW first, whose context comes up without a display and then fails in ``mujoco.MjrContext``
(``mujoco.FatalError``); and once PyOpenGL has been imported for one backend, no other can be tried in the same
process. So the backend is chosen here, before mujoco is imported: EGL, else OSMesa, each tried in a child
process, whose failure cannot harm this one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping

from msf.cfg.validation import ConfigError

# MuJoCo's off-screen backends in the order tried, each with the package that provides it (Debian and Ubuntu)
MUJOCO_BACKENDS = (("egl", "libegl1"), ("osmesa", "libosmesa6"))

# what the probe does: what gymnasium's renderer does first (a context, then MuJoCo's render context on it)
_PROBE = """
import mujoco
gl = mujoco.GLContext(16, 16)
gl.make_current()
mujoco.MjrContext(mujoco.MjModel.from_xml_string("<mujoco/>"), mujoco.mjtFontScale.mjFONTSCALE_150)
gl.free()
"""


def has_display(environ: Mapping[str, str] | None = None) -> bool:
    """An X11 or Wayland display is named in the environment."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def uses_mujoco(name: str) -> bool:
    """``name`` (an ``--env`` value) is known to render with MuJoCo: the ``mujoco_*`` family, or a gymnasium id
    whose entry point is one of gymnasium's MuJoCo envs (``Hopper-v5``; also behind ``module:Id``)."""
    import gymnasium as gym

    from msf.envs.families import family_of

    if family_of(name) == "mujoco_":
        return True
    module, _, short = name.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        entry = gym.spec(short).entry_point
    except Exception:  # noqa: BLE001 - not a gymnasium id (a registered maker, a typo): make_env says which
        return False
    return isinstance(entry, str) and "mujoco" in entry


def probe_mujoco_gl(backend: str, timeout_s: float = 60.0) -> bool:
    """MuJoCo can render off-screen with ``MUJOCO_GL=backend`` here: tried in a child process (with this
    process's environment otherwise), so that a crash or a hang costs nothing but the answer."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env={**os.environ, "MUJOCO_GL": backend},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def choose_mujoco_gl(name: str, probe=probe_mujoco_gl) -> str | None:
    """Set ``MUJOCO_GL`` to the first of :data:`MUJOCO_BACKENDS` that works here, when the user has not set it,
    there is no display and mujoco is not imported yet. Returns the backend set, or None (nothing to do).

    Raises:
        ConfigError: none works: one line naming the packages to install and ``MUJOCO_GL``.
    """
    if "MUJOCO_GL" in os.environ or has_display() or "mujoco" in sys.modules:
        return None  # the user's choice; or GLFW with a display; or too late (the import has fixed it)
    if importlib.util.find_spec("mujoco") is None:
        return None  # make_env names the extra to install
    for backend, _ in MUJOCO_BACKENDS:
        if probe(backend):
            os.environ["MUJOCO_GL"] = backend
            return backend
    names = ", ".join(f"MUJOCO_GL={b}" for b, _ in MUJOCO_BACKENDS)
    packages = " or ".join(pkg for _, pkg in MUJOCO_BACKENDS)
    raise ConfigError(
        f"--save_video: {name} renders with MuJoCo, which without a display needs EGL or OSMesa, and neither "
        f"works here ({names} tried): install one (apt-get install {packages}), or set MUJOCO_GL to a backend "
        "that works"
    )


def prepare_offscreen(name: str) -> None:
    """Before the env ``name`` is made with ``render_mode="rgb_array"``: SDL's dummy drivers, and a MuJoCo
    backend that works without a display (:func:`choose_mujoco_gl`) for an env known to use MuJoCo.

    Raises:
        ConfigError: see :func:`choose_mujoco_gl`.
    """
    # pygame (gymnasium's classic-control renderers) needs no display then
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if uses_mujoco(name):
        choose_mujoco_gl(name)


def is_gl_failure(e: BaseException) -> bool:
    """``e`` is an OpenGL context that could not be made (by MuJoCo, PyOpenGL or gymnasium's MuJoCo renderer)."""
    root = type(e).__module__.split(".")[0]
    return root in ("mujoco", "OpenGL") or "OpenGL" in str(e)
