"""Builds the Cython wire (shmpool._core); everything else is in pyproject.toml."""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "shmpool._core",
        ["shmpool/_core.pyx"],
        include_dirs=["shmpool", numpy.get_include()],
        extra_compile_args=["-O2"],
    )
]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))
