"""Sample Factory 2.1.1 experiment folders in msf (:mod:`msf.persistence.sf2_checkpoint`): the checkpoints of
``tests/data/sf2`` (made by Sample Factory itself, see ``make_sf2_checkpoints.py`` there) give Sample Factory's
outputs through msf-enjoy's loading path, msf's checkpoints are written beside Sample Factory's (which stay byte
for byte), and what cannot be mapped is refused in one line, exit code 2, with nothing written. msf-enjoy playing
one and msf-train resuming one, as processes: tests/integration/test_sf2_checkpoint_runs.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from msf.cfg.arguments import EVALUATION_FLAGS
from msf.cfg.config import Config
from msf.enjoy import _load_config, read_checkpoint
from msf.envs.registry import EnvSpaces
from msf.model.actor_critic import ActorCritic
from msf.persistence.checkpoint import BackgroundCheckpointWriter
from msf.persistence.sf2_checkpoint import as_msf_checkpoint, msf_config_dict, sf2_files

DATA = Path(__file__).resolve().parents[1] / "data" / "sf2"
MODELS = [
    "mlp",
    "mlp_gru",
    "mlp_lstm2",
    "mlp_separate",
    "mlp_separate_decoder",
    "mlp_separate_lstm2",
    "mlp_continuous",
    "convnet_atari",
    "convnet_simple",
    "convnet_impala",
    "resnet_impala",
]
CONVERTED = "converted the Sample Factory 2.1.1 checkpoint"


def _spaces(name: str, obs: np.ndarray, logits: np.ndarray) -> EnvSpaces:
    """The env spaces each reference model was made for (a Box of ``obs``'s shape; Discrete, or Box(2) actions)."""
    continuous = name == "mlp_continuous"
    return EnvSpaces(tuple(obs.shape[1:]), obs.dtype, not continuous, logits.shape[1] // (2 if continuous else 1))


def _load(train_dir: Path, name: str, spaces: EnvSpaces) -> tuple[Config, ActorCritic, dict]:
    """msf-enjoy's path: its config loading, its checkpoint loading, the model, the conversion."""
    cfg = _load_config(Config(train_dir=str(train_dir), experiment=name), {"train_dir", "experiment"})
    state = read_checkpoint(cfg, str(train_dir / name))
    model = ActorCritic(cfg, spaces)
    state = as_msf_checkpoint(state, model)
    model.load_state_dict(state["model"])
    return cfg, model.eval(), state


def _sf_to_msf_states(states: torch.Tensor, cfg: Config) -> torch.Tensor:
    """Sample Factory's ``[B, L x (h, c) x H]`` LSTM states (h and c side by side per layer) in msf's layout,
    ``[B, (h, c) x L x H]`` (all h, then all c), per core (separate weights: the actor's, then the critic's, in
    both); a GRU's are the same in both."""
    if cfg.rnn_type != "lstm":
        return states
    cores, L, H = 1 if cfg.actor_critic_share_weights else 2, cfg.rnn_num_layers, cfg.rnn_size
    return states.view(-1, cores, L, 2, H).transpose(2, 3).reshape(states.shape[0], -1)


def _msf_to_sf_states(states: torch.Tensor, cfg: Config) -> torch.Tensor:
    if cfg.rnn_type != "lstm":
        return states
    cores, L, H = 1 if cfg.actor_critic_share_weights else 2, cfg.rnn_num_layers, cfg.rnn_size
    return states.view(-1, cores, 2, L, H).transpose(2, 3).reshape(states.shape[0], -1)


def _files(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def _copy(name: str, tmp_path: Path) -> Path:
    shutil.copytree(DATA / name, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("name", MODELS)
def test_msf_gives_sample_factorys_outputs(name, capsys, caplog):
    ref = np.load(DATA / name / "reference.npz")
    cfg, model, state = _load(DATA, name, _spaces(name, ref["obs"], ref["action_logits"]))
    assert CONVERTED in capsys.readouterr().err + caplog.text  # stderr, or the log where one is set up
    assert (state["train_step"], state["policy_version"]) == (10, 10)
    assert state["env_steps"] == (1280 // 4 if name == "convnet_atari" else 1280)  # SF counts frames (frameskip 4)
    rnn = _sf_to_msf_states(torch.as_tensor(ref["rnn_states"]), cfg) if cfg.use_rnn else None
    with torch.no_grad():
        params, values, new_states = model.forward_with_states(torch.as_tensor(ref["obs"]), rnn)
    # logits, or the Gaussian's means and log standard deviations side by side (Sample Factory's layout)
    assert np.abs(params.numpy() - ref["action_logits"]).max() <= 1e-5
    assert np.abs(values.numpy() - ref["values"]).max() <= 1e-5
    if cfg.use_rnn:
        assert np.abs(_msf_to_sf_states(new_states, cfg).numpy() - ref["new_rnn_states"]).max() <= 1e-5
    if cfg.normalize_input:  # the normaliser's statistics were carried over, and they matter
        fresh = ActorCritic(cfg, model.spaces).state_dict()
        other = {k: fresh[k] if "normalizer" in k and "returns" not in k else v for k, v in state["model"].items()}
        model.load_state_dict(other)
        with torch.no_grad():
            assert np.abs(model(torch.as_tensor(ref["obs"]), rnn)[0].numpy() - ref["action_logits"]).max() > 1e-3


@pytest.mark.parametrize("name", ["mlp_separate_decoder", "mlp_separate_lstm2"])
def test_separate_weights_give_sample_factorys_outputs_step_by_step_and_as_sequences(name):
    """Sample Factory's separate actor and critic (own encoder, decoder, and core: its state the actor's then the
    critic's) over 5 steps with episode ends: msf's inference path (one step at a time, the state fed back and
    zeroed after an end, as the rollout workers do) and its learner's path (the 5 steps as one sequence with the
    ends as resets) both give Sample Factory's logits, values and new states."""
    ref = np.load(DATA / name / "reference.npz")
    cfg, model, state = _load(DATA, name, _spaces(name, ref["obs"], ref["action_logits"]))
    assert (cfg.actor_critic_share_weights, len(cfg.decoder_mlp_layers)) == (False, 1)
    assert {"decoder.0.weight", "critic_decoder.0.weight"} <= state["model"].keys()
    assert not torch.equal(state["model"]["decoder.0.weight"], state["model"]["critic_decoder.0.weight"])
    if not cfg.use_rnn:
        return  # one step: test_msf_gives_sample_factorys_outputs
    assert ref["rnn_states"].shape[1] == model.rnn_state_size == 2 * 2 * 2 * 8  # 2 cores x (h, c) x 2 layers x 8
    assert {"core.weight_hh_l1", "critic_core.weight_hh_l1"} <= state["model"].keys()
    K, N = ref["seq_dones"].shape
    assert 0 < ref["seq_dones"][:-1].sum() < (K - 1) * N  # some rows reset, others carry their state on
    h0 = _sf_to_msf_states(torch.as_tensor(ref["rnn_states"]), cfg)
    worst = 0.0
    with torch.no_grad():
        h = h0
        for t in range(K):
            params, values, h = model.forward_with_states(torch.as_tensor(ref["seq_obs"][t]), h)
            for got, want in [
                (params, ref["seq_action_logits"][t]),
                (values, ref["seq_values"][t]),
                (_msf_to_sf_states(h, cfg), ref["seq_new_rnn_states"][t]),
            ]:
                worst = max(worst, float(np.abs(got.numpy() - want).max()))
            h = h * (1.0 - torch.as_tensor(ref["seq_dones"][t]))[:, None]
        # the learner's pass: N sequences of K steps, sequence-major
        obs = torch.as_tensor(ref["seq_obs"]).transpose(0, 1).reshape(N * K, -1)
        params, values, _ = model.forward_with_states(obs, h0, torch.as_tensor(ref["seq_dones"]).T)
    assert worst <= 1e-5, worst
    np.testing.assert_allclose(params.view(N, K, -1).transpose(0, 1).numpy(), ref["seq_action_logits"], atol=1e-5)
    np.testing.assert_allclose(values.view(N, K).T.numpy(), ref["seq_values"], atol=1e-5)


def test_an_image_normaliser_follows_msfs_channel_axis(capsys):
    """A ``[C, H, W]`` Sample Factory image normaliser, for an msf env whose images are ``[H, W, C]``."""
    ref = np.load(DATA / "resnet_impala" / "reference.npz")
    hwc = np.ascontiguousarray(ref["obs"].transpose(0, 2, 3, 1))
    _, model, _ = _load(DATA, "resnet_impala", _spaces("resnet_impala", hwc, ref["action_logits"]))
    with torch.no_grad():
        params, values = model(torch.as_tensor(hwc))
    assert np.abs(params.numpy() - ref["action_logits"]).max() <= 1e-5
    assert np.abs(values.numpy() - ref["values"]).max() <= 1e-5


@pytest.mark.parametrize(
    "name, pairs",
    [
        (
            "mlp_separate",
            [
                ("critic_linear.weight", "value_head.weight"),
                ("critic_encoder.encoders.obs.mlp_head.2.bias", "critic_encoder.2.bias"),
                ("action_parameterization.distribution_linear.weight", "action_head.weight"),
            ],
        ),
        (
            "mlp_separate_lstm2",
            [
                ("actor_core.core.weight_hh_l1", "core.weight_hh_l1"),
                ("critic_core.core.weight_ih_l0", "critic_core.weight_ih_l0"),
                ("actor_decoder.mlp.0.weight", "decoder.0.weight"),
                ("critic_decoder.mlp.0.bias", "critic_decoder.0.bias"),
                ("critic_linear.weight", "value_head.weight"),
            ],
        ),
    ],
)
def test_adams_moments_are_carried_over_parameter_by_parameter(name, pairs):
    """Sample Factory's separate-weights model orders its parameters unlike msf's: each moment lands on its own."""
    ref = np.load(DATA / name / "reference.npz")
    cfg, model, _ = _load(DATA, name, _spaces(name, ref["obs"], ref["action_logits"]))
    sf = read_checkpoint(cfg, str(DATA / name))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    optimizer.load_state_dict(as_msf_checkpoint(sf, model, optimizer, resume=True, announce=False)["optimizer"])
    sf_params = [k for k in sf["model"] if not k.startswith(("obs_normalizer.", "returns_normalizer."))]
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(sf_params) and len(optimizer.state) == len(sf["optimizer"]["state"]) == len(names)
    assert names.index("value_head.weight") != sf_params.index("critic_linear.weight")
    for sf_name, msf_name in pairs:
        mine = optimizer.state[dict(model.named_parameters())[msf_name]]
        theirs = sf["optimizer"]["state"][sf_params.index(sf_name)]
        assert torch.equal(mine["exp_avg"], theirs["exp_avg"]) and torch.equal(mine["exp_avg_sq"], theirs["exp_avg_sq"])


def test_the_config_maps_under_msfs_names_and_leaves_out_the_rest(capsys, caplog):
    path = str(DATA / "mlp_gru" / "config.json")
    sf = json.loads(Path(path).read_text())
    d = msf_config_dict(sf, path, Config)
    assert "left out, having no msf counterpart: load_checkpoint_kind" in capsys.readouterr().err + caplog.text
    assert "train_dir" not in d and "experiment" not in d and "command_line" not in d
    # msf-enjoy's own flags (as msf-train and msf-enjoy pass them) come from its command line: not named as missing
    caplog.clear()
    assert msf_config_dict(sf, path, Config, EVALUATION_FLAGS) == d
    assert "load_checkpoint_kind" not in capsys.readouterr().err + caplog.text
    cfg = Config.from_dict(d)
    assert (cfg.use_rnn, cfg.rnn_type, cfg.rnn_size, cfg.encoder_mlp_layers) == (True, "gru", 8, [16])
    assert msf_config_dict({**sf, "normalize_input_keys": ["other"]}, path, Config)["normalize_input"] is False
    assert msf_config_dict(cfg.to_dict(), path, Config) == cfg.to_dict()  # msf's own: as it is


def _enjoy(train_dir: Path, name: str, capsys) -> tuple[int, list[str]]:
    from msf.enjoy import main

    code = main([f"--experiment={name}", f"--train_dir={train_dir}", "--max_num_episodes=1", "--device=cpu"])
    return code, [line for line in capsys.readouterr().err.splitlines() if "error" in line]


def _set(path: Path, **values) -> None:
    d = json.loads(path.read_text())
    d.update(values)
    path.write_text(json.dumps(d, indent=2))


@pytest.mark.parametrize(
    "model, edit, named",
    [
        ("mlp", {"encoder_mlp_layers": [7]}, "has no counterpart in msf's model"),
        ("mlp_separate", {"use_rnn": True}, "has nothing for msf's core.weight_ih_l0"),
        ("mlp", None, "Sample Factory 2.1.1, the version msf reads: it lacks pbt_optimize_gamma"),
        ("mlp", "tensor", "msf's value_head.bias"),
    ],
)
def test_what_cannot_be_mapped_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, model, edit, named):
    folder = _copy(model, tmp_path)
    if edit is None:  # another Sample Factory version: its config has other keys
        d = json.loads((folder / "config.json").read_text())
        del d["pbt_optimize_gamma"]
        (folder / "config.json").write_text(json.dumps(d))
    elif edit == "tensor":
        path = folder / "checkpoint_p0" / "checkpoint_000000010_1280.pth"
        state = torch.load(path, weights_only=True)
        del state["model"]["critic_linear.bias"]
        torch.save(state, path)
    else:
        _set(folder / "config.json", **edit)
    before = _files(folder)
    code, errors = _enjoy(tmp_path, model, capsys)
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith("msf-enjoy: error: --experiment: ") and named in errors[0], errors[0]
    assert _files(folder) == before


def test_msf_train_refuses_before_writing_anything(tmp_path, capsys):
    from msf.train import main

    folder = _copy("mlp", tmp_path)
    path = folder / "checkpoint_p0" / "checkpoint_000000010_1280.pth"
    state = torch.load(path, weights_only=True)
    del state["model"]["encoder.encoders.obs.mlp_head.2.weight"]
    torch.save(state, path)
    before = _files(folder)
    code = main(["--experiment=mlp", f"--train_dir={tmp_path}", "--device=cpu", "--num_workers=1"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 2 and len(errors) == 1 and "msf's actor_encoder.2.weight" in errors[0], errors
    assert _files(folder) == before


def test_msfs_rotation_spares_sample_factorys_checkpoints(tmp_path):
    folder = _copy("mlp", tmp_path)
    spared = sf2_files(str(folder))
    assert {Path(p).name for p in spared} == {"checkpoint_000000010_1280.pth", "best_000000010_1280_reward_123.000.pth"}
    before = _files(folder)
    writer = BackgroundCheckpointWriter(str(folder), keep=1, policy=0, spared=spared)
    for step in (10, 11, 12):  # step 10 has the name of Sample Factory's file: not written
        writer.submit({"train_step": step, "env_steps": 1280 if step == 10 else step * 100, "w": torch.ones(2)})
    writer.submit({"train_step": 12, "env_steps": 1200, "w": torch.ones(2)}, best=150.0)
    writer.close()
    after = _files(folder)
    assert {k: after[k] for k in before} == before
    assert sorted(set(after) - set(before)) == [
        "checkpoint_p0/best_000000012_1200_reward_150.000.pth",
        "checkpoint_p0/checkpoint_000000012_1200.pth",
    ]


def test_an_msf_experiment_is_left_to_msfs_own_paths(tmp_path):
    from msf.persistence.sf2_checkpoint import config_file, config_file_to_write

    (tmp_path / "config.json").write_text(json.dumps(Config().to_dict()))
    assert config_file(str(tmp_path)) == config_file_to_write(str(tmp_path)) == str(tmp_path / "config.json")
    assert sf2_files(str(tmp_path)) == frozenset()  # the writer spares nothing
    state = {"train_step": 1, "env_steps": 2, "policy_version": 1, "msf_version": "0", "model": {}, "path": "x"}
    assert as_msf_checkpoint(state, torch.nn.Linear(1, 1)) is state and as_msf_checkpoint(None, None) is None


def test_msf_export_writes_a_sample_factory_policy(tmp_path):
    """msf-export converts a Sample Factory checkpoint as msf-enjoy does: the exported file gives Sample Factory's
    own action logits for the reference observations."""
    from msf.export import main, run_exported

    folder = _copy("mlp", tmp_path)
    ref = np.load(DATA / "mlp" / "reference.npz")
    assert main(["--experiment=mlp", f"--train_dir={tmp_path}", "--format=torchscript"]) == 0
    path = folder / "export" / "policy_p0.pt"
    desc = json.loads((folder / "export" / "policy_p0.pt.json").read_text())
    assert [i["name"] for i in desc["inputs"]] == ["obs"]
    logits = run_exported("torchscript", str(path), (torch.as_tensor(ref["obs"]),))[0]
    assert np.abs(logits - ref["action_logits"]).max() <= 1e-5


def test_msf_export_writes_a_sample_factory_separate_recurrent_policy(tmp_path):
    """The exported file of Sample Factory's separate-weights LSTM model gives its logits, values and new states
    over the 5 steps with episode ends, its own states fed back (its values in return units: Sample Factory's
    denormalised by its return normaliser)."""
    from msf.export import main, run_exported

    name = "mlp_separate_lstm2"
    folder = _copy(name, tmp_path)
    ref = np.load(DATA / name / "reference.npz")
    cfg, model, _ = _load(tmp_path, name, _spaces(name, ref["obs"], ref["action_logits"]))
    assert model.returns_normalizer is not None
    assert main([f"--experiment={name}", f"--train_dir={tmp_path}", "--format=torchscript"]) == 0
    path = str(folder / "export" / "policy_p0.pt")
    desc = json.loads((folder / "export" / "policy_p0.pt.json").read_text())
    assert [i["name"] for i in desc["inputs"]] == ["obs", "rnn_states"]
    assert desc["inputs"][1]["shape"] == ["batch", 64] and desc["rnn"]["cores"] == 2
    h = _sf_to_msf_states(torch.as_tensor(ref["rnn_states"]), cfg)
    worst = 0.0
    for t in range(ref["seq_dones"].shape[0]):
        logits, values, h = run_exported("torchscript", path, (torch.as_tensor(ref["seq_obs"][t]), h))
        h = torch.as_tensor(h)
        for got, want in [
            (logits, ref["seq_action_logits"][t]),
            (values, model.denormalize_values(torch.as_tensor(ref["seq_values"][t])).numpy()),
            (_msf_to_sf_states(h, cfg).numpy(), ref["seq_new_rnn_states"][t]),
        ]:
            worst = max(worst, float(np.abs(got - want).max()))
        h = h * (1.0 - torch.as_tensor(ref["seq_dones"][t]))[:, None]
    assert worst <= 1e-5, worst
