import subprocess
import sys
import textwrap
import time

import pytest

from agentd.hang import pyspy

PARKED_PROGRAM = textwrap.dedent('''
    import threading, time

    def {function}():
        time.sleep(1000)

    def helper_loop():
        time.sleep(1000)

    threading.Thread(target=helper_loop, name="helper", daemon=True).start()
    print("ready", flush=True)
    {function}()
''')


@pytest.fixture(scope="session")
def pyspy_binary():
    """The py-spy binary, or a skip saying why stacks cannot be read here."""
    try:
        return pyspy.find_pyspy()
    except pyspy.PySpyMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def parked(tmp_path):
    """Start processes sleeping in a named function (main thread) and in ``helper_loop``
    (thread "helper"); all are killed at the end."""
    procs = []

    def start(function: str) -> subprocess.Popen:
        script = tmp_path / f"{function}.py"
        script.write_text(PARKED_PROGRAM.format(function=function))
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.1)  # let the main thread reach its sleep
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)
