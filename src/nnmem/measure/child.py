"""Run a function in a forked child process so that an OOM kill or a crash there spares the caller."""

from __future__ import annotations

import multiprocessing as mp
import signal
import traceback
from collections.abc import Callable
from typing import Any

from nnmem import errors
from nnmem.errors import MeasureError, NnmemError

__all__ = ["run_in_child"]


def _child(conn: Any, fn: Callable[[], Any]) -> None:
    try:
        conn.send(("ok", fn()))
    except NnmemError as err:
        conn.send(("error", type(err).__name__, str(err)))
    except BaseException as err:  # a crash of the model's code must reach the caller as a message
        last = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
        where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
        conn.send(("error", "MeasureError", f"{type(err).__name__}: {err}{where}"))
    finally:
        conn.close()


def run_in_child(fn: Callable[[], Any], *, timeout_s: float | None = None) -> Any:
    """Call ``fn()`` in a forked child and return its (picklable) result.

    Args:
        fn: the work; it runs in a copy of this process, so closures over models work.
        timeout_s: seconds to wait before the child is killed; None waits for ever.

    Raises:
        NnmemError: the child raised one (re-raised here with its class and message).
        MeasureError: the child raised anything else, was killed (e.g. by the OOM killer) or timed out.
    """
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn), daemon=True)
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
