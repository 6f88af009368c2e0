"""The version of aioqueue, read by the build (pyproject.toml) and ``aioqueue.__version__``."""

__version__ = "0.1.0"
