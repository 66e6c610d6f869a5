"""ptdash's start-up hook (see ``ptdash/startup/__init__.py``); then the user's own sitecustomize.

Stdlib only, and nothing is imported until ``torch.distributed`` is.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _wrap(module) -> None:
    real = getattr(module, "init_process_group", None)
    if real is None or getattr(real, "__ptdash__", False):
        return

    def init_process_group(*args, **kwargs):
        result = real(*args, **kwargs)
        try:
            from ptdash.rankstart import start_rank

            start_rank()
        except Exception as exc:  # noqa: BLE001 - training goes on without ptdash
            print(f"ptdash: this rank runs without ptdash: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return result

    init_process_group.__wrapped__ = real
    init_process_group.__doc__ = real.__doc__
    init_process_group.__name__ = real.__name__
    init_process_group.__qualname__ = real.__qualname__
    init_process_group.__module__ = real.__module__
    init_process_group.__ptdash__ = True
    module.init_process_group = init_process_group


class _Finder:
    """Finds nothing itself: when ``torch.distributed`` is imported, wraps its loader so
    that ``init_process_group`` is wrapped as soon as the module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


def _install() -> None:
    if "PTDASH_RUN_DIR" not in os.environ or os.environ.get("PTDASH_HUB_PID") == str(os.getpid()):
        return
    if "torch.distributed" in sys.modules:
        _wrap(sys.modules["torch.distributed"])
    else:
        sys.meta_path.insert(0, _Finder())


def _chain() -> None:
    """Run the sitecustomize this one shadows, if there is one further on the path."""
    path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_install()
_chain()
