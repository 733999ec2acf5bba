"""How the server runs and stops: SIGTERM answers every request taken, then ends every process the server started.

LitServe (0.2.19) runs no SIGTERM handler in its main process. Here a thread of ``Stopper`` sends SIGTERM to every
HTTP server (LitServe's ``LitServer-<n>`` processes), on which uvicorn answers every request it took, and waits for
them; then it sets the event ``LitServer.run`` waits on, whose own shutdown ends the model's processes and its
manager. What uvicorn's shutdown lacks, the draining HTTP server adds (``server_class``); so does the server's
``verify_worker_status`` to LitServe's start-up, which waited for ever for a model process that ended before it was
ready. Should the server not have stopped ``stop_s`` seconds after SIGTERM, its processes are killed and it exits 1.

The signal handler (``catch_sigterm``) only sets an event: an exception raised from a handler lands wherever the
main thread is, in LitServe's start-up too, where a finalizer could drop it (the server then served on, ignoring
SIGTERM). A SIGTERM during an export stops the command once the export is done; during LitServe's start-up, before
it creates its HTTP servers. Ctrl-C is LitServe's own (uvicorn's in the HTTP servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import struct
import sys
import threading
import time

from ..upstream.litserve import (
    HTTP_PROCESS_PREFIX,
    HTTP_SERVER_ID,
    http_server_base,
    request_shutdown,
    server_class,
    setup_status,
)

# How long the HTTP servers may take to answer the requests in flight after SIGTERM, beyond --timeout (by then
# LitServe has answered each one still waiting with its 504).
GRACE_S = 30
# After SIGTERM, how long a connection taken has to start its request (its headers read) before it is closed
# unanswered: the server waits until every connection has started one, or this long.
REQUEST_START_S = 5.0
# After SIGTERM, how long a handshake the port answered just before it stopped answering new ones has to complete.
HANDSHAKE_S = 0.05


def say(line: str) -> None:
    """Tell the person what the command is doing, at once (the server's log is a file, not a terminal)."""
    print(line, flush=True)


# Set by SIGTERM, once catch_sigterm() has been called: the server stops at the next point that checks it.
_REQUESTED = threading.Event()
_PID: int | None = None  # the process that caught it; a process forked from it did not


def catch_sigterm() -> None:
    """From now on SIGTERM sets an event instead of ending the process: what the command was doing (exporting a
    checkpoint, starting the server) stops at the next point that checks ``sigterm_received()``, files removed."""
    global _PID
    _PID = os.getpid()
    signal.signal(signal.SIGTERM, _on_sigterm)


def sigterm_received() -> bool:
    return _REQUESTED.is_set()


def _on_sigterm(signum, frame) -> None:
    if os.getpid() != _PID:  # a process LitServe forked, which inherited this handler
        manager = not multiprocessing.current_process().name.startswith(HTTP_PROCESS_PREFIX)
        if manager and os.getppid() == _PID and not (_GUARD is not None and _GUARD.allowed()):
            return  # LitServe's manager, SIGTERM'd with the server's whole group: the server ends it when done
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # an HTTP server before uvicorn's handlers: as if it had none
        signal.raise_signal(signal.SIGTERM)
        return
    _REQUESTED.set()


# The server's ModelProcessGuard, read by the processes LitServe forks (its manager).
_GUARD: ModelProcessGuard | None = None


class ModelProcessGuard:
    """A model process (and LitServe's manager) ends on SIGTERM only once the server allows it, or has gone: a
    SIGTERM to the server's whole group (SLURM's ``scancel``, systemd's stop) would otherwise end them while the
    HTTP servers still wait for their answers."""

    def __init__(self) -> None:
        self._allowed = multiprocessing.get_context("spawn").Event()  # handed to the model processes it spawns
        self._server = os.getpid()

    def allow(self) -> None:
        self._allowed.set()

    def allowed(self) -> bool:
        return self._allowed.is_set()

    def install(self) -> None:
        """In the model process (``LitAPI.setup``)."""
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        if self.allowed() or os.getppid() != self._server:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)


class StopRequestedError(Exception):
    """Raised in the main thread where LitServe waits for its model processes or creates an HTTP server, once SIGTERM
    has come: no HTTP server is started."""


class WorkerEndedError(Exception):
    """A model process failed to load the model (``exitcode`` None: its error is in the log), or ended while the
    server started (LitServe would have waited for ever): ``exitcode`` negative for the signal that ended it."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(exitcode)
        self.exitcode = exitcode


class Stopper:
    """Runs a ``LitServer`` until SIGTERM or Ctrl-C, then stops it (the module's docstring)."""

    def __init__(self, stop_s: float) -> None:
        self.server, self.stop_s = None, stop_s
        self.model_processes = ModelProcessGuard()  # for the LitAPI, which installs it in each model process
        global _GUARD
        _GUARD = self.model_processes  # LitServe's manager, forked from this process, takes SIGTERM by it too
        self.stopping = threading.Event()  # the server is stopping: LitServe's noise about it is no error
        self.finished = threading.Event()  # the main thread is out of LitServer.run

    def run(self, server, **options) -> None:
        """``server.run(**options)`` in the main thread (``server`` of ``server_class()``); ``WorkerEndedError`` where
        a model process ended during the start-up, unless SIGTERM came first."""
        self.server = server
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where Ctrl-C is ignored
            signal.signal(signal.SIGINT, self._on_sigint)
        stopping = threading.Thread(target=self._stop_when_asked, name="serve-stopper", daemon=True)
        stopping.start()
        try:
            if not _REQUESTED.is_set():  # SIGTERM before: LitServe is not started
                server.run(**options)
        except StopRequestedError:  # SIGTERM before the HTTP servers started: LitServe leaves its processes to us
            pass
        except KeyboardInterrupt:  # Ctrl-C before the HTTP servers started: the same
            self.stopping.set()
        finally:
            self.finished.set()
            if _REQUESTED.is_set():
                stopping.join()  # it has said it is stopping (before this thread says it stopped), and has done
            self.model_processes.allow()
            end_children()

    def _on_sigint(self, signum, frame) -> None:
        self.model_processes.allow()  # LitServe's shutdown on Ctrl-C ends them with SIGTERM
        signal.default_int_handler(signum, frame)

    def _stop_when_asked(self) -> None:
        _REQUESTED.wait()
        self.stopping.set()
        deadline = time.monotonic() + self.stop_s
        say("stopping: answering the requests taken, refusing new connections")
        # Every HTTP server at once (LitServe's shutdown SIGTERMs one after another, the others taking connections
        # meanwhile); none is created after SIGTERM (StopRequestedError).
        http = [child for child in multiprocessing.active_children() if child.name.startswith(HTTP_PROCESS_PREFIX)]
        for child in http:
            os.kill(child.pid, signal.SIGTERM)
        for child in http:
            child.join(max(0.0, deadline - time.monotonic()))
        self.model_processes.allow()  # the HTTP servers have answered what they took
        request_shutdown(self.server)  # LitServe's own shutdown ends the model's processes and its manager
        if not self.finished.wait(max(0.0, deadline - time.monotonic())):
            say(f"error: the server did not stop within {self.stop_s:.0f} s of SIGTERM: its processes are killed")
            for child in multiprocessing.active_children():
                child.kill()
            os._exit(1)

    def shutdown_noise(self, record: logging.LogRecord) -> bool:
        """A filter of LitServe's log: what it logs while the server stops (its queues' connections closing, its HTTP
        servers already gone) is dropped."""
        if not self.stopping.is_set():
            return True
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, ConnectionError | EOFError) and "Already not alive" not in record.getMessage()

    def server_class(self) -> type:
        """A ``LitServer`` whose HTTP servers drain on SIGTERM, and whose start-up stops where a model process
        failed or ended (LitServe would have waited for ever), or where SIGTERM came."""
        WorkerSetupStatus, guard = setup_status(), self.model_processes

        class DrainingServer(http_server_base()):
            """uvicorn's server as LitServe runs it; the first says ``ready`` once its port takes connections.

            On SIGTERM it stops answering new connections (``drop_new_handshakes``), takes those already queued
            (their clients are sending), shuts the port for every process (later ones are refused, not reset), waits
            until each connection taken has started its request (at most ``REQUEST_START_S``), then shuts down as
            uvicorn does: each request started is answered, idle connections are closed.
            """

            def __init__(self, *args, **kwargs) -> None:
                if _REQUESTED.is_set():  # SIGTERM after the model processes were ready: none is started
                    guard.allow()  # LitServe ends them now
                    raise StopRequestedError
                super().__init__(*args, **kwargs)

            async def startup(self, sockets=None) -> None:
                if self.should_exit:  # SIGTERM'd before it started: it does not listen
                    return
                await super().startup(sockets)
                # Said once the port takes connections (the socket listens from here on), by the first HTTP server.
                if self.started and not self.should_exit and os.environ.get(HTTP_SERVER_ID) == "0":
                    say(self.config.app.state.ready_line)

            async def shutdown(self, sockets=None) -> None:
                listeners = [sock.dup() for sock in sockets or []]
                for server in self.servers:
                    server.close()  # asyncio stops accepting (and closes its own copy of the port)
                loop = asyncio.get_running_loop()
                for listener in listeners:
                    drop_new_handshakes(listener)
                    listener.setblocking(False)
                    while True:
                        connection = _queued(listener)
                        if connection is None:
                            # A handshake answered before the filter completes within a round trip: look once more.
                            await asyncio.sleep(HANDSHAKE_S)
                            connection = _queued(listener)
                        if connection is None:
                            break
                        await loop.connect_accepted_socket(self._protocol, connection)
                    with contextlib.suppress(OSError):  # another of the HTTP servers has stopped it
                        listener.shutdown(socket.SHUT_RDWR)  # the port, in every process that holds it
                    listener.close()
                # uvicorn's shutdown closes a connection that has not started a request (its client may be sending
                # one, a large upload on a busy machine: it would be reset): wait for each to start, bounded.
                deadline = loop.time() + REQUEST_START_S
                while loop.time() < deadline and any(
                    getattr(connection, "cycle", True) is None for connection in self.server_state.connections
                ):
                    await asyncio.sleep(0.02)
                await super().shutdown(sockets)

            def _protocol(self):
                return self.config.http_protocol_class(
                    config=self.config, server_state=self.server_state, app_state=self.lifespan.state
                )

        class Server(server_class(DrainingServer)):
            def verify_worker_status(self) -> None:
                """LitServe's wait for its model processes, for every one (not the first) and not for ever."""
                while not _REQUESTED.is_set():
                    stages = list(self.workers_setup_status.values())
                    ended = [worker.exitcode for worker in self.inference_workers if worker.exitcode is not None]
                    if WorkerSetupStatus.ERROR in stages or ended:  # its error is in the log; or how it ended
                        raise WorkerEndedError(None if WorkerSetupStatus.ERROR in stages else ended[0])
                    if all(stage == WorkerSetupStatus.READY for stage in stages):
                        return
                    time.sleep(0.05)
                raise StopRequestedError

        return Server


# Classic BPF, run by the kernel on each TCP segment that reaches the port (from the TCP header on): a segment with
# SYN set (a new connection's first) is dropped, any other kept. struct sock_filter is (code, jt, jf, k).
_DROP_SYN = (
    (0x30, 0, 0, 13),  # BPF_LD | BPF_B | BPF_ABS: the flags byte
    (0x45, 0, 1, 0x02),  # BPF_JMP | BPF_JSET | BPF_K: SYN set? on to the next, else skip it
    (0x06, 0, 0, 0),  # BPF_RET | BPF_K: drop
    (0x06, 0, 0, 0xFFFFFFFF),  # BPF_RET | BPF_K: keep the whole segment
)
SO_ATTACH_FILTER = 26  # Linux's; Python's socket module does not name it


def drop_new_handshakes(listener: socket.socket) -> None:
    """From now on the port answers no new connection's SYN (its client sends it again a second later, and by then
    the port is shut: refused), while handshakes already answered complete into the accept queue.

    Shutting a listening port resets each connection queued at it: without this filter, a connection whose
    handshake completed between the last ``accept`` and the shutdown (a moment, longer on a busy machine) would
    be reset rather than answered or refused. Where the kernel takes no such filter (not Linux), that moment stays.
    """
    if sys.platform != "linux":
        return
    program = b"".join(struct.pack("HBBI", *instruction) for instruction in _DROP_SYN)
    code = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HL", len(_DROP_SYN), ctypes.addressof(code))  # struct sock_fprog {len; filter*}
    with contextlib.suppress(OSError):
        listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def _queued(listener: socket.socket) -> socket.socket | None:
    """The next connection queued at the (non-blocking) ``listener``; None when none is, or the port is shut."""
    try:
        return listener.accept()[0]
    except (BlockingIOError, InterruptedError, OSError):
        return None


def end_children() -> None:
    """Stop every process this one started that is still running (none, after LitServe's own shutdown)."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(GRACE_S)
        if child.is_alive():
            child.kill()
            child.join()
