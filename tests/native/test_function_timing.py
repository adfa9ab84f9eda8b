"""Named Python functions timed with no code change: real PyTorch CPU jobs under `tuiprof run` (the
wrapper path of Python 3.11), the counts against the job's own, the agent's reading of what the job
publishes, torch.profiler's Python tracing alongside, a bad name; and sys.monitoring on Python 3.12
where an interpreter is at hand."""

from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from agentd.collectors.rank_functions import FUNCTIONS_SUFFIX
from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from native.support import segment_path, tuiprof_run
from tuiprof.commands.run import launch_environment

STARTUP = pathlib.Path(__file__).parents[2] / "tuiprof_native" / "startup"
sys.path.insert(0, str(STARTUP))
import tuiprof_functions  # noqa: E402  (a top-level module in the job's Python)

TRAIN = textwrap.dedent("""
    import json, os, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Trainer:
        def __init__(self):
            torch.manual_seed(0)
            self.model = torch.nn.Linear(8, 2)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

        def train_step(self, x, y):
            self.opt.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.opt.step()
            return loss.item()

    def log_metrics(step, loss):
        time.sleep(0.002)

    own = {"train_step": [0, 0], "log_metrics": [0, 0]}
    trainer = Trainer()
    data = DataLoader(TensorDataset(torch.randn(40, 8), torch.randn(40, 2)), batch_size=4)
    step = 0
    for epoch in range(2):
        for x, y in data:
            start = time.perf_counter_ns()
            loss = trainer.train_step(x, y)
            own["train_step"][0] += 1
            own["train_step"][1] += time.perf_counter_ns() - start
            start = time.perf_counter_ns()
            log_metrics(step, loss)
            own["log_metrics"][0] += 1
            own["log_metrics"][1] += time.perf_counter_ns() - start
            step += 1
    time.sleep(1.6)  # the timings are published once a second
    print(json.dumps({"pid": os.getpid(), "own": own}))
""")


def test_names_in_both_syntaxes_from_each_source():
    targets, problems = tuiprof_functions.names_from_environment({
        tuiprof_functions.NAMES_ENV: "__main__@Trainer@train_step, torch.nn.functional:mse_loss,,x@1y,plain",
        tuiprof_functions.XPU_TIMER_ENV: "__main__@log_metrics,__main__:Trainer.train_step",
        tuiprof_functions.DEFAULTS_ENV: "0"})
    assert [t.name for t in targets] == ["__main__:Trainer.train_step", "torch.nn.functional:mse_loss",
                                         "__main__:log_metrics"]  # one spelling of a function is enough
    assert problems == [
        "TUIPROF_TIME_FUNCTIONS: cannot time 'x@1y': not a Python name; name a function as module@function, "
        "module@Class@function or module:Class.function; the other functions are timed",
        "TUIPROF_TIME_FUNCTIONS: cannot time 'plain': no module given; name a function as module@function, "
        "module@Class@function or module:Class.function; the other functions are timed"]
    defaults, _ = tuiprof_functions.names_from_environment({})
    assert [t.name for t in defaults][:2] == ["torch.utils.data.dataloader:_BaseDataLoaderIter.__next__",
                                              "torch:cuda.synchronize"]
    assert not any(t.named_by_user for t in defaults)
    many, problems = tuiprof_functions.names_from_environment({tuiprof_functions.NAMES_ENV: ",".join(
        f"m@f{i}" for i in range(70)), tuiprof_functions.DEFAULTS_ENV: "0"})
    assert len(many) == tuiprof_functions.MAX_FUNCTIONS and problems == [
        "at most 64 functions are timed; not timed: m:f64, m:f65, m:f66, m:f67, m:f68, m:f69"]


def test_tuiprof_run_options_become_the_job_environment():
    env = launch_environment({"TUIPROF_TIME_FUNCTIONS": "old@f", "XPU_TIMER_HOST_TRACING_FUNC": "m@g"},
                             kineto_daemon=False, time_functions="__main__@step", default_functions=False)
    assert (env["TUIPROF_TIME_FUNCTIONS"], env["TUIPROF_TIME_FUNCTIONS_DEFAULTS"]) == ("__main__@step", "0")
    assert env["XPU_TIMER_HOST_TRACING_FUNC"] == "m@g"  # xpu-timer's variable is the job's to keep
    untouched = launch_environment({"TUIPROF_TIME_FUNCTIONS": "old@f"}, kineto_daemon=False)
    assert untouched["TUIPROF_TIME_FUNCTIONS"] == "old@f" and "TUIPROF_TIME_FUNCTIONS_DEFAULTS" not in untouched


def test_a_torch_job_times_its_named_functions_exactly_and_the_agent_reads_them(tmp_path, cleanup_segments):
    names = ("__main__@Trainer@train_step,torch.nn.functional:mse_loss,never_imported_module@f,"
             "torch@nn@functional@no_such_function,not a name")
    proc = tuiprof_run(sys.executable, "-c", TRAIN, options=("--time-functions", names), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env={"XPU_TIMER_HOST_TRACING_FUNC": "__main__@log_metrics"})
    cleanup_segments.append(proc.pid)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    own = json.loads(out)["own"]
    problems = [line for line in err.splitlines() if line.startswith("tuiprof:")]
    assert problems == [  # one line per bad name; a module never imported is not one
        "tuiprof: TUIPROF_TIME_FUNCTIONS: cannot time 'not a name': no module given; name a function as "
        "module@function, module@Class@function or module:Class.function; the other functions are timed",
        "tuiprof: cannot time torch:nn.functional.no_such_function: torch.nn.functional has no attribute "
        "'no_such_function'; the other functions are timed"]
    source = segment_path(proc.pid)
    for suffix in ("", FUNCTIONS_SUFFIX):  # the job has exited: the agent reads copies in a folder of its own
        shutil.copy(f"{source}{suffix}", tmp_path / f"{source.name}{suffix}")
    collector = RanksCollector(0.1, directory=str(tmp_path), exited_keep_seconds=60)
    try:
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
    finally:
        collector.close()
    (rank,) = snapshot.ranks
    timed = {f.name: f for f in rank.functions}
    steps = own["train_step"][0]
    assert steps == 20
    calls = {name: f.calls_total for name, f in timed.items() if f.calls_total}
    assert calls == {"__main__:Trainer.train_step": steps, "__main__:log_metrics": steps,
                     "torch.nn.functional:mse_loss": steps, "torch:autograd.backward": steps,
                     "torch.utils.data.dataloader:_BaseDataLoaderIter.__next__": 2 * (10 + 1)}  # + StopIteration
    for name, key in (("__main__:Trainer.train_step", "train_step"), ("__main__:log_metrics", "log_metrics")):
        own_s = own[key][1] * 1e-9
        assert 0.9 * own_s - 0.002 <= timed[name].seconds_total <= own_s, (name, timed[name].seconds_total, own_s)
        assert 0 < timed[name].max_seconds <= timed[name].seconds_total
    assert timed["__main__:log_metrics"].max_seconds >= 0.002


PROFILED = textwrap.dedent("""
    import json, sys
    import torch
    import tuiprof_functions

    def forward(model, x):
        return model(x).sum()

    model = torch.nn.Linear(4, 2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(5):
            forward(model, torch.ones(3, 4)).backward()
    prof.export_chrome_trace(sys.argv[1])
    print(tuiprof_functions.installed.document())
""")


def test_torch_profiler_python_tracing_keeps_its_python_events_while_functions_are_timed(tmp_path,
                                                                                        cleanup_segments):
    trace = tmp_path / "trace.json"
    proc = tuiprof_run(sys.executable, "-c", PROFILED, str(trace), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env={"TUIPROF_TIME_FUNCTIONS": "__main__@forward"})
    cleanup_segments.append(proc.pid)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    counted = {f["name"]: f["calls"] for f in json.loads(out)["functions"]}
    assert counted["__main__:forward"] == 5 and counted["torch:autograd.backward"] == 5
    python_events = [e["name"] for e in json.loads(trace.read_text())["traceEvents"]
                     if e.get("cat") == "python_function"]
    # the entry file's forward (Linear.forward is one too): one event per call, under the timing wrapper
    assert sum(name.startswith("<string>(") and name.endswith(": forward") for name in python_events) == 5
    assert sum(name.endswith(": timed") for name in python_events) >= 10  # forward's and backward's wrappers


MONITORED = textwrap.dedent("""
    import json, sys
    import tuiprof_functions

    class Parser:
        def parse(self, text):
            if text == "bad":
                raise ValueError(text)
            return json.loads(text)

    def gen():
        yield 1

    parser = Parser()
    for text in ["1", "bad", "[2]"] * 4:
        try:
            parser.parse(text)
        except ValueError:
            pass
    calls = {f["name"]: f["calls"] for f in json.loads(tuiprof_functions.installed.document())["functions"]}
    print(json.dumps({"calls": calls, "tool": sys.monitoring.get_tool(4)}))
""")


def _python312() -> str | None:
    """A Python >= 3.12 that runs (a pyenv shim may name one that is not installed), None if none."""
    for candidate in [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python"))),
                      shutil.which("python3.12"), shutil.which("python3.13")]:
        if candidate and subprocess.run([candidate, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                                        capture_output=True).returncode == 0:
            return candidate
    return None


PYTHON312 = _python312()


@pytest.mark.skipif(PYTHON312 is None, reason="no Python 3.12 or later here")
def test_python_312_times_through_sys_monitoring(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(MONITORED)
    env = {**os.environ, "PYTHONPATH": str(STARTUP), "TUIPROF_TIME_FUNCTIONS_DEFAULTS": "0",
           "TUIPROF_TIME_FUNCTIONS": "__main__@Parser@parse,json:loads,__main__@gen"}
    env.pop("TUIPROF_HOOK_LIBRARY", None)
    done = subprocess.run([str(PYTHON312), str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # every call counted, the four that raised too; json.loads timed on its code object, not replaced
    assert result == {"calls": {"json:loads": 8, "__main__:Parser.parse": 12}, "tool": "tuiprof"}
    assert done.stderr.strip() == ("tuiprof: cannot time __main__:gen: __main__:gen is a generator or coroutine "
                                   "function: its calls return before its work is done; name the function that "
                                   "iterates or awaits it; the other functions are timed")
