"""Starting a tensor-parallel worker as a fresh interpreter that never touches the caller's script.

multiprocessing's "spawn" start method re-runs the caller's ``__main__`` module in every child
(as ``__mp_main__``), which breaks ``python - <<EOF`` scripts (``<stdin>`` cannot be re-read),
``python -c``, notebooks and any script without an ``if __name__ == "__main__":`` guard. A
worker needs none of it: it is ``python -m toolkit.core.tp_process FD``, talking to its parent
over one end of a private socket pair inherited as file descriptor FD. The first message it
reads is its bootstrap (the parent's ``sys.path``, so functions from importable modules unpickle
the same way, then ``worker_main``'s arguments). A function defined in the caller's own
``__main__`` is therefore not reachable in a worker; ``ParallelModel.run`` says so up front.
"""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from multiprocessing import connection

_BOOTSTRAP_TIMEOUT_SECONDS = 60.0


class WorkerProcess:
    """The parts of ``multiprocessing.Process`` the parent uses, over a ``subprocess.Popen``."""

    def __init__(self, popen: subprocess.Popen):
        self._popen = popen
        self.pid = popen.pid
        # Readable once the process exits, so connection.wait() notices a death without a reply.
        self.sentinel = os.pidfd_open(popen.pid) if hasattr(os, "pidfd_open") else None

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def close(self) -> None:
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None


def start_worker(worker_args: dict) -> tuple[WorkerProcess, connection.Connection]:
    """Start one worker's interpreter and send it ``worker_main``'s keyword arguments (all but ``conn``)."""
    ours, theirs = socket.socketpair()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(_search_path()))
    with theirs:
        popen = subprocess.Popen([sys.executable, "-m", "toolkit.core.tp_process", str(theirs.fileno())],
                                 pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env, cwd=os.getcwd())
    conn = connection.Connection(ours.detach())
    conn.send_bytes(pickle.dumps(_search_path(), protocol=pickle.HIGHEST_PROTOCOL))
    conn.send_bytes(pickle.dumps(worker_args, protocol=pickle.HIGHEST_PROTOCOL))
    return WorkerProcess(popen), conn


def _search_path() -> list[str]:
    """The caller's ``sys.path`` with the current-directory entry ('') made absolute."""
    return [entry or os.getcwd() for entry in sys.path]


def _bootstrap(fd: int) -> None:
    conn = connection.Connection(fd)
    if not conn.poll(_BOOTSTRAP_TIMEOUT_SECONDS):
        return  # the parent never wrote: nothing to serve
    sys.path[:] = pickle.loads(conn.recv_bytes())  # plain strings: unpickles before the path is set
    from toolkit.core.tp_worker import worker_main  # noqa: PLC0415 - after sys.path is the parent's

    worker_main(conn=conn, **pickle.loads(conn.recv_bytes()))


if __name__ == "__main__":
    _bootstrap(int(sys.argv[1]))
