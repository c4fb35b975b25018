"""Builds the Cython extensions: the wire (shmpool._core), what spinning costs (shmpool._spin),
async evenness (shmpool._lead), a whole batch's action check (shmpool._batch_check),
the EnvPool face's elapsed-step counts (shmpool._elapsed), a shard's result writes
(shmpool.workers._rows) and the Atari frame kernel
(shmpool.workers.recipes._frames); everything else is in pyproject.toml."""
import os
import shlex
import shutil
import sysconfig

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import PlatformError

# What a failed source build means, said before pip's wall of output ends in a bare "No such file: 'gcc'".
CANNOT_BUILD = (
    "shmpool's C extensions cannot be built here: {cause}. Either install a C compiler and Python's headers "
    "(Debian/Ubuntu: apt-get install gcc python3-dev, or build-essential python3-dev; Fedora/RHEL: dnf install "
    "gcc python3-devel), or install a prebuilt wheel, which needs neither: build it once on a machine that has "
    "them, then pip install wheelhouse/shmpool-*.whl (README.md, \"Set up\")."
)


class BuildExtensions(build_ext):
    """``build_ext`` that first checks for a C compiler and Python's headers, and names the fix when one is
    missing."""

    def run(self) -> None:
        compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")[0]
        if shutil.which(compiler) is None:
            raise PlatformError(CANNOT_BUILD.format(cause=f"no C compiler ({compiler!r} is not on PATH)"))
        headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
        if not os.path.exists(headers):
            raise PlatformError(CANNOT_BUILD.format(cause=f"no Python headers ({headers} is missing)"))
        super().run()


def numpy_extension(name: str, source: str, include: list[str] | None = None, args: list[str] | None = None):
    """An extension on numpy's C API (its headers, without the deprecated API)."""
    return Extension(
        name,
        [source],
        include_dirs=[*(include or []), numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=args or ["-O2"],
    )


extensions = [
    Extension(
        "shmpool._core",
        ["shmpool/_core.pyx"],
        include_dirs=["shmpool", numpy.get_include()],
        extra_compile_args=["-O2"],
    ),
    Extension(
        "shmpool._spin",
        ["shmpool/_spin.pyx"],
        include_dirs=["shmpool"],
        extra_compile_args=["-O2"],
    ),
    Extension(
        "shmpool._lead",
        ["shmpool/_lead.pyx"],
        extra_compile_args=["-O2"],
    ),
    numpy_extension("shmpool._elapsed", "shmpool/_elapsed.pyx"),
    numpy_extension("shmpool._batch_check", "shmpool/_batch_check.pyx"),
    numpy_extension("shmpool.workers._rows", "workers/_rows.pyx"),
    # No fused multiply-add: the kernel must round where OpenCV rounds (see _area.h).
    numpy_extension("shmpool.workers.recipes._frames", "workers/recipes/_frames.pyx", include=["workers/recipes"],
                    args=["-O3", "-ffp-contract=off", "-fno-math-errno"]),
]

# Without DWARF debug info (Python's CFLAGS carry -g): a quarter of the compile time and three quarters of
# the wheel (0.8 MB, not 3.1); the symbol tables stay, so profilers still name the functions.
for extension in extensions:
    extension.extra_compile_args.append("-g0")

# Cythonized and compiled on every core this build may use: the build is most of an install's time.
jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
# The generated C embeds the numpy it was cythonized against (numpy 1's inline helpers read fields numpy 2
# removed), and Cython regenerates it by timestamps only: one folder per numpy major, so a tree built for
# numpy 1 (a gymnasium 0.29 venv) and then for numpy 2 never compiles the other's C.
generated = os.path.join("build", f"cython-numpy{numpy.__version__.split('.')[0]}")
setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}, nthreads=jobs,
                            build_dir=generated),
      options={"build_ext": {"parallel": jobs}}, cmdclass={"build_ext": BuildExtensions})
