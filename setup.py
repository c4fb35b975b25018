"""Builds the Cython extensions: the wire (shmpool._core), what spinning costs (shmpool._spin),
async evenness (shmpool._lead), a whole batch's action check (shmpool._batch_check),
the EnvPool face's elapsed-step counts (shmpool._elapsed), a shard's result writes
(shmpool.workers._rows) and the Atari frame kernel
(shmpool.workers.recipes._frames); everything else is in pyproject.toml."""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup


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

# Cythonized and compiled on every core this build may use: the build is most of an install's time.
jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}, nthreads=jobs),
      options={"build_ext": {"parallel": jobs}})
