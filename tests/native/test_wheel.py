"""The wheel path: build a wheel from a clean copy of the sources (as `pip wheel .`
does, with build isolation), install it into a fresh virtualenv, and run the
installed `tuiprof run` and `agentd` from outside the checkout. Proves the
compiled parts (Cython modules, libtuiprof_hook.so) and the data files (startup
hook, .tcss, .proto) are in the package, and that no generated C is shipped."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from native.support import segment_path

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "agentd", "tuiprof", "tuiprof_native")
REQUIRED = (
    "tuiprof_native/libtuiprof_hook.so",
    "tuiprof_native/startup/sitecustomize.py",
    "tuiprof_native/startup/tuiprof_startup.py",
    "tuiprof_native/include/tuiprof_segment.h",
    "tuiprof/tui/tuiprof.tcss",
    "agentd/proto/tuiprof_agent.proto",
    "agentd/proto/tuiprof_agent_pb2.py",
    "agentd/proto/tuiprof_agent_pb2_grpc.py",
    "agentd/systemd/agentd.service",
)


def _build_outputs(directory: str, names: list[str]) -> set[str]:
    """What a clean checkout does not have: caches, compiled objects, Cython's generated C."""
    ignored = {n for n in names if n in ("__pycache__", "build") or n.endswith((".so", ".egg-info"))}
    return ignored | {n for n in names if n.endswith(".c") and n[:-2] + ".pyx" in names}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=_build_outputs)
        else:
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = out.glob("tuiprof-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A fresh virtualenv with only the wheel and its dependencies."""
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True, timeout=120)
    result = subprocess.run([path / "bin" / "pip", "install", "-q", str(wheel)], capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    return path


def test_wheel_has_compiled_parts_and_data_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(REQUIRED) <= names, sorted(set(REQUIRED) - names)
    for module in ("pmu", "segment"):
        assert any(n.startswith(f"tuiprof_native/{module}.cpython-") and n.endswith(".so") for n in names), module
    assert not [n for n in names if n.endswith((".c", ".pyx"))]


# Runs under the installed `tuiprof run`: records a step, says where everything came from.
PROBE = ("import ctypes, json, os, sys; ctypes.CDLL(os.environ['TUIPROF_HOOK_LIBRARY']).tuiprof_record_step(); "
         "import tuiprof_native; print(json.dumps({'pid': os.getpid(), 'package': tuiprof_native.__file__, "
         "'preload': os.environ['LD_PRELOAD'], 'path': sys.path, "
         "'startup': 'tuiprof_startup' in sys.modules}))")
READ_SEGMENT = ("import json, sys; from tuiprof_native import segment; seg = segment.Segment(sys.argv[1]); "
                "h = seg.header(); print(json.dumps({'pid': h.pid, 'steps': h.counters.step_count}))")


def test_installed_tuiprof_run_and_agentd_work(venv, tmp_path, cleanup_segments):
    bin_dir = venv / "bin"
    site = next(venv.glob("lib/python*/site-packages"))
    run = subprocess.run([bin_dir / "tuiprof", "run", "--no-kineto-daemon", "--", bin_dir / "python", "-c", PROBE],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    probe = json.loads(run.stdout)
    cleanup_segments.append(probe["pid"])
    assert pathlib.Path(probe["package"]).is_relative_to(site)  # the installed package, not the checkout
    assert probe["preload"].split(":")[0] == str(site / "tuiprof_native" / "libtuiprof_hook.so")
    assert str(site / "tuiprof_native" / "startup") in probe["path"] and probe["startup"]
    read = subprocess.run([bin_dir / "python", "-c", READ_SEGMENT, str(segment_path(probe["pid"]))],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == {"pid": probe["pid"], "steps": 1}
    agentd = subprocess.run([bin_dir / "agentd", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert agentd.returncode == 0 and agentd.stdout.startswith("usage: agentd"), agentd.stderr
    tcss = subprocess.run([bin_dir / "python", "-c", "from tuiprof.tui.app import TuiprofApp; "
                           "assert TuiprofApp.CSS_PATH.is_file(); print(TuiprofApp.CSS_PATH)"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert tcss.returncode == 0 and pathlib.Path(tcss.stdout.strip()).is_relative_to(site), tcss.stderr
