"""Checkpoints: atomic files, keep-N, fallback past a corrupt newest file, background writes of snapshots."""

from __future__ import annotations

import pytest
import torch

from msf.persistence.checkpoint import (
    BackgroundCheckpointWriter,
    list_checkpoints,
    load_latest_checkpoint,
    save_checkpoint,
)


def _state(step: int, value: float) -> dict:
    return {"train_step": step, "env_steps": step * 10, "w": torch.full((3,), value), "opt": {"m": [torch.ones(2)]}}


def test_keeps_the_newest_and_falls_back_past_a_corrupt_one(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(_state(step, float(step)), str(tmp_path), keep=2)
    paths = list_checkpoints(str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["checkpoint_000000002_20.pth", "checkpoint_000000003_30.pth"]
    with open(paths[-1], "r+b") as f:
        f.truncate(10)  # a torn newest file
    state = load_latest_checkpoint(str(tmp_path))
    assert state["train_step"] == 2 and torch.equal(state["w"], torch.full((3,), 2.0))


def test_background_write_holds_the_state_of_submission(tmp_path):
    writer = BackgroundCheckpointWriter(str(tmp_path), keep=2)
    state = _state(5, 1.0)
    writer.submit(state)
    state["w"].add_(100.0)  # training goes on and changes the live tensors
    state["opt"]["m"][0].zero_()
    writer.close()
    saved = load_latest_checkpoint(str(tmp_path))
    assert torch.equal(saved["w"], torch.full((3,), 1.0)) and torch.equal(saved["opt"]["m"][0], torch.ones(2))


def test_background_write_errors_surface(tmp_path):
    target = tmp_path / "not_a_dir"
    target.write_text("a file where the experiment folder should be")
    writer = BackgroundCheckpointWriter(str(target), keep=2)
    writer.submit(_state(1, 0.0))
    with pytest.raises(OSError):
        writer.flush()
    writer.close()


class _RunsCode:
    """Unpickling this calls ``open(path, "w")``: a stand-in for any code a malicious file could run."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, caplog):
    from msf.persistence.checkpoint import CheckpointRefused, load_checkpoint_file

    save_checkpoint(_state(1, 0.0), str(tmp_path), keep=5)
    evil = tmp_path / "checkpoint_p0" / "checkpoint_000000002_2.pth"
    marker = tmp_path / "code_ran"
    torch.save({**_state(2, 0.0), "payload": _RunsCode(str(marker))}, evil)
    with pytest.raises(CheckpointRefused, match="could run code"):
        load_checkpoint_file(str(evil))
    state = load_latest_checkpoint(str(tmp_path))
    assert state["train_step"] == 1  # fell back to the previous, safe one
    assert not marker.exists()
    assert "refused" in caplog.text


def test_best_replaces_best_and_milestones_are_never_deleted(tmp_path):
    from msf.persistence.checkpoint import save_best_checkpoint

    for step in range(1, 5):
        save_checkpoint(_state(step, 0.0), str(tmp_path), keep=1, milestone=step % 2 == 1)
    assert [p.rsplit("/", 1)[1] for p in list_checkpoints(str(tmp_path))] == ["checkpoint_000000004_40.pth"]
    assert len(list_checkpoints(str(tmp_path), kind="milestones")) == 2  # steps 1 and 3
    save_best_checkpoint(_state(2, 0.0), str(tmp_path), "reward", 10.0)
    save_best_checkpoint(_state(3, 0.0), str(tmp_path), "reward", 12.5)
    (best,) = list_checkpoints(str(tmp_path), kind="best")
    assert best.endswith("best_000000003_30_reward_12.500.pth")
    assert load_latest_checkpoint(str(tmp_path), kind="best")["train_step"] == 3
    assert load_latest_checkpoint(str(tmp_path))["train_step"] == 4
