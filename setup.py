"""The one compiled part: the pipeline replay's inner loop and a plan's compile (oracle/pipeline/_native.c), an
*optional* C extension. Where no C compiler (or no Python headers) is found the build skips it and the package
installs and runs as before, in numba, numpy and Python (speed only: oracle/pipeline/_jit.py). The build records
the SHA-256 of the source it compiled, and the module is used only while that is the source beside it (a build
from another version of _native.c is ignored until the next install). Everything else is in pyproject.toml."""
import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "oracle/pipeline/_native.c"
SHA256 = hashlib.sha256((Path(__file__).resolve().parent / SOURCE).read_bytes()).hexdigest()

setup(ext_modules=[Extension("oracle.pipeline._native", [SOURCE], optional=True,
                             define_macros=[("NATIVE_SOURCE_SHA256", f'"{SHA256}"')])])
