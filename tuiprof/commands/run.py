"""`tuiprof run [--] CMD...`: run a training command with tuiprof's telemetry.

Sets, for CMD and everything it starts (torchrun workers, srun tasks):
- LD_PRELOAD: libtuiprof_hook.so first, what was there kept after it
  (times cuBLAS / cuBLASLt GEMMs);
- NCCL_PROFILER_PLUGIN: the same library (NCCL's profiler plugin API, v1 to
  v6); a plugin the user named there (NCCL's Inspector, Google's CoMMA) moves
  to TUIPROF_NCCL_CHAINED_PLUGIN and the hook chains to it (it gets every
  event it asks for); NCCL_PROFILER_PLUGIN=none stays (no plugin: the hook
  counts collectives at NCCL's API);
- KINETO_USE_DAEMON=1 and KINETO_IPC_SOCKET_DIR (unless KINETO_USE_DAEMON is
  set): PyTorch polls an agent for on-demand traces over file sockets in your
  own Kineto folder (0700, yours: no other user can find or reach the job's
  socket there): the one a root agentd prepares for you, else the one your
  tuiprof console serves while it runs ($XDG_RUNTIME_DIR/tuiprof/kineto or
  /tmp/tuiprof-<uid>/kineto; one line says so). Without either,
  KINETO_USE_DAEMON is left unset (libkineto's default abstract socket takes
  any datagram from any local user, who can then make the job write a trace
  where they ask, or abort it), and one line says what to start first;
- KINETO_ONDEMAND_TRACE_DIR (unless set): the trace dir of the agent that
  serves the job's Kineto folder (newer Kineto writes on-demand traces only
  under /tmp or that dir).
  Both are asked of the agent with --token-file/--tls-ca (or $TUIPROF_TOKEN);
  left unset, silently, when no agent listens, and with one line saying why
  when the port belongs to another user's process or a folder is one that
  others can change;
- PYTHONPATH: tuiprof's startup hook first (steps, GC pauses, DataLoader waits);
- TUIPROF_GEMM_SAMPLE_EVERY, with --gemm-sample-every N: the hook times every
  call of a GEMM shape up to its 32nd, then one call in N (1 times every call)
  instead of one in a period chosen per shape from its kernel time (16 to 1024:
  timing costs at most 0.05 % of the shape's GPU time); every call is counted
  either way;
- TUIPROF_TIME_FUNCTIONS, with --time-functions NAMES: the Python functions
  to time in each rank (count, total and longest time), in xpu-timer's syntax
  (module@function, module@Class@function, __main__@function for the entry
  file) or dotted (module:Class.function), separated by commas; xpu-timer's
  own XPU_TIMER_HOST_TRACING_FUNC is read too. xpu-timer's built-in list
  (DataLoader batches, CUDA syncs and waits, backward, Megatron's forward and
  backward steps) is timed as well unless --no-default-functions
  (TUIPROF_TIME_FUNCTIONS_DEFAULTS=0);
- TUIPROF_NCCL_FALLBACK=1, with --nccl-fallback: where NCCL does not take the
  profiler plugin (NCCL < 2.27, or another plugin), time each collective with
  CUDA events on its stream (from its turn on the stream to its end, not
  kernel time) instead of only counting it;
then replaces itself with CMD (exec), so signals and the exit status are CMD's.
Before that it starts a detached watcher (``tuiprof_native.stale_segments``) that
removes the job's segments in /dev/shm once CMD ended, however it ended (Ctrl-C
and SIGKILL run no exit handler), after the grace a running agent needs to
report the exit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import grpc

import tuiprof_native
from agentd.address import DEFAULT_AGENT_PORT
from tuiprof.client.channel import ConnectionOptions
from agentd.kineto.console_folder import ConsoleFolderError, NoConsoleError
from tuiprof.client.local import LocalAgentFolders, UntrustedAgentError, console_agent_folders, local_agent_folders
from tuiprof.client.targets import add_credential_arguments, connection
from tuiprof.errors import BadInputError, TuiprofError

PACKAGES_DIR = Path(tuiprof_native.__file__).resolve().parent.parent  # where tuiprof_native is imported from
HOOK_LIBRARY = Path(tuiprof_native.__file__).resolve().parent / "libtuiprof_hook.so"
STARTUP_DIR = Path(tuiprof_native.__file__).resolve().parent / "startup"
TRACE_DIR_ENV = "KINETO_ONDEMAND_TRACE_DIR"
DAEMON_ENV = "KINETO_USE_DAEMON"
SOCKET_DIR_ENV = "KINETO_IPC_SOCKET_DIR"
SAMPLE_EVERY_ENV = "TUIPROF_GEMM_SAMPLE_EVERY"
SAMPLE_EVERY_MAX = 1_000_000  # TP_GEMM_SAMPLE_EVERY_MAX in the hook
NCCL_FALLBACK_ENV = "TUIPROF_NCCL_FALLBACK"
CHAINED_PLUGIN_ENV = "TUIPROF_NCCL_CHAINED_PLUGIN"  # read by the hook (tuiprof_native/hook/nccl_chain.c)
TIME_FUNCTIONS_ENV = "TUIPROF_TIME_FUNCTIONS"  # read by tuiprof_native/startup/tuiprof_functions.py
DEFAULT_FUNCTIONS_ENV = "TUIPROF_TIME_FUNCTIONS_DEFAULTS"
AGENT_LOOKUP_TIMEOUT_S = 2.0


class LaunchError(TuiprofError):
    """`tuiprof run` cannot start the command (the message says why and what to do)."""


class CommandNotRunError(TuiprofError):
    """CMD itself could not be executed (not found, not executable)."""

    exit_code = 127  # what a shell exits with for a command it cannot run


def _prepend(value: str, existing: str | None, sep: str) -> str:
    """``value`` first, then the entries of ``existing`` (minus duplicates of it).

    For LD_PRELOAD, ld.so accepts spaces as separators too, so they are split on."""
    text = existing or ""
    if sep == ":":
        text = text.replace(" ", ":")
    return sep.join([value] + [p for p in text.split(sep) if p and p != value])


def launch_environment(env: Mapping[str, str], kineto_daemon: bool = True, kineto_socket_dir: str | None = None,
                       library: Path = HOOK_LIBRARY, trace_dir: str | None = None,
                       gemm_sample_every: int | None = None, nccl_fallback: bool = False,
                       time_functions: str | None = None, default_functions: bool = True) -> dict[str, str]:
    """The environment CMD runs in: ``env`` plus tuiprof's variables.

    ``kineto_socket_dir`` is the caller's own Kineto folder from the local agent:
    only with it (and ``kineto_daemon``) are KINETO_USE_DAEMON and
    KINETO_IPC_SOCKET_DIR set; a KINETO_USE_DAEMON the user set stands, with
    whatever KINETO_IPC_SOCKET_DIR they set (or none).
    ``trace_dir`` is the local agent's trace dir, where Kineto may then write
    on-demand traces; a KINETO_ONDEMAND_TRACE_DIR the user set stands.
    ``gemm_sample_every`` (given) replaces any TUIPROF_GEMM_SAMPLE_EVERY;
    ``nccl_fallback`` sets TUIPROF_NCCL_FALLBACK=1 (one the user set stands otherwise).
    ``time_functions`` (given) replaces any TUIPROF_TIME_FUNCTIONS; without ``default_functions``
    TUIPROF_TIME_FUNCTIONS_DEFAULTS=0 turns xpu-timer's built-in list off."""
    if not library.is_file():
        raise LaunchError(
            f"{library} is missing: the compiled parts of tuiprof were not built; "
            "run `pip install -e .` (or `python setup.py build_ext --inplace`) in the tuiprof checkout")
    out = dict(env)
    lib = str(library)
    out["LD_PRELOAD"] = _prepend(lib, env.get("LD_PRELOAD"), ":")
    plugin = env.get("NCCL_PROFILER_PLUGIN")
    if plugin and plugin.lower() == "none":  # NCCL's word for no profiler plugin
        print("tuiprof run: keeping NCCL_PROFILER_PLUGIN=none; NCCL collectives will be counted at its API, "
              "not timed", file=sys.stderr)
    else:
        if plugin and plugin != lib:
            out[CHAINED_PLUGIN_ENV] = plugin
            print(f"tuiprof run: NCCL gets tuiprof's profiler plugin, which chains to NCCL_PROFILER_PLUGIN={plugin} "
                  "(passes it NCCL's events)", file=sys.stderr)
        out["NCCL_PROFILER_PLUGIN"] = lib
    if kineto_daemon:
        if kineto_socket_dir and DAEMON_ENV not in env:  # an explicit choice of the user stands
            out[DAEMON_ENV] = "1"
            out[SOCKET_DIR_ENV] = kineto_socket_dir
        if trace_dir:
            out.setdefault(TRACE_DIR_ENV, trace_dir)
    out["PYTHONPATH"] = _prepend(str(STARTUP_DIR), env.get("PYTHONPATH"), os.pathsep)
    out["TUIPROF_HOOK_LIBRARY"] = lib
    if gemm_sample_every is not None:
        out[SAMPLE_EVERY_ENV] = str(gemm_sample_every)
    if nccl_fallback:
        out[NCCL_FALLBACK_ENV] = "1"
    if time_functions is not None:
        out[TIME_FUNCTIONS_ENV] = time_functions
    if not default_functions:
        out[DEFAULT_FUNCTIONS_ENV] = "0"
    return out


def sample_period(text: str) -> int:
    """--gemm-sample-every: a whole number from 1 to SAMPLE_EVERY_MAX."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= SAMPLE_EVERY_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {SAMPLE_EVERY_MAX}")
    return value


def agent_folders(port: int, options: ConnectionOptions = ConnectionOptions(timeout=AGENT_LOOKUP_TIMEOUT_S)
                  ) -> tuple[LocalAgentFolders | None, str]:
    """The trace dir and Kineto folder of the agentd on this host (GetInfo on 127.0.0.1:``port``), or None
    and why no agent is usable: "" when none listens (a normal set-up), else an agent that answers with
    an error (a token is needed, say) or whose answer cannot be trusted (another user's process on the
    port). Never fails the launch."""
    try:
        return local_agent_folders(port, options), ""
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return None, ""
        return None, f"agentd on port {port} did not give its folders ({exc.code().name}: {exc.details()})"
    except UntrustedAgentError as exc:
        return None, str(exc)


def kineto_through_console(port: int, agent: LocalAgentFolders | None, agent_problem: str
                           ) -> LocalAgentFolders | None:
    """Where no agent offers you a Kineto folder: the folders of your console (its Kineto folder and its
    trace dir) when one of yours serves your console folder, in one line; otherwise ``agent`` and one
    line saying why traces are off and what to start first. (Root's console serves the host-wide name,
    which jobs under `tuiprof run` never poll: root is told to start agentd.)"""
    if agent_problem:
        why = [agent_problem]
    elif agent is None:
        why = [f"no agentd answers on port {port}"]
    else:
        why = [f"agentd on port {port} offers you no Kineto folder ({agent.kineto_problem})"]
    start = "start agentd first"
    if os.geteuid() != 0:
        try:
            console = console_agent_folders()
        except NoConsoleError:
            why.append("no tuiprof console of yours is running")
        except ConsoleFolderError as exc:
            why.append(f"your console folder cannot be used ({exc})")
        else:
            if agent_problem:
                print(f"tuiprof run: {agent_problem}: its folders are not used", file=sys.stderr)
            print(f"tuiprof run: on-demand traces of this job go through your tuiprof console (Kineto folder "
                  f"{console.kineto_socket_dir}) while one of yours runs", file=sys.stderr)
            return console
        start = "start `tuiprof` (your console) before the job, or have root run agentd"
    not_set = DAEMON_ENV if agent is not None else f"{TRACE_DIR_ENV} and {DAEMON_ENV}"
    print(f"tuiprof run: on-demand traces of this job are off: {', and '.join(why)} (for them, {start}); "
          f"{not_set} not set", file=sys.stderr)
    return agent


def report_unusable(folders: LocalAgentFolders, env: Mapping[str, str]) -> None:
    """One line when the trace dir the agent offered cannot be used."""
    if folders.trace_dir_problem and TRACE_DIR_ENV not in env:
        print(f"tuiprof run: {folders.trace_dir_problem}; {TRACE_DIR_ENV} not set", file=sys.stderr)


def start_segment_watcher() -> None:
    """The watcher that removes this process's (CMD's, after the exec) segments and those of its job once
    it ended: started detached (its own session, from /, stdio on /dev/null, not CMD's child), in the
    environment tuiprof run was given (no hook). Without it the segments stay until an agent removes
    them: one line says so."""
    try:
        pidfd = os.pidfd_open(os.getpid())
    except OSError as exc:
        print(f"tuiprof run: cannot watch for the job's end (pidfd_open: {exc.strerror}): its segments stay "
              "in /dev/shm after it unless an agent runs", file=sys.stderr)
        return
    env = dict(os.environ, PYTHONPATH=_prepend(str(PACKAGES_DIR), os.environ.get("PYTHONPATH"), os.pathsep))
    try:
        subprocess.run([sys.executable, "-m", "tuiprof_native.stale_segments", str(pidfd)], pass_fds=(pidfd,),
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       start_new_session=True, cwd="/", env=env, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"tuiprof run: cannot start the watcher that removes the job's segments ({exc}): they stay in "
              "/dev/shm after it unless an agent runs", file=sys.stderr)
    finally:
        os.close(pidfd)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a training command with per-rank GEMM/NCCL telemetry",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--no-kineto-daemon", dest="kineto_daemon", action="store_false",
        help="do not look for a Kineto folder (the agent's or your console's) nor set KINETO_USE_DAEMON (no "
             "on-demand traces of this job)")
    parser.add_argument(
        "--agent-port", type=int, default=DEFAULT_AGENT_PORT, metavar="PORT",
        help=f"port of this host's agentd, asked for its trace dir (default {DEFAULT_AGENT_PORT})")
    parser.add_argument(
        "--gemm-sample-every", type=sample_period, metavar="N",
        help="time every call of a GEMM shape up to its 32nd, then one in N (1: every call); default: one in "
             "16 to 1024 per shape, chosen from its kernel time so that timing costs at most 0.05 %% of it; "
             "all calls are counted")
    parser.add_argument(
        "--nccl-fallback", action="store_true",
        help="where NCCL does not take the profiler plugin (NCCL older than 2.27), time collectives with CUDA "
             "events on their stream (from their turn on the stream to their end, not kernel time); without it "
             "they are only counted")
    parser.add_argument(
        "--time-functions", metavar="NAMES",
        help="Python functions to time in each rank, comma-separated: module@function, module@Class@function, "
             "__main__@function (the entry file) or module:Class.function (as XPU_TIMER_HOST_TRACING_FUNC, which "
             "is read too)")
    parser.add_argument(
        "--no-default-functions", dest="default_functions", action="store_false",
        help="do not time xpu-timer's built-in list (DataLoader batches, CUDA syncs and waits, backward, "
             "Megatron's forward and backward steps)")
    add_credential_arguments(parser)
    # not "command": that is where the command line keeps which tuiprof command runs (``tuiprof run``)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its arguments")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise BadInputError("no command given; usage: tuiprof run [--] CMD [ARGS...]")
    folders = None
    if args.kineto_daemon:
        folders, agent_problem = agent_folders(args.agent_port, connection(args, timeout=AGENT_LOOKUP_TIMEOUT_S))
        if DAEMON_ENV in os.environ:  # the user's own choice of Kineto's daemon stands
            if agent_problem:
                print(f"tuiprof run: {agent_problem}; {TRACE_DIR_ENV} not set", file=sys.stderr)
        elif folders is None or folders.kineto_socket_dir is None:
            folders = kineto_through_console(args.agent_port, folders, agent_problem)
        if folders is not None:
            report_unusable(folders, os.environ)
    env = launch_environment(os.environ, kineto_daemon=args.kineto_daemon,
                             kineto_socket_dir=folders.kineto_socket_dir if folders else None,
                             trace_dir=folders.trace_dir if folders else None,
                             gemm_sample_every=args.gemm_sample_every, nccl_fallback=args.nccl_fallback,
                             time_functions=args.time_functions, default_functions=args.default_functions)
    start_segment_watcher()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        raise CommandNotRunError(f"cannot run {command[0]!r}: {exc.strerror}") from exc
    return 0  # not reached: exec replaced this process
