"""``msf-export``: write an experiment's trained policy to one ONNX or TorchScript file, for inference without msf.

Usage: ``msf-export --experiment=NAME [--train_dir=DIR] [--format=onnx|torchscript] [--policy_index=0]
[--output=PATH]`` (also ``python -m msf.export``); what it writes where, and its exit codes: :data:`DESCRIPTION`.

It reads the saved config and checkpoint with ``msf-enjoy``'s functions, rebuilds the model with the env's spaces
(made once, as ``msf-train`` reads them) and traces the whole forward pass; the graph's inputs and outputs, for any
batch of ``N`` envs: :class:`ExportedPolicy` and :func:`policy_io`. The description (names, shapes with the batch
dimension ``"batch"``, dtypes, meaning, the action space and the core) goes beside the file and inside it (ONNX
metadata ``msf``; TorchScript extra file ``msf.json``). Before the files are put in place, the exported graph is
run (by onnxruntime, or ``torch.jit.load``) on sample inputs and its outputs compared with the torch policy's:
exit code 1 when they differ or torch cannot trace the model; after an error nothing is written.

ONNX files come from torch's TorchScript-based exporter (``torch.onnx.export(dynamo=False)``, opset
:data:`ONNX_OPSET`, ``dynamic_axes`` on the batch dimension) and need the ``export`` extra (onnx and onnxruntime);
TorchScript files come from ``torch.jit.trace`` and need nothing more.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from msf.cfg.arguments import DefaultsOnceHelpFormatter, OneLineErrorParser, integer
from msf.cfg.config import Config
from msf.cfg.validation import ConfigError

if TYPE_CHECKING:  # imported in load_policy: --help and invalid flags answer before the model and gymnasium load
    from msf.model.actor_critic import ActorCritic

DESCRIPTION = """Write the trained policy of TRAIN_DIR/EXPERIMENT (the latest checkpoint of checkpoint_p<i>/) to one
ONNX or TorchScript file: observation normaliser(s), encoder, recurrent core (its state an explicit input and
output) and the action and value heads, with a dynamic batch dimension. Default file:
TRAIN_DIR/EXPERIMENT/export/policy_p<i>.onnx (.pt for torchscript); a description of its inputs and outputs goes
beside it as policy_p<i>.onnx.json. --format=onnx needs pip install 'multi-sample-factory[export]'. Exit codes: 0
written, 1 the export failed, 2 invalid flags, no experiment or no checkpoint, or a missing extra."""

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
"""``--format`` and the file extension of its default output."""
ONNX_OPSET = 17
"""The ONNX opset of exported files (onnxruntime 1.17 and later run it)."""
BATCH = "batch"
"""The name of the dynamic batch dimension in the descriptions (and in the ONNX graph)."""
CHECK_ROWS = 16
"""Sample inputs the exported file is checked on before it is put in place."""
TRACE_ROWS = 2
"""The batch size traced (any other runs too: the dimension is dynamic)."""


class ExportFailed(RuntimeError):
    """The model could not be traced, or the exported file does not reproduce the policy's outputs."""


class ExportedPolicy(nn.Module):
    """The policy as a pure function of tensors, what is traced: ``obs`` ``[N, *obs_shape]`` (and
    ``rnn_states`` ``[N, rnn_state_size]`` with a core) to the tuple of :func:`policy_io`'s outputs, in order:
    ``action_logits`` ``[N, A]`` or ``action_mean``, ``action_log_std`` ``[N, A]`` (the Gaussian's parameters as
    :meth:`~msf.model.ActorCritic.gaussian` gives them, the deviation's log); ``value`` ``[N]`` in return
    units; ``new_rnn_states`` ``[N, rnn_state_size]`` with a core.

    Args:
        model: the actor-critic (its eval mode is the caller's business; msf's has no dropout or batch norm).
    """

    def __init__(self, model: ActorCritic):
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor, rnn_states: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        params, values, new_states = self.model.forward_with_states(obs, rnn_states)
        if self.model.continuous:
            mean, std = self.model.gaussian(params)
            outs = [mean, std.log()]
        else:
            outs = [params]
        outs.append(self.model.denormalize_values(values))
        if new_states is not None:
            outs.append(new_states)
        return tuple(outs)


def _spec(name: str, shape: tuple, dtype: str, doc: str) -> dict:
    return {"name": name, "shape": [BATCH, *[int(d) for d in shape]], "dtype": dtype, "doc": doc}


def policy_io(model: ActorCritic) -> tuple[list[dict], list[dict]]:
    """The inputs and outputs of the exported graph of ``model`` (an :class:`~msf.model.ActorCritic`), in
    order: per tensor ``{"name", "shape", "dtype", "doc"}``, the shape's first entry the string ``"batch"``."""
    spaces = model.spaces
    image = np.dtype(spaces.obs_dtype) == np.uint8
    if spaces.obs_layout is not None:
        keys = ", ".join(f"{key} {list(shape)}" for key, shape, _ in spaces.obs_layout)
        obs_doc = f"the Dict observation flattened by gymnasium's FlattenObservation (in order: {keys})"
    elif image:
        obs_doc = "uint8 images as the env gives them (scaled, and normalised with normalize_input, inside)"
    else:
        obs_doc = "observations as the env gives them (normalised inside with normalize_input)"
    inputs = [_spec("obs", spaces.obs_shape, "uint8" if image else "float32", obs_doc)]
    S = model.rnn_state_size
    if model.core is not None:
        L, H = model.rnn_layers, model.rnn_size
        layout = f"{L} layer(s) x {H}" if model.rnn_type == "gru" else f"h ({L} layer(s) x {H}) then c (same)"
        whose = f"the {model.rnn_type.upper()} core's state, {layout}"
        if model.critic_core is not None:
            whose = f"the actor's {model.rnn_type.upper()} core's state ({layout}), then the critic's core's (same)"
        inputs.append(_spec("rnn_states", (S,), "float32", f"{whose}; zeros at an episode start"))
    A = spaces.num_actions
    if not model.continuous:
        doc = "logits of the categorical over actions (argmax: the most likely action)"
        if spaces.action_nvec is not None:
            doc = f"logits of independent categoricals, concatenated: split them by {list(spaces.action_nvec)}"
        if model.mask_slice is not None:
            doc += "; actions the action_mask observation forbids have -1e9"
        outputs = [_spec("action_logits", (A,), "float32", doc)]
    else:
        squash = f", squashed to {model.tanh_scale} tanh(mean / {model.tanh_scale})" if model.tanh_scale > 0 else ""
        per = "for each state (adaptive_stddev)" if model.adaptive_stddev else "learned, independent of the state"
        outputs = [
            _spec("action_mean", (A,), "float32", f"mean of the Gaussian action (the most likely action){squash}"),
            _spec(
                "action_log_std",
                (A,),
                "float32",
                f"log standard deviation of the Gaussian, {per}, clamped to [ln 1e-4, ln 1e4]; msf clips a sampled "
                "action to the env's bounds",
            ),
        ]
    outputs.append(_spec("value", (), "float32", "value estimate, return of rewards x --reward_scale, unnormalised"))
    if model.core is not None:
        cores = "the cores' states" if model.critic_core is not None else "the core's state"
        outputs.append(
            _spec("new_rnn_states", (S,), "float32", f"{cores} after this step (as rnn_states), for the next")
        )
    return inputs, outputs


def sample_inputs(model: ActorCritic, n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """``n`` random inputs of :func:`policy_io`'s shapes and dtypes: pixels uniform in ``[0, 255]``, else
    standard normal; states standard normal."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, *model.spaces.obs_shape)
    if np.dtype(model.spaces.obs_dtype) == np.uint8:
        obs = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    else:
        obs = torch.randn(shape, generator=g)
    if model.core is None:
        return (obs,)
    return obs, torch.randn(n, model.rnn_state_size, generator=g)


def _quietly(fn):
    """``fn()`` without torch's warnings: the deprecation notices of the TorchScript-based ONNX exporter and of
    ``torch.jit``, and the tracer's about Python booleans (from the shape checks inside ``nn.GRU`` and ``nn.LSTM``,
    constants whatever the batch size). The exported file is checked against the policy instead."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def _write_onnx(policy: ExportedPolicy, example: tuple, path: str, names: tuple[list, list], meta: str) -> None:
    import onnx

    inputs, outputs = names
    with torch.no_grad():
        _quietly(
            lambda: torch.onnx.export(
                policy,
                example,
                path,
                dynamo=False,
                input_names=inputs,
                output_names=outputs,
                dynamic_axes={name: {0: BATCH} for name in inputs + outputs},
                opset_version=ONNX_OPSET,
            )
        )
    proto = onnx.load(path)
    proto.producer_name = "msf-export"
    entry = proto.metadata_props.add()
    entry.key, entry.value = "msf", meta
    onnx.checker.check_model(proto)
    onnx.save(proto, path)


def _write_torchscript(policy: ExportedPolicy, example: tuple, path: str, meta: str) -> None:
    with torch.no_grad():
        traced = _quietly(lambda: torch.jit.trace(policy, example, check_trace=False))
    _quietly(lambda: torch.jit.save(traced, path, _extra_files={"msf.json": meta}))


def run_exported(fmt: str, path: str, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    """Run the exported file ``path`` of ``fmt`` on ``inputs`` (in :func:`policy_io`'s order) as its users
    would: onnxruntime's CPU provider, or ``torch.jit.load``. Returns the outputs, in order, as numpy arrays."""
    if fmt == "onnx":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1  # a check of a few rows: no thread pool to start
        session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
        return list(session.run(None, feeds))
    module = _quietly(lambda: torch.jit.load(path, map_location="cpu"))
    with torch.no_grad():
        return [t.detach().numpy() for t in module(*inputs)]


def require_format(fmt: str) -> None:
    """Raises:
    ConfigError: ``fmt`` is unknown, or its packages are missing (naming the pip extra)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format: unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    if fmt == "onnx":
        missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(
                f"--format=onnx needs {' and '.join(missing)}: pip install 'multi-sample-factory[export]' "
                "(or use --format=torchscript)"
            )


def description_path(path: str) -> str:
    """Where the JSON description of the exported file ``path`` goes: beside it, its name and ``.json`` (an ONNX
    and a TorchScript export of one policy keep a description each)."""
    return path + ".json"


def _actions_and_core(model: ActorCritic) -> dict:
    """The description's ``actions`` (type, count, ``nvec``) and ``rnn`` (None without a core) of ``model``."""
    nvec = model.spaces.action_nvec
    kind = "continuous" if model.continuous else "discrete" if nvec is None else "multi_discrete"
    actions = {"type": kind, "num_actions": model.spaces.num_actions, "nvec": list(nvec) if nvec is not None else None}
    if model.core is None:
        return {"actions": actions, "rnn": None}
    rnn = {"type": model.rnn_type, "num_layers": model.rnn_layers, "size": model.rnn_size}
    # cores 2: the actor's state, then the critic's
    rnn.update(cores=1 if model.critic_core is None else 2, state_size=model.rnn_state_size)
    return {"actions": actions, "rnn": rnn}


def export_policy(model: ActorCritic, fmt: str, path: str, source: dict | None = None) -> dict:
    """Trace ``model`` (an :class:`~msf.model.ActorCritic`) into ``path`` as ``fmt`` (``onnx`` or
    ``torchscript``), check the file against the model on :data:`CHECK_ROWS` sample inputs, and write its
    description (returned) beside it (:func:`description_path`). Both files are written under temporary names
    and renamed into place only once the check passed; the folder is created if need be.

    Args:
        model: the actor-critic, on the CPU; put in eval mode for the export and back as it was.
        source: what is recorded about where the policy came from (experiment, checkpoint, env steps...).

    Returns:
        the description: ``format``, ``file``, ``inputs`` and ``outputs`` (see :func:`policy_io`), ``actions``,
        ``rnn`` (None without a core), ``opset`` (ONNX), ``check`` (rows and the largest absolute difference
        per output), and ``source``'s entries.

    Raises:
        ConfigError: an unknown format or its missing packages.
        ExportFailed: torch could not trace the model, or the file does not reproduce the model's outputs.
    """
    require_format(fmt)
    inputs, outputs = policy_io(model)
    desc = {
        "format": fmt,
        "file": os.path.abspath(path),
        "inputs": inputs,
        "outputs": outputs,
        **_actions_and_core(model),
        **({"opset": ONNX_OPSET} if fmt == "onnx" else {}),
        **(source or {}),
    }
    names = ([s["name"] for s in inputs], [s["name"] for s in outputs])
    folder = os.path.dirname(os.path.abspath(path))
    made_folder = not os.path.isdir(folder)
    os.makedirs(folder, exist_ok=True)
    from msf.persistence.summaries import file_mode, write_json_atomic

    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-export-", suffix=FORMATS[fmt])
    os.fchmod(fd, file_mode())  # as open() would make it (and the checkpoints are), not mkstemp's 0600
    os.close(fd)
    was_training = model.training
    model.eval()
    try:
        policy = ExportedPolicy(model)
        example = sample_inputs(model, TRACE_ROWS, seed=1)
        meta = json.dumps({k: v for k, v in desc.items() if k != "file"}, sort_keys=True)
        try:
            if fmt == "onnx":
                _write_onnx(policy, example, tmp, names, meta)
            else:
                _write_torchscript(policy, example, tmp, meta)
        except Exception as e:  # noqa: BLE001 - whatever torch or onnx raise: one line, the file is not written
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ExportFailed(f"torch could not export the model as {fmt} ({type(e).__name__}: {first})") from e
        desc["check"] = _check(fmt, tmp, policy, names[1])
        os.replace(tmp, path)
    finally:
        model.train(was_training)
        if os.path.exists(tmp):
            os.unlink(tmp)
            if made_folder and not os.listdir(folder):  # a failed export leaves no empty folder either
                os.rmdir(folder)
    write_json_atomic(description_path(path), desc)
    return desc


def _check(fmt: str, path: str, policy: ExportedPolicy, names: list[str]) -> dict:
    """Run the file at ``path`` and the policy on the same sample inputs.

    Raises:
        ExportFailed: an output differs by more than ``1e-4 + 1e-4 x |expected|``, or has another shape.
    """
    inputs = sample_inputs(policy.model, CHECK_ROWS, seed=2)
    with torch.no_grad():
        expected = [t.detach().numpy() for t in policy(*inputs)]
    try:
        got = run_exported(fmt, path, inputs)
    except Exception as e:  # noqa: BLE001 - the runtime's own errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportFailed(f"the exported {fmt} file does not run ({type(e).__name__}: {first})") from e
    diffs = {}
    for name, g, x in zip(names, got, expected):
        if g.shape != x.shape:
            raise ExportFailed(f"the exported file's {name} has shape {list(g.shape)}, the policy's {list(x.shape)}")
        diffs[name] = float(np.abs(g - x).max()) if x.size else 0.0
        if not np.allclose(g, x, rtol=1e-4, atol=1e-4):
            raise ExportFailed(
                f"the exported file's {name} differs from the policy's by up to {diffs[name]:.3g} on {CHECK_ROWS} "
                "sample inputs"
            )
    return {"rows": CHECK_ROWS, "max_abs_diff": diffs}


def _experiments_in(train_dir: str) -> list[str]:
    """The experiment folders (with a ``config.json``) of ``train_dir``, sorted."""
    try:
        names = os.listdir(train_dir)
    except OSError:
        return []
    return sorted(n for n in names if os.path.isfile(os.path.join(train_dir, n, "config.json")))


def load_policy(train_dir: str, experiment: str, policy_index: int = 0) -> tuple[ActorCritic, Config, dict]:
    """The trained model of ``train_dir/experiment`` (its saved config, the latest readable checkpoint of
    ``checkpoint_p{policy_index}/``), rebuilt with the env's spaces as ``msf-train`` reads them, in eval mode on
    the CPU.

    Returns:
        ``(model, config, checkpoint)``: the checkpoint's dict (``path``, ``env_steps``, ``policy_version``...).

    Raises:
        ConfigError: no such experiment folder or no ``config.json`` (naming those there), no checkpoint of the
            policy (naming the policies with one), the index out of range, the env cannot be made, or the
            checkpoint does not fit the model.
    """
    from msf.enjoy import _load_config, load_model, read_checkpoint
    from msf.envs.device_env import device_env_entry, device_env_spaces
    from msf.envs.registry import env_config_of, env_spaces
    from msf.model.actor_critic import ActorCritic
    from msf.persistence.checkpoint import checkpoint_dir, list_checkpoints

    exp_dir = os.path.join(train_dir, experiment)
    if not os.path.isdir(train_dir):
        raise ConfigError(f"--train_dir: no folder {train_dir!r}; give the --train_dir that msf-train wrote to")
    if not os.path.isfile(os.path.join(exp_dir, "config.json")):
        there = _experiments_in(train_dir)
        raise ConfigError(
            f"--experiment: no experiment {experiment!r} in --train_dir={train_dir!r} (no {exp_dir}/config.json); "
            + (f"experiments there: {', '.join(there)}" if there else "there is none there yet (msf-train makes one)")
        )
    cfg = _load_config(Config(train_dir=train_dir, experiment=experiment), {"train_dir", "experiment"})
    if 0 <= policy_index < cfg.num_policies and not list_checkpoints(exp_dir, policy_index):
        have = [str(p) for p in range(cfg.num_policies) if list_checkpoints(exp_dir, p)]
        if have:
            raise ConfigError(
                f"--policy_index: no checkpoint in {checkpoint_dir(exp_dir, policy_index)}; policies of "
                f"{experiment!r} with one: {', '.join(have)}"
            )
        raise ConfigError(
            f"--experiment: {experiment!r} has no checkpoint yet (no checkpoint_*.pth in "
            f"{checkpoint_dir(exp_dir, policy_index)}): msf-train writes them while it trains"
        )
    state = read_checkpoint(cfg, exp_dir, policy_index, prog="msf-export", flag="experiment")
    device_env = device_env_entry(cfg.env)  # its registered spaces; no env made
    model = ActorCritic(cfg, device_env_spaces(device_env) if device_env else env_spaces(cfg.env, env_config_of(cfg)))
    state = load_model(model, state)  # a Sample Factory 2.1.1 checkpoint, converted (others as they are)
    return model.eval(), cfg, state


def describe(desc: dict) -> list[str]:
    """The lines ``msf-export`` prints about an exported file: one per input and output."""
    rows = [("input", s) for s in desc["inputs"]] + [("output", s) for s in desc["outputs"]]
    width = max(len(s["name"]) for _, s in rows)
    shapes = {s["name"]: "[" + ", ".join(str(d) for d in s["shape"]) + "]" for _, s in rows}
    swidth = max(len(v) for v in shapes.values())
    return [f"  {kind:<6} {s['name']:<{width}}  {shapes[s['name']]:<{swidth}}  {s['dtype']}" for kind, s in rows]


def build_export_parser() -> argparse.ArgumentParser:
    """The parser of ``msf-export`` (one-line errors, exit code 2)."""
    parser = OneLineErrorParser(
        prog="msf-export", description=DESCRIPTION, formatter_class=DefaultsOnceHelpFormatter, allow_abbrev=False
    )
    parser.add_argument(
        "--experiment", required=True, default=argparse.SUPPRESS, help="The experiment to export: TRAIN_DIR/EXPERIMENT"
    )
    parser.add_argument("--train_dir", default=Config.train_dir, help="Root folder of all experiments")
    parser.add_argument(
        "--format",
        default="onnx",
        choices=tuple(FORMATS),
        help="onnx (needs the export extra; run it with onnxruntime) or torchscript (torch.jit.load)",
    )
    parser.add_argument(
        "--policy_index",
        type=integer,
        default=0,
        help="Which policy of a --num_policies run to export (its checkpoint_p{i}/), in [0, num_policies)",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="The file to write (the default is TRAIN_DIR/EXPERIMENT/export/policy_p{i}.onnx, or .pt); its "
        "description goes beside it, as PATH.json",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, load, export, describe; return the exit code."""
    args = build_export_parser().parse_args(sys.argv[1:] if argv is None else argv)
    exp_dir = os.path.join(args.train_dir, args.experiment)
    path = args.output or os.path.join(exp_dir, "export", f"policy_p{args.policy_index}{FORMATS[args.format]}")
    try:
        require_format(args.format)
        if os.path.isdir(path):
            example = os.path.join(path, "policy" + FORMATS[args.format])
            raise ConfigError(f"--output: {path} is a folder; give a file name, such as {example}")
        model, cfg, state = load_policy(args.train_dir, args.experiment, args.policy_index)
        source = {
            "experiment": args.experiment,
            "env": cfg.env,
            "checkpoint": os.path.abspath(state["path"]),
            "env_steps": state.get("env_steps"),
            "policy_index": args.policy_index,
            "policy_version": state.get("policy_version"),
        }
        desc = export_policy(model, args.format, path, source)
    except ConfigError as e:
        for line in e.problems:
            print(f"msf-export: error: {line}", file=sys.stderr)
        return 2
    except ExportFailed as e:
        print(f"msf-export: error: {e}; nothing was written", file=sys.stderr)
        return 1
    opset = f", opset {desc['opset']}" if args.format == "onnx" else ""
    print(
        f"msf-export: wrote {path} ({args.format}{opset}) from {state['path']} (env steps {state.get('env_steps')}, "
        f"policy version {state.get('policy_version')})"
    )
    print("\n".join(describe(desc)))
    worst = max(desc["check"]["max_abs_diff"].values())
    print(
        f"description: {description_path(path)} (checked on {desc['check']['rows']} sample inputs against the torch "
        f"policy: max abs diff {worst:.2g})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
