"""Suite-wide settings.

The experiments turn on JAX's persistent compilation cache under the user's
home (`experiments.cli.enable_compile_cache`); the tests run them with the
cache off, so that they write nothing outside their temporary directories.
"""

import os

os.environ.setdefault("PRFL_JAX_COMPILE_CACHE", "off")
