"""Choosing an off-screen OpenGL backend for MuJoCo (``msf.envs.offscreen``), without starting any process."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest


def test_without_any_offscreen_backend_one_line_names_what_to_install(tmp_path, monkeypatch):
    """Neither EGL nor OSMesa works (both probes fail): one line naming the packages and MUJOCO_GL."""
    from msf.cfg.validation import ConfigError
    from msf.envs import offscreen

    if importlib.util.find_spec("mujoco") is None:
        pytest.skip("the mujoco extra is not installed here")  # nothing is chosen without it
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL"):
        monkeypatch.setenv(name, "")  # so that monkeypatch restores each as it was, also what is set below
        monkeypatch.delenv(name)
    monkeypatch.delitem(sys.modules, "mujoco", raising=False)
    tried = []
    with pytest.raises(ConfigError) as e:
        offscreen.choose_mujoco_gl("mujoco_hopper", probe=lambda b: tried.append(b) and False)
    assert tried == ["egl", "osmesa"]
    (line,) = e.value.problems
    assert "libegl1" in line and "libosmesa6" in line and "MUJOCO_GL" in line
    assert "MUJOCO_GL" not in os.environ
    # the second one that works is taken; a MUJOCO_GL the user set, or a display, is left alone
    assert offscreen.choose_mujoco_gl("mujoco_hopper", probe=lambda b: b == "osmesa") == "osmesa"
    assert os.environ["MUJOCO_GL"] == "osmesa"
    monkeypatch.setenv("MUJOCO_GL", "glfw")
    assert offscreen.choose_mujoco_gl("mujoco_hopper", probe=lambda b: True) is None
    monkeypatch.delenv("MUJOCO_GL")
    monkeypatch.setenv("DISPLAY", ":0")
    assert offscreen.choose_mujoco_gl("mujoco_hopper", probe=lambda b: True) is None
    assert "MUJOCO_GL" not in os.environ
    assert offscreen.uses_mujoco("mujoco_hopper") and offscreen.uses_mujoco("Hopper-v5")
    assert not offscreen.uses_mujoco("CartPole-v1")
