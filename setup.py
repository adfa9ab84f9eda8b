"""Build the compiled parts of tuiprof_native.

Cython modules: every ``tuiprof_native/*.pyx`` becomes an extension module.
The interposition library ``libtuiprof_hook.so`` is plain C (no libpython): it is
loaded with LD_PRELOAD and as NCCL's profiler plugin into processes that may not
be Python at all, so it is linked as an ordinary shared object, not an extension.
"""

from __future__ import annotations

import glob
import os

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "tuiprof_native"
HOOK_SOURCES = sorted(glob.glob(os.path.join(NATIVE, "hook", "*.c")))
HOOK_LIBRARY = "libtuiprof_hook.so"


# Cython's C for our two small modules is ~1 MB each; Python's default flags (-g -O3)
# made compiling it most of `pip install .` (bench/native/install_time.md). -O2 without debug
# info compiles in about half the time, and the modules only read counters and segments.
EXTENSION_FLAGS = ["-O2", "-g0"]


class BuildWithHookLibrary(build_ext):
    """build_ext that also links the C interposition library into the package,
    compiling the extensions in parallel (one per core) unless told otherwise (-j)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = True  # setuptools: as many jobs as CPUs

    def run(self) -> None:
        super().run()
        if not HOOK_SOURCES:
            return
        objects = self.compiler.compile(
            HOOK_SOURCES,
            output_dir=self.build_temp,
            include_dirs=[os.path.join(NATIVE, "include")],
            extra_postargs=["-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-std=gnu11"],
        )
        target_dir = NATIVE if self.inplace or self.editable_mode else os.path.join(self.build_lib, NATIVE)
        os.makedirs(target_dir, exist_ok=True)
        self.compiler.link_shared_object(
            objects,
            os.path.join(target_dir, HOOK_LIBRARY),
            libraries=["dl", "pthread", "rt"],
            extra_postargs=["-Wl,-z,defs"],
        )

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        if HOOK_SOURCES:
            outputs.append(os.path.join(self.build_lib, NATIVE, HOOK_LIBRARY))
        return outputs


extensions = [
    Extension(
        f"{NATIVE}.{os.path.splitext(os.path.basename(path))[0]}",
        [path],
        include_dirs=[os.path.join(NATIVE, "include")],
        extra_compile_args=EXTENSION_FLAGS,
    )
    for path in sorted(glob.glob(os.path.join(NATIVE, "*.pyx")))
]

setup(
    ext_modules=cythonize(extensions, language_level=3, compiler_directives={"binding": False}),
    cmdclass={"build_ext": BuildWithHookLibrary},
)
