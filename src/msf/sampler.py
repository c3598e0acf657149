"""``msf-sampler``: a sampler node that joins a running ``msf-train --sampler_port=PORT`` job and feeds its learner.

Usage: ``msf-sampler --connect=HOST:PORT --num_workers=N --num_envs_per_worker=M --sampler_key_file=FILE``
(also ``python -m msf.sampler``).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading

DESCRIPTION = """A sampler node: rollout and inference workers on this machine's CPUs that step the environments of a
running msf-train job (started with --sampler_port) with a copy of its newest policy, and send it every finished
trajectory. Everything that shapes a trajectory (env, its flags, model, rollout) comes from the job; this command sets
only where the job is and how many workers and envs run here. Every message is signed with the job's key
(HMAC-SHA256): give the file the job wrote (TRAIN_DIR/EXPERIMENT/sampler.key) or the one it was given
(--sampler_key_file). Start it before, during or after the job; stop it at any time (Ctrl-C: it says goodbye and
exits 0). Exit codes: 0 the job ended (done or stopped) or this node was stopped, 1 the job failed or was lost (nothing
heard for --connect_timeout seconds) or a worker failed, 2 bad input or refused by the job (another msf version, env or
model)."""

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


def parse(argv: list[str] | None) -> argparse.Namespace:
    from msf.cfg.arguments import OneLineErrorParser, integer

    p = OneLineErrorParser(prog="msf-sampler", description=DESCRIPTION, formatter_class=argparse.HelpFormatter)
    p.add_argument("--connect", required=True, metavar="HOST:PORT", help="The job's sampler port (--sampler_port)")
    p.add_argument(
        "--num_workers",
        type=integer,
        default=os.cpu_count() or 1,
        metavar="N",
        help="Rollout worker processes here (default: the cores of this machine)",
    )
    p.add_argument(
        "--num_envs_per_worker",
        type=integer,
        default=2,
        metavar="M",
        help="Environments stepped by each rollout worker (default: 2)",
    )
    p.add_argument(
        "--sampler_key_file",
        default=None,
        metavar="FILE",
        help="Required: the file holding the job's key (the job's TRAIN_DIR/EXPERIMENT/sampler.key, or the file "
        "given to msf-train --sampler_key_file); the job drops every message not signed with it",
    )
    p.add_argument(
        "--connect_timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="Seconds to wait for the job to answer, at the start and whenever it goes silent, before exiting 1 "
        "(default: 60)",
    )
    p.add_argument(
        "--env",
        default=None,
        metavar="ENV",
        help="The env this node expects; the job refuses the node if it trains another one",
    )
    return p.parse_args(argv)


def resolve(address: str) -> str:
    """``tcp://IP:PORT`` of ``HOST:PORT``.

    Raises:
        ValueError: one line naming ``--connect`` and what is wrong with it.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--connect={address}: expected HOST:PORT (the job's --sampler_port)")
    try:
        ip = socket.getaddrinfo(host.strip("[]"), int(port), socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError as e:
        raise ValueError(f"--connect={address}: cannot resolve {host!r}: {e.strerror or e}") from None
    return f"tcp://{ip}:{port}"


def main(argv: list[str] | None = None) -> int:
    """Parse, check, join and sample; return the exit code (see :data:`DESCRIPTION`)."""
    args = parse(argv)
    from msf.cfg.validation import ConfigError
    from msf.persistence.summaries import setup_logging
    from msf.runner.sampler_node import JobLink, JobLost, NodeSettings, Refused, SamplerNode
    from msf.runtime.reaping import ChildDied
    from msf.runtime.semaphore_records import remove_dead_runs_semaphores
    from msf.runtime.signals import Signals
    from msf.sampling.protocol import ComponentFailed
    from msf.sampling.wire import read_key

    def error(line: str, code: int) -> int:
        print(f"msf-sampler: error: {line}", file=sys.stderr)
        return code

    for name in ("num_workers", "num_envs_per_worker"):
        if getattr(args, name) < 1:
            return error(f"--{name}: must be a positive integer, got {getattr(args, name)}", EXIT_REFUSED)
    if args.connect_timeout <= 0:
        return error(f"--connect_timeout: must be positive, got {args.connect_timeout}", EXIT_REFUSED)
    if not args.sampler_key_file:
        return error(
            "--sampler_key_file: required: the job's key, the file msf-train wrote as TRAIN_DIR/EXPERIMENT/sampler.key "
            "or the one it was given with --sampler_key_file (the job drops every message not signed with it)",
            EXIT_REFUSED,
        )
    try:
        endpoint = resolve(args.connect)
    except ValueError as e:
        return error(str(e), EXIT_REFUSED)
    try:
        key = read_key(args.sampler_key_file)
    except (OSError, ValueError) as e:
        return error(f"--sampler_key_file: {e}", EXIT_REFUSED)
    setup_logging(None)
    remove_dead_runs_semaphores()  # those of a run or node of this machine that was killed (kill -9)
    stop = threading.Event()
    signals = Signals(lambda signum: stop.set()).install()
    link = JobLink(args.connect, endpoint, key, args.connect_timeout)
    node = SamplerNode(link, NodeSettings(args.num_workers, args.num_envs_per_worker, args.env), stop)
    reason = "stopped"
    try:
        reason = node.run()
    except KeyboardInterrupt:
        reason = "stopped"
    except (Refused, ConfigError) as e:  # ConfigError: the job's env (or --env) cannot be made here
        reason = "refused"
        return error(str(e), EXIT_REFUSED)
    except JobLost as e:
        reason = "lost"
        return error(str(e), EXIT_FAILED)
    except (ComponentFailed, ChildDied) as e:
        reason = "failed"
        return error(f"a worker failed: {str(e).strip().splitlines()[-1]}", EXIT_FAILED)
    finally:
        node.close(reason)
        signals.restore()
    ending = "stopped here (Ctrl-C or SIGTERM)" if stop.is_set() else f"the job ended ({reason})"
    logging.getLogger("msf").info(
        "sampler node: %s; %d trajectories sent (%d bytes) of %d sampled",
        ending,
        node.sent_trajectories,
        node.bytes_sent,
        node.sampled,
    )
    return EXIT_FAILED if reason == "failed" else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
