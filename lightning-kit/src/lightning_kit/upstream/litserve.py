"""LitServe's private names the server relies on, each with what it is for and the versions known to work.

LitServe offers no way to choose the class of the uvicorn servers it starts (``LitServer._start_server`` makes each
from its module's name ``_Server``), so the drain on SIGTERM (``serve/stopping.py``) subclasses ``_Server``, and
``server_class`` runs LitServe's own ``_start_server`` with that name read as the subclass. The uvicorn attributes
the overrides read are checked by ``tests/test_serve_faults.py``.
"""

import contextlib
import functools
import inspect
from types import FunctionType

from . import Private

# The name of each HTTP server's process, ``LitServer-<n>``, and what it finds its own ``<n>`` in.
HTTP_PROCESS_PREFIX = "LitServer-"
HTTP_SERVER_ID = "LITSERVE_WORKER_ID"
VERSIONS = "litserve 0.2.18 to 0.2.19"


def http_server_base() -> type:
    """The class of the uvicorn servers LitServe starts, which the draining server subclasses."""
    from litserve.server import _Server

    return _Server


def server_class(http_server_class: type) -> type:
    """A ``LitServer`` whose HTTP servers are ``http_server_class``; nothing of LitServe's is reassigned."""
    from litserve import LitServer

    start = _start_server()
    own = FunctionType(start.__code__, {**start.__globals__, "_Server": http_server_class}, start.__name__)
    own.__defaults__, own.__kwdefaults__ = start.__defaults__, start.__kwdefaults__
    return type("DrainingLitServer", (LitServer,), {"_start_server": own, "__module__": __name__})


def _start_server() -> FunctionType:
    """``LitServer._start_server``, checked to make its HTTP servers from the module's name ``_Server``."""
    from litserve import LitServer

    start = LitServer._start_server
    if "_Server" not in start.__code__.co_names or start.__closure__:
        raise TypeError("LitServer._start_server no longer makes its HTTP servers from litserve.server._Server")
    return start


def request_shutdown(server) -> None:
    """Set the event ``LitServer.run`` waits on (made in its start-up): it then stops the model's processes."""
    shutdown = getattr(server, "_shutdown_event", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):  # its manager is gone: LitServe has stopped already
            shutdown.set()


def setup_status():
    """LitServe's stages of a model process's start (``READY``, ``ERROR``), kept in ``server.workers_setup_status``."""
    from litserve.utils import WorkerSetupStatus

    return WorkerSetupStatus


def _in_source(text: str) -> str:
    """The line of ``litserve.server``'s source that holds ``text`` (an attribute the server sets in its start-up)."""
    import litserve.server

    line = next((line for line in inspect.getsource(litserve.server).splitlines() if text in line), None)
    if line is None:
        raise AttributeError(f"litserve.server no longer has {text!r}")
    return line.strip()


def _uvicorn_method(name: str):
    """uvicorn's ``Server.<name>``, which the draining server overrides with the parameters ``(self, sockets)``."""
    import uvicorn.server

    method = getattr(uvicorn.server.Server, name)
    if tuple(inspect.signature(method).parameters) != ("self", "sockets"):
        raise TypeError(f"uvicorn's Server.{name} takes {inspect.signature(method)}, not (self, sockets)")
    return method


# What LitServer's start-up sets, each found by a line of litserve.server's source: the text it holds, and its use.
_IN_SOURCE = {
    "LitServer._shutdown_event": (
        "self._shutdown_event = ",
        "set on SIGTERM: LitServer.run then runs its own shutdown (the HTTP servers first, then the model's processes)",
    ),
    "LitServer.workers_setup_status": (
        "self.workers_setup_status = ",
        "each model process's stage: the HTTP servers are started once all are ready, none where one failed",
    ),
    "LitServer.inference_workers": (
        "self.inference_workers = ",
        "the model's processes, one that ended during the start-up stops it",
    ),
    "LitServer.uvicorn_graceful_timeout": (
        "self.uvicorn_graceful_timeout = ",
        "how long LitServe's shutdown waits for an HTTP server to answer what it took, after SIGTERM",
    ),
    f"{HTTP_PROCESS_PREFIX}<n>": (
        f'name=f"{HTTP_PROCESS_PREFIX}',
        "the name of each HTTP server's process: the model's processes end once none is left",
    ),
    HTTP_SERVER_ID: (
        f'os.environ["{HTTP_SERVER_ID}"]',
        "set by _Server.run: the first HTTP server (0) says the server is ready",
    ),
}
PRIVATES = (
    Private(
        "LitServer._start_server",
        "LitServe's own code, run by server_class's subclass with _Server read as the draining server",
        VERSIONS,
        _start_server,
        FunctionType,
    ),
    Private(
        "litserve.server._Server",
        "the uvicorn server LitServe starts: subclassed to drain on SIGTERM",
        VERSIONS,
        http_server_base,
        type,
    ),
    Private("litserve.utils.WorkerSetupStatus", "the stages in workers_setup_status", VERSIONS, setup_status, type),
    *(
        Private(name, use, VERSIONS, functools.partial(_in_source, text), str)
        for name, (text, use) in _IN_SOURCE.items()
    ),
    Private(
        "uvicorn.server.Server.startup",
        "overridden: the first HTTP server says it is ready once its port listens",
        "uvicorn 0.55 (with litserve 0.2.19)",
        lambda: _uvicorn_method("startup"),
        FunctionType,
    ),
    Private(
        "uvicorn.server.Server.shutdown",
        "overridden: the connections queued at the port are taken, and each started request answered",
        "uvicorn 0.55 (with litserve 0.2.19)",
        lambda: _uvicorn_method("shutdown"),
        FunctionType,
    ),
)
