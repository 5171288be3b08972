"""The one compiled part: the pipeline replay's inner loop (oracle/pipeline/_native.c), an *optional* C
extension. Where no C compiler (or no Python headers) is found the build skips it and the package installs and
runs as before, replaying with numba or in Python (speed only: oracle/pipeline/_jit.py). Everything else is
declared in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("oracle.pipeline._native", ["oracle/pipeline/_native.c"], optional=True)])
