"""Run a function in a child process so that an OOM kill or a crash there spares the caller.

The child is forked from a fork server (``multiprocessing`` "forkserver"), not from the caller: a plain
fork of a process whose OpenMP thread pool has run (any sizeable matmul or convolution in torch) leaves
libgomp's locks held in the child, which then hangs in its first parallel region. The server preloads
torch and the measurement code once, so a child starts in milliseconds; the work travels to it with
cloudpickle, which carries closures, lambdas and classes defined in ``__main__`` by value.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import cloudpickle

from nnmem import errors
from nnmem.errors import MeasureError, NnmemError

__all__ = ["run_in_child"]


def _child(conn: Any, payload: bytes) -> None:
    try:
        fn = cloudpickle.loads(payload)
        conn.send(("ok", fn()))
    except NnmemError as err:
        conn.send(("error", type(err).__name__, str(err)))
    except BaseException as err:  # a crash of the model's code must reach the caller as a message
        last = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
        where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
        conn.send(("error", "MeasureError", f"{type(err).__name__}: {err}{where}"))
    finally:
        conn.close()


_HEAVY = ("transformers",)


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    # Must be set before the server starts (the first child); later calls only repeat it.
    # torch and the PyTorch measurement (which pulls in the profiler and torch._dynamo) load once in the server,
    # not in every child; so do the heavy model libraries the caller has already imported (transformers).
    preload = ["torch", "torch._dynamo", "nnmem.frontends.pytorch.measure"] if importlib.util.find_spec("torch") \
        else []
    preload += [name for name in _HEAVY if name in sys.modules]
    ctx.set_forkserver_preload(preload)
    return ctx


@contextmanager
def _main_not_rerun() -> Iterator[None]:
    """Keep multiprocessing from running the caller's ``__main__`` script again in the child.

    A forkserver child re-imports the main script unless it is guarded by ``if __name__ == "__main__"``,
    so a script calling ``nnmem.measure`` at top level would measure itself recursively. The work needs
    nothing from ``__main__`` (cloudpickle carries its functions by value), so the child is told of none.
    """
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if main is not None and hasattr(main, k)}
    for k in saved:
        if k == "__spec__":
            main.__spec__ = None  # type: ignore[union-attr]
        else:
            delattr(main, k)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


@contextmanager
def _preloaded(library: str | None, env: dict[str, str]) -> Iterator[None]:
    """``env`` is set (and ``LD_PRELOAD`` names ``library``) while a spawned child starts: it inherits them."""
    if library is None and not env:
        yield
        return
    saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", *env)}
    os.environ.update(env)
    if library is not None:
        os.environ["LD_PRELOAD"] = f"{library} {saved['LD_PRELOAD']}" if saved["LD_PRELOAD"] else library
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_in_child(fn: Callable[[], Any], *, timeout_s: float | None = None, preload: str | None = None,
                 env: dict[str, str] | None = None) -> Any:
    """Call ``fn()`` in a child process and return its (picklable) result.

    Args:
        fn: the work; closures over models work (it is sent with cloudpickle).
        timeout_s: seconds to wait before the child is killed; None waits for ever.
        preload: a shared library the child loads at start (``LD_PRELOAD``), e.g. the malloc counter of
            :mod:`nnmem.runner.mallocpeak`; such a child is a fresh interpreter ("spawn"), not a fork of
            the fork server.
        env: environment variables the child starts with (it imports modules, e.g. Keras or TensorFlow,
            while the work is unpickled, before ``fn`` runs, so settings they read at import must be here);
            such a child is a fresh interpreter ("spawn") too.

    Raises:
        NnmemError: the child raised one (re-raised here with its class and message).
        MeasureError: the child raised anything else, was killed (e.g. by the OOM killer) or timed out.
    """
    try:
        payload = cloudpickle.dumps(fn)
    except Exception as err:
        raise MeasureError(f"the step cannot be sent to the measuring child process: {type(err).__name__}: {err}; "
                           "define the model at module level or measure a MODEL spec") from err
    ctx = _context() if preload is None and not env else mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, payload), daemon=True)
    with _main_not_rerun(), _preloaded(preload, env or {}):
        proc.start()
    child.close()
    message = None
    if parent.poll(timeout_s):
        try:
            message = parent.recv()
        except EOFError:
            message = None
    proc.join(5 if message is not None else timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        if message is None:
            raise MeasureError(f"the measuring child process did not finish within {timeout_s} s and was killed")
    if message is None:
        code = proc.exitcode
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            hint = " — most likely out of memory (the OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            raise MeasureError(f"the measuring child process was killed by {name}{hint}")
        raise MeasureError(f"the measuring child process exited with code {code} without a result")
    if message[0] == "ok":
        return message[1]
    cls = getattr(errors, message[1], MeasureError)
    raise cls(message[2])
