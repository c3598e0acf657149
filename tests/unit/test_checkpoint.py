"""Checkpoints: atomic files, keep-N, fallback past a corrupt newest file (moving nothing; msf-train's check refuses
or sets aside), background writes of snapshots, a full disk named as such."""

from __future__ import annotations

from pathlib import Path

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


# --- unreadable checkpoints: loading moves nothing; msf-train's check refuses or sets aside -----------------


def _broken(path, how: str) -> None:
    """Make the checkpoint at ``path`` unreadable: cut short, emptied, or overwritten with zeros."""
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "zeros": bytes(len(data))}[how])


def _cfg(tmp_path, **kw):
    from msf.cfg.config import Config

    return Config(train_dir=str(tmp_path), experiment="exp", **kw)


@pytest.mark.parametrize("how", ["truncated", "empty", "zeros"])
def test_a_resume_whose_only_checkpoint_is_unreadable_is_refused_with_the_reason_and_nothing_moves(tmp_path, how):
    from msf.cfg.validation import ConfigError
    from msf.persistence.checkpoint import NoReadableCheckpoint
    from msf.runner.experiment import check_checkpoints

    exp = tmp_path / "exp"
    path = Path(save_checkpoint(_state(5, 1.0), str(exp), keep=2))
    _broken(path, how)
    before = sorted(p.name for p in path.parent.iterdir())
    with pytest.raises(ConfigError) as e:
        check_checkpoints(_cfg(tmp_path), move=True)
    (line,) = e.value.problems  # one line, naming the file and why it cannot be read
    assert f"{path} (" in line and "--restart_behavior=restart" in line
    reason = line.split(f"{path} (", 1)[1].split(")")[0]
    assert reason.strip() and not reason.startswith(")")  # the reason is never empty
    assert sorted(p.name for p in path.parent.iterdir()) == before  # nothing renamed, nothing written
    # the ranks' loader refuses too, rather than starting from step 0
    with pytest.raises(NoReadableCheckpoint, match="is readable"):
        load_latest_checkpoint(str(exp))
    # --restart_behavior=restart (or overwrite) asks for a new start: nothing to check
    assert check_checkpoints(_cfg(tmp_path, restart_behavior="restart"), move=True) == []


def test_msf_train_sets_an_unreadable_newest_checkpoint_aside_and_says_why(tmp_path):
    from msf.runner.experiment import check_checkpoints

    exp = tmp_path / "exp"
    good = save_checkpoint(_state(1, 1.0), str(exp), keep=5)
    bad = Path(save_checkpoint(_state(2, 2.0), str(exp), keep=5))
    _broken(bad, "zeros")
    # a process that does not prepare the folder (another local rank) only reads
    (note,) = check_checkpoints(_cfg(tmp_path), move=False)
    assert bad.exists() and note.startswith(f"checkpoint {bad} is unreadable (") and note.endswith(f"from {good}")
    (note,) = check_checkpoints(_cfg(tmp_path), move=True)
    assert not bad.exists() and bad.with_name(bad.name + ".bad").exists()
    assert f"set aside as {bad.name}.bad; resuming from {good}" in note
    assert "unreadable ()" not in note
    assert check_checkpoints(_cfg(tmp_path), move=True) == []  # nothing left to report


def test_loading_past_an_unreadable_checkpoint_moves_nothing_and_logs_the_reason(tmp_path, caplog):
    exp = tmp_path / "exp"
    save_checkpoint(_state(1, 1.0), str(exp), keep=5)
    bad = Path(save_checkpoint(_state(2, 2.0), str(exp), keep=5))
    _broken(bad, "truncated")
    assert load_latest_checkpoint(str(exp))["train_step"] == 1
    assert bad.exists()  # an evaluation (msf-enjoy) or a rank reads; it never moves the user's files
    (record,) = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert f"checkpoint {bad} is unreadable (" in record.getMessage()
    assert "unreadable ()" not in record.getMessage()


def test_an_error_without_a_message_still_has_a_reason():
    from msf.persistence.checkpoint import unreadable_reason

    assert unreadable_reason(RuntimeError("")) == "RuntimeError"
    assert unreadable_reason(EOFError()) == "EOFError: the file is empty or cut short"  # torch.load of an empty file
    assert unreadable_reason(RuntimeError("\nfirst line. Advice.\nsecond")) == "RuntimeError: first line"


# --- a full disk while writing ------------------------------------------------------------------------------


def _no_temp_files(folder) -> bool:
    return not [p for p in folder.iterdir() if p.name.startswith(".tmp-")]


def test_a_full_disk_names_the_file_the_free_space_and_the_checkpoint_kept(tmp_path, monkeypatch):
    """A real ENOSPC from the kernel: the temporary file is opened on /dev/full, so torch.save meets the error a
    full disk gives, in whatever form torch reports it."""
    import os

    from msf.persistence import checkpoint
    from msf.persistence.checkpoint import CheckpointWriteFailed

    kept = save_checkpoint(_state(1, 1.0), str(tmp_path), keep=2)
    folder = tmp_path / "checkpoint_p0"
    never = str(folder / ".tmp-never-created.pth")
    monkeypatch.setattr(checkpoint, "_temp_file", lambda path: (os.open("/dev/full", os.O_WRONLY), never))
    writer = BackgroundCheckpointWriter(str(tmp_path), keep=2)
    writer.submit(_state(2, 2.0))
    with pytest.raises(CheckpointWriteFailed) as e:
        writer.flush()
    writer.close()
    target = folder / "checkpoint_000000002_20.pth"
    assert e.value.disk_full and e.value.path == str(target) and e.value.kept == kept
    assert e.value.free_bytes is not None
    free = f"{e.value.free_bytes / 2**20:.1f} MiB free"
    assert str(e.value) == (
        f"could not write the checkpoint {target}: the disk is full ({free} there); no partial file was left, "
        f"and the checkpoints already there are kept (newest: {kept})"
    )
    assert not target.exists() and _no_temp_files(folder)
    assert load_latest_checkpoint(str(tmp_path))["train_step"] == 1


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2148160 vs 2148048"),
        OSError(28, "No space left on device"),
    ],
)
def test_torchs_short_write_error_is_reported_as_a_full_disk(tmp_path, monkeypatch, error):
    from msf.persistence import checkpoint
    from msf.persistence.checkpoint import CheckpointWriteFailed

    def save(state, f):
        f.write(b"PK\x03\x04 half a checkpoint")  # what a write cut short leaves in the temporary file
        raise error

    monkeypatch.setattr(checkpoint.torch, "save", save)
    with pytest.raises(CheckpointWriteFailed, match=r"checkpoint_000000003_30\.pth: the disk is full \(") as e:
        save_checkpoint(_state(3, 0.0), str(tmp_path), keep=2)
    assert e.value.kept is None and str(e.value).endswith("there is no earlier checkpoint in that folder")
    assert list((tmp_path / "checkpoint_p0").iterdir()) == []  # no half-written file, no temporary file


@pytest.mark.parametrize("planted", [None, 12.5])
def test_a_rerun_keeps_the_earlier_attempts_best_as_the_value_to_beat(tmp_path, planted):
    """A rerun in a folder whose best checkpoint was written after the state it starts from (an attempt that failed
    before its first periodic checkpoint) replaces that best only with a better return."""
    from types import SimpleNamespace

    from msf.distributed.topology import RankInfo
    from msf.persistence.checkpoint import best_on_disk, save_best_checkpoint
    from msf.persistence.train_state import TrainState
    from msf.runner.checkpoints import Checkpoints

    if planted is not None:
        save_best_checkpoint(_state(7, 0.0), str(tmp_path), "reward", planted)
        folder = tmp_path / "checkpoint_p0"  # another metric's best (an earlier --save_best_metric) is not the bar
        (folder / "best_000000006_60_other_metric_99.000.pth").write_bytes(
            (folder / "best_000000007_70_reward_12.500.pth").read_bytes()
        )
    cfg = SimpleNamespace(
        keep_checkpoints=2, save_best_metric="reward", save_best_after=0, save_best_every_sec=0, to_dict=dict
    )
    state = TrainState.fresh(num_policies=1, stats_avg=10)
    state.capture = lambda policy, learner, cfg, world: _state(1, 0.0)
    ckpt = Checkpoints(cfg, str(tmp_path), state, [None], RankInfo(), start_time=0.0)
    ckpt.save_best(0, 10.0, frames=100)
    ckpt.close()
    assert best_on_disk(str(tmp_path), "reward") == (planted if planted is not None else 10.0)
    ckpt = Checkpoints(cfg, str(tmp_path), state, [None], RankInfo(), start_time=0.0)
    ckpt.save_best(0, 13.0, frames=100)
    ckpt.close()
    assert best_on_disk(str(tmp_path), "reward") == 13.0
    assert state.policies[0].best_metric == 13.0


def test_every_refusal_is_one_error_type_of_one_line(tmp_path):
    """No file, none readable, non-finite values, a model that does not fit: each a CheckpointError, one line."""
    from msf.persistence.checkpoint import CheckpointError, CheckpointRefused, NoReadableCheckpoint, load_into
    from msf.persistence.sf2_checkpoint import Sf2Refused

    assert all(issubclass(e, CheckpointError) for e in (CheckpointRefused, NoReadableCheckpoint, Sf2Refused))
    assert load_latest_checkpoint(str(tmp_path)) is None  # a fresh run: nothing to load
    with pytest.raises(CheckpointError, match=r"^no readable best checkpoint in \S+checkpoint_p0$"):
        load_latest_checkpoint(str(tmp_path), kind="best", required=True)
    good = save_checkpoint({**_state(1, 0.0), "model": {"w": torch.zeros(2)}}, str(tmp_path), keep=5)
    nan = save_checkpoint({**_state(2, 0.0), "model": {"w": torch.tensor([0.0, float("nan")])}}, str(tmp_path), keep=5)
    seen = []
    state = load_latest_checkpoint(str(tmp_path), on_unreadable=lambda *bad: seen.append(bad))
    assert state["path"] == good and seen == [(nan, f"CheckpointError: {nan} holds non-finite values (in w)", good)]
    model = torch.nn.Linear(3, 1)
    with pytest.raises(CheckpointError) as e:
        load_into(state, lambda s: model.load_state_dict(s["model"]))
    assert str(e.value).startswith(f"the checkpoint {good} does not fit the model (") and "\n" not in str(e.value)
