"""k26ops: run a TP8 DDTree SGLang engine on GPU hosts over SSH."""


def __getattr__(name: str):
    """`k26ops.__version__`, looked up when asked (not at every CLI start): the git tag's version that
    setuptools-scm wrote into _version.py at build/install time (pyproject.toml [tool.setuptools_scm]);
    else the installed distribution's; else 0+unknown (a bare checkout on sys.path)."""
    if name != "__version__":
        raise AttributeError(f"module 'k26ops' has no attribute {name!r}")
    try:
        from k26ops._version import version  # lazy: only when asked, not at every CLI start
    except ImportError:
        try:
            from importlib.metadata import version as dist_version  # lazy: as above

            version = dist_version("k26ops")
        except Exception:  # noqa: BLE001 - not installed
            version = "0+unknown"
    globals()["__version__"] = version
    return version
