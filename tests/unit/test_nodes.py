"""Where a process stands in a multi-node job: single node, host list, torchrun, Slurm."""

from __future__ import annotations

import os
import shlex
import stat

import pytest

from msf.cfg.arguments import parse_args
from msf.cfg.validation import ConfigError
from msf.distributed.nodes import NodePlan, discover, validate_node_flags


def _discover(argv, environ=None, scontrol="scontrol"):
    cfg, given = parse_args(argv)
    return discover(cfg, given, environ={} if environ is None else environ, scontrol=scontrol)


def _torchrun_env(rank=5, local_rank=1, world=8, local_world=4, group_rank=1, addr="node-a", port="29400"):
    return {
        "TORCHELASTIC_RUN_ID": "job1",
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(group_rank),
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
    }


def _fake_scontrol(tmp_path, hosts, rc=0):
    """A bash ``scontrol`` that records its arguments and prints ``hosts`` for ``show hostnames X``."""
    log = tmp_path / "scontrol_args"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/bash\n"
        f"printf '%s\\n' \"$@\" > '{log}'\n"
        f"if [ {rc} -ne 0 ]; then echo 'scontrol: error: bad nodelist' >&2; exit {rc}; fi\n"
        'if [ "$1" = show ] && [ "$2" = hostnames ] && [ $# -eq 3 ]; then\n'
        f"  printf '%s\\n' {' '.join(shlex.quote(h) for h in hosts)}\n"
        "  exit 0\n"
        "fi\n"
        "exit 1\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), log


def _slurm_env(nnodes=2, ntasks=2, nodeid=1, procid=1, localid=0, nodelist="gpu[01-02]"):
    return {
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_PROCID": str(procid),
        "SLURM_NNODES": str(nnodes),
        "SLURM_NODEID": str(nodeid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_LOCALID": str(localid),
        "SLURM_JOB_ID": "1234",
        "SLURM_STEP_ID": "0",  # a task of an srun step (an sbatch script has no step id)
    }


# --- single node -------------------------------------------------------------------------------------


def test_single_node_defaults():
    plan = _discover([])
    assert plan == NodePlan(
        source="single",
        launcher="local",
        nnodes=1,
        node_rank=0,
        nproc_per_node=None,
        master_addr="127.0.0.1",
        master_port=0,
        hosts=None,
    )
    assert plan.host_of(3, 2) == "node 1"


def test_single_node_keeps_flags():
    plan = _discover(["--nproc_per_node=3", "--master_port=12345"])
    assert (plan.nproc_per_node, plan.master_port, plan.rank) == (3, 12345, None)


def test_several_nodes_without_hosts_is_an_error():
    with pytest.raises(ConfigError, match=r"^--hosts: required with --nnodes=2 outside torchrun and Slurm"):
        _discover(["--nnodes=2"])


def test_node_rank_must_be_zero_on_a_single_node():
    with pytest.raises(ConfigError, match=r"^--node_rank: must be in \[0, nnodes\) = \[0, 1\), got 1$"):
        _discover(["--node_rank=1"])


@pytest.mark.parametrize(
    "argv, pattern",
    [
        (["--nnodes=0"], r"^--nnodes: must be a positive integer, got 0$"),
        (["--node_rank=-1"], r"^--node_rank: must be in \[0, nnodes\) = \[0, 1\), got -1$"),
        (["--max_restarts=-2"], r"^--max_restarts: must not be negative, got -2$"),
    ],
)
def test_validate_node_flags(argv, pattern):
    cfg, _ = parse_args(argv)
    with pytest.raises(ConfigError, match=pattern):
        validate_node_flags(cfg)
    with pytest.raises(ConfigError, match=pattern):  # discover checks them first
        discover(cfg, set(), environ={})


def test_validate_node_flags_accepts_defaults():
    cfg, _ = parse_args(["--nnodes=3", "--node_rank=2", "--max_restarts=4"])
    assert validate_node_flags(cfg) is None


# --- host list ---------------------------------------------------------------------------------------


def test_host_list_plan():
    plan = _discover(["--nnodes=2", "--node_rank=1", "--hosts=127.0.0.1, localhost"])
    assert plan == NodePlan(
        source="hosts",
        launcher="local",
        nnodes=2,
        node_rank=1,
        nproc_per_node=None,
        master_addr="127.0.0.1",
        master_port=29500,
        hosts=("127.0.0.1", "localhost"),
    )
    assert [plan.host_of(r, 2) for r in range(4)] == ["127.0.0.1", "127.0.0.1", "localhost", "localhost"]


def test_host_list_master_is_the_first_host_and_port_is_kept():
    plan = _discover(["--nnodes=2", "--hosts=localhost,127.0.0.1", "--master_port=4000", "--nproc_per_node=2"])
    assert (plan.master_addr, plan.master_port, plan.node_rank, plan.nproc_per_node) == ("localhost", 4000, 0, 2)


def test_host_list_length_must_match_nnodes():
    with pytest.raises(ConfigError, match=r"^--hosts: lists 3 host\(s\) but --nnodes=2;"):
        _discover(["--nnodes=2", "--hosts=127.0.0.1,localhost,127.0.0.1"])
    with pytest.raises(ConfigError, match=r"^--hosts: lists 2 host\(s\) but --nnodes=1;"):
        _discover(["--hosts=127.0.0.1,localhost"])


def test_host_list_node_rank_out_of_range():
    with pytest.raises(ConfigError, match=r"^--node_rank: must be in \[0, nnodes\) = \[0, 2\), got 2$"):
        _discover(["--nnodes=2", "--node_rank=2", "--hosts=127.0.0.1,localhost"])


@pytest.mark.parametrize("hosts", ["127.0.0.1,,localhost", "127.0.0.1,", ",localhost", "127.0.0.1, ,localhost"])
def test_host_list_empty_entry(hosts):
    with pytest.raises(ConfigError, match=r"^--hosts: must be comma-separated host names .* without empty entries"):
        _discover(["--nnodes=3", f"--hosts={hosts}"])


def test_unresolvable_host_anywhere_in_the_list():
    with pytest.raises(ConfigError, match=r"^--hosts: cannot resolve 'no-such-host\.invalid' ") as e:
        _discover(["--nnodes=2", "--node_rank=0", "--hosts=127.0.0.1,no-such-host.invalid"])
    assert "\n" not in str(e.value)


# --- torchrun ----------------------------------------------------------------------------------------


def test_torchrun_environment():
    plan = _discover([], environ=_torchrun_env())
    assert plan == NodePlan(
        source="torchrun",
        launcher="torchrun",
        nnodes=2,
        node_rank=1,
        nproc_per_node=4,
        master_addr="node-a",
        master_port=29400,
        hosts=None,
        rank=5,
        local_rank=1,
    )


def test_torchrun_wins_over_hosts_and_slurm_and_agreeing_flags_are_fine():
    env = {**_slurm_env(), **_torchrun_env()}
    plan = _discover(["--nnodes=2", "--node_rank=1", "--nproc_per_node=4", "--hosts=a,b"], environ=env)
    assert (plan.source, plan.rank, plan.local_rank, plan.nproc_per_node) == ("torchrun", 5, 1, 4)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--nproc_per_node=2"], "nproc_per_node"),
        (["--nnodes=3"], "nnodes"),
        (["--nnodes=2", "--node_rank=0"], "node_rank"),
        (["--nnodes=2", "--hosts=a,b,c"], "hosts"),
    ],
)
def test_torchrun_disagreeing_flag(argv, flag):
    with pytest.raises(ConfigError, match=rf"^--{flag}: .*torchrun's environment"):
        _discover(argv, environ=_torchrun_env())


def test_torchrun_world_size_must_be_a_multiple_of_local_world_size():
    env = _torchrun_env(rank=5, local_rank=1, world=6, local_world=4)
    with pytest.raises(ConfigError, match=r"^--nproc_per_node: .*WORLD_SIZE=6, not a multiple of LOCAL_WORLD_SIZE=4"):
        _discover([], environ=env)


def test_torchrun_missing_variable():
    env = _torchrun_env()
    del env["LOCAL_WORLD_SIZE"]
    with pytest.raises(ConfigError, match=r"^--nproc_per_node: torchrun's environment does not set LOCAL_WORLD_SIZE$"):
        _discover([], environ=env)


# --- Slurm -------------------------------------------------------------------------------------------


def test_slurm_one_task_per_node(tmp_path):
    scontrol, log = _fake_scontrol(tmp_path, ["gpu01", "gpu02"])
    plan = _discover(["--nproc_per_node=2"], environ=_slurm_env(), scontrol=scontrol)
    assert plan == NodePlan(
        source="slurm",
        launcher="local",
        nnodes=2,
        node_rank=1,
        nproc_per_node=2,
        master_addr="gpu01",
        master_port=29500,
        hosts=("gpu01", "gpu02"),
    )
    assert log.read_text().split("\n")[:3] == ["show", "hostnames", "gpu[01-02]"]
    assert plan.host_of(3, 2) == "gpu02"


def test_slurm_one_task_per_device_group(tmp_path):
    scontrol, log = _fake_scontrol(tmp_path, ["gpu01", "gpu02"])
    env = _slurm_env(ntasks=8, nodeid=1, procid=6, localid=2)
    env["SLURM_NNODES"] = "2"
    plan = _discover(["--master_port=31000"], environ=env, scontrol=scontrol)
    assert plan == NodePlan(
        source="slurm",
        launcher="slurm_task",
        nnodes=2,
        node_rank=1,
        nproc_per_node=4,
        master_addr="gpu01",
        master_port=31000,
        hosts=("gpu01", "gpu02"),
        rank=6,
        local_rank=2,
    )
    assert log.read_text().split("\n")[2] == "gpu[01-02]"


def test_slurm_fallback_variables(tmp_path):
    scontrol, _ = _fake_scontrol(tmp_path, ["n1", "n2", "n3"])
    env = _slurm_env(nodeid=2, procid=2)
    del env["SLURM_NNODES"], env["SLURM_NTASKS"]
    env.update(SLURM_JOB_NUM_NODES="3", SLURM_STEP_NUM_TASKS="3")
    plan = _discover([], environ=env, scontrol=scontrol)
    assert (plan.nnodes, plan.node_rank, plan.launcher, plan.hosts) == (3, 2, "local", ("n1", "n2", "n3"))


def test_slurm_single_task_allocation_is_the_single_node_case(tmp_path):
    scontrol, log = _fake_scontrol(tmp_path, ["gpu01"])
    env = _slurm_env(nnodes=1, ntasks=1, nodeid=0, procid=0)
    plan = _discover([], environ=env, scontrol=scontrol)
    assert (plan.source, plan.launcher, plan.nnodes, plan.master_addr, plan.master_port) == (
        "single",
        "local",
        1,
        "127.0.0.1",
        0,
    )
    assert not log.exists()  # no need to expand a one-node list


def _sbatch_env(nnodes=1, ntasks=None):
    """The environment of an sbatch script as Slurm 22.05 sets it: no step variables, and SLURM_NTASKS only
    when -n was given."""
    env = _slurm_env(nnodes=nnodes, nodeid=0, procid=0)
    del env["SLURM_STEP_ID"], env["SLURM_NTASKS"]
    env["SLURM_JOB_NUM_NODES"] = str(nnodes)
    if ntasks is not None:
        env["SLURM_NTASKS"] = str(ntasks)
    return env


@pytest.mark.parametrize("ntasks", [None, 1, 2])
def test_an_sbatch_script_is_one_process_on_a_single_node(tmp_path, ntasks):
    # without -n the script has no SLURM_NTASKS; with -n 2 it is still one process, and taken for rank 0 of two
    # it would wait for a rank 1 that srun never started
    scontrol, log = _fake_scontrol(tmp_path, ["gpu01"])
    plan = _discover(["--nproc_per_node=2"], environ=_sbatch_env(ntasks=ntasks), scontrol=scontrol)
    assert (plan.source, plan.launcher, plan.nnodes, plan.nproc_per_node, plan.rank) == (
        "single",
        "local",
        1,
        2,
        None,
    )
    assert not log.exists()


def test_an_sbatch_script_over_several_nodes_asks_for_srun(tmp_path):
    scontrol, _ = _fake_scontrol(tmp_path, ["gpu01", "gpu02"])
    env = _sbatch_env(nnodes=2, ntasks=2)
    with pytest.raises(
        ConfigError,
        match=r"^--nnodes: this is the batch script of Slurm job 1234 over SLURM_JOB_NUM_NODES=2 nodes, .*"
        r"srun --ntasks-per-node=1 msf-train",
    ):
        _discover([], environ=env, scontrol=scontrol)
    assert _discover(["--nnodes=1"], environ=env, scontrol=scontrol).source == "single"


def test_a_step_on_part_of_the_allocation_uses_the_step_variables(tmp_path):
    scontrol, log = _fake_scontrol(tmp_path, ["gpu02", "gpu03"])
    env = _slurm_env(nnodes=4, ntasks=4, nodeid=1, procid=1, nodelist="gpu[01-04]")
    env.update(SLURM_STEP_NUM_NODES="2", SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NODELIST="gpu[02-03]")
    plan = _discover([], environ=env, scontrol=scontrol)
    assert (plan.nnodes, plan.node_rank, plan.launcher, plan.master_addr) == (2, 1, "local", "gpu02")
    assert log.read_text().split("\n")[2] == "gpu[02-03]"


@pytest.mark.parametrize("ntasks", [3, 1, 5])
def test_slurm_bad_task_count(tmp_path, ntasks):
    scontrol, _ = _fake_scontrol(tmp_path, ["gpu01", "gpu02"])
    env = _slurm_env(ntasks=ntasks, procid=0, nodeid=0)
    with pytest.raises(
        ConfigError,
        match=rf"^--nproc_per_node: Slurm runs SLURM_NTASKS={ntasks} task\(s\) on "
        r"SLURM_NNODES=2 node\(s\); valid layouts: one task per node .* "
        r"one task per device group",
    ):
        _discover([], environ=env, scontrol=scontrol)


def test_slurm_tasks_not_in_block_order(tmp_path):
    scontrol, _ = _fake_scontrol(tmp_path, ["gpu01", "gpu02"])
    env = _slurm_env(ntasks=4, nodeid=0, procid=1, localid=0)  # cyclic distribution
    with pytest.raises(ConfigError, match=r"^--nproc_per_node: .*--distribution=block"):
        _discover([], environ=env, scontrol=scontrol)


def test_slurm_disagreeing_nproc_per_node(tmp_path):
    scontrol, _ = _fake_scontrol(tmp_path, ["gpu01", "gpu02"])
    env = _slurm_env(ntasks=4, nodeid=1, procid=3, localid=1)
    with pytest.raises(ConfigError, match=r"^--nproc_per_node: 4 disagrees with Slurm .* = 2\)"):
        _discover(["--nproc_per_node=4"], environ=env, scontrol=scontrol)
    assert _discover(["--nproc_per_node=2"], environ=env, scontrol=scontrol).rank == 3


def test_slurm_disagreeing_nnodes(tmp_path):
    scontrol, _ = _fake_scontrol(tmp_path, ["gpu01", "gpu02"])
    with pytest.raises(ConfigError, match=r"^--nnodes: 3 disagrees with Slurm"):
        _discover(["--nnodes=3"], environ=_slurm_env(), scontrol=scontrol)


def test_slurm_host_count_must_match_nnodes(tmp_path):
    scontrol, _ = _fake_scontrol(tmp_path, ["gpu01", "gpu02", "gpu03"])
    with pytest.raises(ConfigError, match=r"^--nnodes: .* gives 3 host\(s\) but SLURM_NNODES=2"):
        _discover([], environ=_slurm_env(), scontrol=scontrol)


def test_slurm_scontrol_missing(tmp_path):
    missing = str(tmp_path / "no-scontrol")
    with pytest.raises(
        ConfigError,
        match=r"^--hosts: cannot expand SLURM_JOB_NODELIST='gpu\[01-02\]': .*not found "
        r"\(ran '.*no-scontrol show hostnames gpu\[01-02\]'\)",
    ):
        _discover([], environ=_slurm_env(), scontrol=missing)


def test_slurm_scontrol_failing(tmp_path):
    scontrol, _ = _fake_scontrol(tmp_path, ["gpu01"], rc=3)
    with pytest.raises(
        ConfigError,
        match=r"^--hosts: cannot expand SLURM_JOB_NODELIST='gpu\[01-02\]': "
        r"'.*scontrol show hostnames gpu\[01-02\]' exited with 3 "
        r"\(scontrol: error: bad nodelist\)",
    ) as e:
        _discover([], environ=_slurm_env(), scontrol=scontrol)
    assert "\n" not in str(e.value)


def test_explicit_hosts_win_over_slurm(tmp_path):
    scontrol, log = _fake_scontrol(tmp_path, ["gpu01", "gpu02"])
    plan = _discover(
        ["--nnodes=2", "--node_rank=1", "--hosts=127.0.0.1,localhost"], environ=_slurm_env(), scontrol=scontrol
    )
    assert (plan.source, plan.master_addr) == ("hosts", "127.0.0.1")
    assert not log.exists()


def test_default_environ_is_os_environ(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("SLURM_", "TORCHELASTIC_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    for k, v in _torchrun_env().items():
        monkeypatch.setenv(k, v)
    cfg, given = parse_args([])
    assert discover(cfg, given).rank == 5
