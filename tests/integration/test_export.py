"""``msf-export``: the ONNX (run by onnxruntime) and TorchScript files give the torch policy's outputs, recurrent
state included, at any batch size; the command line end to end on an experiment saved by msf's own functions; bad
input is one line, exit code 2, and nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch

from msf.cfg.config import Config, Derived
from msf.envs.registry import EnvSpaces, env_config_of, env_spaces
from msf.export import ExportFailed, description_path, export_policy, main
from msf.learning.learner import Learner
from msf.model.actor_critic import ActorCritic
from msf.persistence.checkpoint import save_checkpoint, snapshot
from msf.persistence.train_state import TrainState
from msf.runner.experiment import prepare_experiment_dir

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated")

N = 100  # observations compared per check
TOL = 1e-5

CASES = {
    # CartPole-like: 4 floats, 2 actions, the MLP encoder
    "mlp": (Config(encoder_mlp_layers=[64, 64]), EnvSpaces((4,), np.float32, True, 2)),
    # Atari frames as msf's atari_* envs give them: a stack of 4 84x84 grayscale uint8 frames
    "convnet_atari": (
        Config(encoder_conv_architecture="convnet_atari", encoder_conv_mlp_layers=[128]),
        EnvSpaces((4, 84, 84), np.uint8, True, 6),
    ),
    "gru": (Config(encoder_mlp_layers=[32], use_rnn=True, rnn_size=16), EnvSpaces((4,), np.float32, True, 3)),
    # a two-layer LSTM and a Gaussian action head with a learned state-independent log standard deviation
    "lstm_gaussian": (
        Config(
            encoder_mlp_layers=[32], use_rnn=True, rnn_type="lstm", rnn_num_layers=2, rnn_size=8, adaptive_stddev=False
        ),
        EnvSpaces((5,), np.float32, False, 2),
    ),
    # separate actor and critic: an encoder, a GRU and a decoder each; the state is the actor's, then the critic's
    "gru_separate": (
        Config(
            encoder_mlp_layers=[32],
            use_rnn=True,
            rnn_size=8,
            decoder_mlp_layers=[16],
            actor_critic_share_weights=False,
        ),
        EnvSpaces((4,), np.float32, True, 3),
    ),
    # a Gaussian head whose log standard deviations depend on the state (Sample Factory's default), after a decoder
    "mlp_adaptive_gaussian": (
        Config(encoder_mlp_layers=[32], decoder_mlp_layers=[16], adaptive_stddev=True),
        EnvSpaces((3,), np.float32, False, 2),
    ),
}


def _observations(spaces: EnvSpaces, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if spaces.obs_dtype == np.uint8:
        # a fixed background with a few moving bright pixels, as a game screen
        base = torch.arange(84, dtype=torch.float32).view(1, 1, 1, 84).expand(n, *spaces.obs_shape) * 2
        noise = (torch.rand(n, *spaces.obs_shape, generator=g) < 0.02) * 80.0
        return (base + noise).clamp(0, 255).to(torch.uint8)
    return torch.randn(n, *spaces.obs_shape, generator=g) * 3 + 1


def _trained_like(name: str) -> ActorCritic:
    """A model of ``CASES[name]`` with normaliser statistics and action logits of a trained one (random init
    alone gives near-zero logits and identity normalisers, which would hide a missing part)."""
    torch.manual_seed(0)
    cfg, spaces = CASES[name]
    model = ActorCritic(cfg, spaces)
    model.update_obs_statistics(_observations(spaces, 256, seed=10))
    # returns of scale 1 to 10: the tolerance is absolute, and float32 rounding grows with the values
    model.returns_normalizer.update(torch.randn(500, dtype=torch.float64) * 1.5 + 7)
    with torch.no_grad():
        model.action_head.weight.normal_(0, 0.5)
        if model.log_std is not None:
            model.log_std.copy_(torch.tensor([-0.5, 0.3]))
    return model.eval()


def _reference(model: ActorCritic, obs: torch.Tensor, states: torch.Tensor | None) -> list[np.ndarray]:
    """The torch policy's outputs, in the exported order (from the model's own methods, not the export's
    wrapper)."""
    with torch.no_grad():
        params, values, new_states = model.forward_with_states(obs, states)
        if model.continuous:
            mean, std = model.gaussian(params)  # the distribution msf samples from: Normal(mean, std)
            out = [mean, std.log()]
        else:
            out = [params]
        out.append(model.denormalize_values(values))
        if new_states is not None:
            out.append(new_states)
    return [t.detach().numpy() for t in out]


def _runner(fmt: str, path: str):
    """A function from the exported inputs (numpy arrays, in order) to its outputs (in order)."""
    if fmt == "onnx":
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda *xs: session.run(None, dict(zip(names, xs)))
    module = torch.jit.load(path)

    def run(*xs):
        with torch.no_grad():
            return [t.numpy() for t in module(*(torch.from_numpy(x) for x in xs))]

    return run


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("name", list(CASES))
def test_exported_file_gives_the_policy_outputs(name, fmt, tmp_path):
    model = _trained_like(name)
    path = str(tmp_path / f"policy.{'onnx' if fmt == 'onnx' else 'pt'}")
    desc = export_policy(model, fmt, path)
    run = _runner(fmt, path)
    recurrent = model.core is not None
    in_names = ["obs", "rnn_states"] if recurrent else ["obs"]
    out_names = (["action_mean", "action_log_std"] if model.continuous else ["action_logits"]) + ["value"]
    out_names += ["new_rnn_states"] if recurrent else []
    assert [s["name"] for s in desc["inputs"]] == in_names
    assert [s["name"] for s in desc["outputs"]] == out_names
    assert desc["inputs"][0]["shape"] == ["batch", *model.spaces.obs_shape]
    assert desc["inputs"][0]["dtype"] == ("uint8" if name == "convnet_atari" else "float32")
    assert json.loads(open(description_path(path)).read()) == desc
    if recurrent:
        cores = 1 if model.critic_core is None else 2
        assert desc["inputs"][1]["shape"] == desc["outputs"][-1]["shape"] == ["batch", cores * model.core_state_size]
        assert desc["rnn"]["cores"] == cores and desc["rnn"]["state_size"] == model.rnn_state_size

    states = torch.randn(N, model.rnn_state_size) * 0.5 if recurrent else None
    # several steps, each state fed back (the file's own to the file, the policy's to the policy); batch sizes
    # other than the 2 traced
    steps = 4 if recurrent else 1
    file_states = states.numpy() if recurrent else None
    for t in range(steps):
        obs = _observations(model.spaces, N, seed=t)
        ref = _reference(model, obs, states)
        got = run(obs.numpy(), file_states) if recurrent else run(obs.numpy())
        assert len(got) == len(ref) == len(out_names)
        for out, g, r in zip(out_names, got, ref):
            assert g.shape == r.shape, out
            assert np.abs(g - r).max() <= TOL, (out, t, np.abs(g - r).max())
        if name == "lstm_gaussian":  # the learned log standard deviation, the same in every row
            np.testing.assert_allclose(got[1], np.broadcast_to([-0.5, 0.3], (N, 2)), atol=TOL)
        if name == "mlp_adaptive_gaussian":  # the head's, one per state
            assert got[1].std(0).min() > 1e-2
        if recurrent:
            assert np.abs(ref[-1] - states.numpy()).max() > 1e-2  # the state moves: the core is in the graph
            states, file_states = torch.from_numpy(ref[-1]), got[-1]
    # one env at a time works too
    obs, states = obs[:1], states[:1] if recurrent else None
    got = run(obs.numpy(), states.numpy()) if recurrent else run(obs.numpy())
    for g, r in zip(got, _reference(model, obs, states)):
        assert g.shape == r.shape and np.abs(g - r).max() <= TOL


def test_onnx_graph_has_a_symbolic_batch_dimension(tmp_path):
    model = _trained_like("convnet_atari")
    path = str(tmp_path / "p.onnx")
    export_policy(model, "onnx", path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (obs,) = session.get_inputs()
    assert (obs.name, obs.shape, obs.type) == ("obs", ["batch", 4, 84, 84], "tensor(uint8)")
    assert [(o.name, o.shape) for o in session.get_outputs()] == [
        ("action_logits", ["batch", 6]),
        ("value", ["batch"]),
    ]
    meta = json.loads(session.get_modelmeta().custom_metadata_map["msf"])
    assert meta["outputs"][0]["name"] == "action_logits" and meta["format"] == "onnx"


def test_a_file_that_fails_its_check_is_not_written(tmp_path, monkeypatch):
    import msf.export

    real = msf.export.run_exported
    monkeypatch.setattr(msf.export, "run_exported", lambda *a: [x + 1e-3 for x in real(*a)])
    with pytest.raises(
        ExportFailed, match=r"the exported file's action_logits differs from the policy's by up to 0.001"
    ):
        export_policy(_trained_like("mlp"), "onnx", str(tmp_path / "export" / "p.onnx"))
    assert os.listdir(tmp_path) == []  # neither the file, nor its description, nor the folder made for them


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """``train_dir/cart``: a CartPole-v1 experiment with a GRU core, its config.json and one checkpoint written
    by msf's own functions (the learner's state as TrainState.capture gives it, saved by save_checkpoint).
    Returns ``(train_dir, model)``."""
    train_dir = tmp_path_factory.mktemp("train_dir")
    cfg = Config(
        env="CartPole-v1",
        experiment="cart",
        train_dir=str(train_dir),
        encoder_mlp_layers=[32],
        use_rnn=True,
        rnn_size=16,
    )
    exp_dir = prepare_experiment_dir(cfg)
    spaces = env_spaces(cfg.env, env_config_of(cfg))
    torch.manual_seed(0)
    learner = Learner(cfg, Derived.of(cfg), spaces)
    learner.model.update_obs_statistics(torch.randn(300, 4) * torch.tensor([1.0, 2.0, 0.1, 1.5]))
    learner.model.returns_normalizer.update(torch.randn(300, dtype=torch.float64) * 5 + 20)
    state = TrainState.fresh(1, cfg.stats_avg)
    state.env_steps = 2048
    save_checkpoint(snapshot(state.capture(0, learner, cfg.to_dict(), 1)), exp_dir, keep=cfg.keep_checkpoints)
    return str(train_dir), learner.model.eval()


def test_command_line_end_to_end(experiment, capsys):
    train_dir, model = experiment
    assert main(["--experiment=cart", f"--train_dir={train_dir}"]) == 0
    out = capsys.readouterr().out
    path = os.path.join(train_dir, "cart", "export", "policy_p0.onnx")
    assert f"wrote {path} (onnx, opset 17)" in out
    for line in ("obs", "rnn_states", "action_logits", "value", "new_rnn_states"):
        assert line in out
    assert "[batch, 16]  float32" in out
    desc = json.load(open(os.path.join(train_dir, "cart", "export", "policy_p0.onnx.json")))
    assert (desc["env"], desc["env_steps"], desc["policy_index"], desc["rnn"]["type"]) == (
        "CartPole-v1",
        2048,
        0,
        "gru",
    )
    assert desc["checkpoint"].endswith("checkpoint_p0/checkpoint_000000000_2048.pth")
    obs, states = torch.randn(N, 4), torch.randn(N, 16)
    got = _runner("onnx", path)(obs.numpy(), states.numpy())
    for g, r in zip(got, _reference(model, obs, states)):
        assert np.abs(g - r).max() <= TOL

    ts = os.path.join(train_dir, "elsewhere", "cart.pt")
    assert main(["--experiment=cart", f"--train_dir={train_dir}", "--format=torchscript", f"--output={ts}"]) == 0
    assert os.path.exists(ts) and os.path.exists(os.path.join(train_dir, "elsewhere", "cart.pt.json"))
    # the files have the mode open() gives (0o666 less the umask), as checkpoints do, not a temporary file's 0600
    umask = os.umask(0)
    os.umask(umask)
    for f in (path, path + ".json", ts, ts + ".json"):
        assert os.stat(f).st_mode & 0o777 == 0o666 & ~umask, f
    got = _runner("torchscript", ts)(obs.numpy(), states.numpy())
    for g, r in zip(got, _reference(model, obs, states)):
        assert np.abs(g - r).max() <= TOL


def _files(root: str) -> set[str]:
    return {os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs} | {d for d, _, _ in os.walk(root)}


@pytest.mark.parametrize(
    "case, expected",
    [
        ("unknown_experiment", "msf-export: error: --experiment: no experiment 'nope' in --train_dir="),
        ("no_checkpoint", "msf-export: error: --experiment: 'fresh' has no checkpoint yet"),
        ("policy_index", "msf-export: error: --policy_index: must be in [0, 1)"),
        ("unknown_format", "msf-export: error: argument --format: invalid choice: 'tflite' (choose from 'onnx', "),
        (
            "no_onnxruntime",
            "msf-export: error: --format=onnx needs onnxruntime: pip install 'multi-sample-factory[export]'",
        ),
        ("output_folder", "msf-export: error: --output: "),
    ],
    ids=lambda v: v if not v.startswith("msf-export") else "",
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, expected, experiment, capsys, monkeypatch):
    train_dir, _ = experiment
    if case == "no_checkpoint" and not os.path.isdir(os.path.join(train_dir, "fresh")):
        prepare_experiment_dir(Config(env="CartPole-v1", experiment="fresh", train_dir=train_dir))
    if case == "no_onnxruntime":
        monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    argv = {
        "unknown_experiment": ["--experiment=nope"],
        "no_checkpoint": ["--experiment=fresh"],
        "policy_index": ["--experiment=cart", "--policy_index=1"],
        "unknown_format": ["--experiment=cart", "--format=tflite"],
        "no_onnxruntime": ["--experiment=cart"],
        "output_folder": ["--experiment=cart", f"--output={train_dir}/cart"],
    }[case] + [f"--train_dir={train_dir}"]
    before = _files(train_dir)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith(expected), err
    if case == "unknown_experiment":
        assert "experiments there: cart" in err  # what would be valid
    assert _files(train_dir) == before


def test_the_installed_command_answers_bad_input_with_exit_2(tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "msf-export")  # pyproject's [project.scripts]
    if not os.path.exists(command):
        pytest.skip(f"no {command}: pip install -e . installs the entry point")
    run = subprocess.run(
        [command, "--experiment=none", f"--train_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"msf-export: error: --experiment: no experiment 'none' in --train_dir='{tmp_path}' (no "
        f"{tmp_path}/none/config.json); there is none there yet (msf-train makes one)"
    ]
    assert os.listdir(tmp_path) == []
