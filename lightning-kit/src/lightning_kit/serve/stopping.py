"""How the server runs and stops: SIGTERM answers every request taken, then ends every process the server started.

LitServe (0.2.19) runs no SIGTERM handler in its main process. Here a thread of ``Stopper`` SIGTERMs every HTTP
server (on which uvicorn answers every request it took) and waits for them, then sets the event ``LitServer.run``
waits on, whose own shutdown ends the model's processes. Past ``stop_s`` the processes are killed and it exits 1.

The signal handler only sets an event: an exception raised from a handler lands wherever the main thread is, in
LitServe's start-up too, where a finalizer could drop it (the server then served on, ignoring SIGTERM). Ctrl-C is
LitServe's own (uvicorn's in the HTTP servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
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

# After SIGTERM: how long the HTTP servers may take beyond --timeout (by then LitServe has answered each request
# still waiting with its 504); how long a connection taken has to start its request before it is closed unanswered;
# how long a handshake the port answered just before it stopped answering new ones has to complete.
GRACE_S = 30
REQUEST_START_S = 5.0
HANDSHAKE_S = 0.05


# Tell the person what the command is doing, at once (the server's log may be a file, not a terminal).
say = functools.partial(print, flush=True)


_REQUESTED = threading.Event()  # set by SIGTERM, once catch_sigterm() has been called
_PID: int | None = None  # the process that caught it; a process forked from it did not


def catch_sigterm() -> None:
    """From now on SIGTERM sets an event: what the command was doing stops where ``sigterm_received()`` is checked."""
    global _PID
    _PID = os.getpid()
    signal.signal(signal.SIGTERM, _on_sigterm)


sigterm_received = _REQUESTED.is_set


def _on_sigterm(signum, frame) -> None:
    if os.getpid() != _PID:  # a process LitServe forked, which inherited this handler
        manager = not multiprocessing.current_process().name.startswith(HTTP_PROCESS_PREFIX)
        if manager and os.getppid() == _PID and not (_GUARD is not None and _GUARD.allowed.is_set()):
            return  # LitServe's manager, SIGTERM'd with the server's whole group: the server ends it when done
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # an HTTP server before uvicorn's handlers: as if it had none
        signal.raise_signal(signal.SIGTERM)
        return
    _REQUESTED.set()


_GUARD: ModelProcessGuard | None = None  # the server's, read by LitServe's manager (forked)


class ModelProcessGuard:
    """A model process (and LitServe's manager) ends on SIGTERM only once the server ``allowed`` it, or has gone: a
    SIGTERM to the server's whole group (SLURM's ``scancel``, systemd's stop) would otherwise end them while the
    HTTP servers still wait for their answers."""

    def __init__(self) -> None:
        self.allowed = multiprocessing.get_context("spawn").Event()  # handed to the model processes it spawns
        self._server = os.getpid()

    def install(self) -> None:
        """In the model process (``LitAPI.setup``)."""
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        if self.allowed.is_set() or os.getppid() != self._server:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)


class StopRequestedError(Exception):
    """SIGTERM came before the HTTP servers started: none is started."""


class WorkerEndedError(Exception):
    """A model process failed to load the model, or ended while the server started: its exit code (``args[0]``),
    None where its error is in the log."""


class Stopper:
    """Runs a ``LitServer`` until SIGTERM or Ctrl-C, then stops it."""

    def __init__(self, stop_s: float) -> None:
        self.server, self.stop_s = None, stop_s
        self.model_processes = ModelProcessGuard()  # for the LitAPI, which installs it in each model process
        global _GUARD
        _GUARD = self.model_processes  # LitServe's manager, forked from this process, takes SIGTERM by it too
        self.stopping = threading.Event()  # the server is stopping: LitServe's noise about it is no error
        self.finished = threading.Event()  # the main thread is out of LitServer.run

    def run(self, server, **options) -> None:
        """``server.run(**options)`` (``server`` of ``server_class()``) in the main thread."""
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
                stopping.join()  # it says it is stopping before this thread says it stopped
            self.model_processes.allowed.set()
            end_children()

    def _on_sigint(self, signum, frame) -> None:
        self.model_processes.allowed.set()  # LitServe's shutdown on Ctrl-C ends them with SIGTERM
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
        self.model_processes.allowed.set()  # the HTTP servers have answered what they took
        request_shutdown(self.server)  # LitServe's own shutdown ends the model's processes and its manager
        if not self.finished.wait(max(0.0, deadline - time.monotonic())):
            say(f"error: the server did not stop within {self.stop_s:.0f} s of SIGTERM: its processes are killed")
            for child in multiprocessing.active_children():
                child.kill()
            os._exit(1)

    def shutdown_noise(self, record: logging.LogRecord) -> bool:
        """A filter of LitServe's log: drops what it logs while the server stops (its queues closing, its HTTP
        servers gone)."""
        if not self.stopping.is_set():
            return True
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, ConnectionError | EOFError) and "Already not alive" not in record.getMessage()

    def server_class(self) -> type:
        """A ``LitServer`` whose HTTP servers drain on SIGTERM, and whose start-up stops where a model process
        failed or ended (LitServe 0.2.19 would wait for ever), or where SIGTERM came."""
        WorkerSetupStatus, guard = setup_status(), self.model_processes

        class DrainingServer(http_server_base()):
            """uvicorn's server as LitServe runs it; the first says ``ready`` once its port takes connections.

            On SIGTERM it stops answering new connections, takes those already queued, shuts the port for every
            process (later ones are refused, not reset), waits for each connection taken to start its request, then
            shuts down as uvicorn does.
            """

            def __init__(self, *args, **kwargs) -> None:
                if _REQUESTED.is_set():  # SIGTERM after the model processes were ready: none is started
                    guard.allowed.set()  # LitServe ends them now
                    raise StopRequestedError
                super().__init__(*args, **kwargs)

            async def startup(self, sockets=None) -> None:
                if self.should_exit:  # SIGTERM'd before it started: it does not listen
                    return
                await super().startup(sockets)
                if self.started and not self.should_exit and os.environ.get(HTTP_SERVER_ID) == "0":
                    say(self.config.app.state.ready_line)

            async def shutdown(self, sockets=None) -> None:
                listeners = [sock.dup() for sock in sockets or []]
                for server in self.servers:
                    server.close()  # asyncio stops accepting (and closes its own copy of the port)
                loop = asyncio.get_running_loop()
                protocol = functools.partial(
                    self.config.http_protocol_class,
                    config=self.config,
                    server_state=self.server_state,
                    app_state=self.lifespan.state,
                )
                for listener in listeners:
                    drop_new_handshakes(listener)
                    listener.setblocking(False)
                    while (connection := await _queued(listener)) is not None:
                        await loop.connect_accepted_socket(protocol, connection)
                    with contextlib.suppress(OSError):  # another of the HTTP servers has stopped it
                        listener.shutdown(socket.SHUT_RDWR)  # the port, in every process that holds it
                    listener.close()
                # uvicorn's shutdown closes a connection that has not started a request (its client may be sending
                # one: it would be reset): wait for each to start, bounded.
                deadline = loop.time() + REQUEST_START_S
                while loop.time() < deadline and any(
                    getattr(connection, "cycle", True) is None for connection in self.server_state.connections
                ):
                    await asyncio.sleep(0.02)
                await super().shutdown(sockets)

        class Server(server_class(DrainingServer)):
            def verify_worker_status(self) -> None:
                """LitServe's wait for its model processes: for every one (not the first), not for ever."""
                while not _REQUESTED.is_set():
                    stages = list(self.workers_setup_status.values())
                    ended = [worker.exitcode for worker in self.inference_workers if worker.exitcode is not None]
                    if WorkerSetupStatus.ERROR in stages or ended:
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
    handshake completed between the last ``accept`` and the shutdown would be reset. Linux only.
    """
    if sys.platform != "linux":
        return
    program = b"".join(struct.pack("HBBI", *instruction) for instruction in _DROP_SYN)
    code = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HL", len(_DROP_SYN), ctypes.addressof(code))  # struct sock_fprog {len; filter*}
    with contextlib.suppress(OSError):
        listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


async def _queued(listener: socket.socket) -> socket.socket | None:
    """The next connection queued at the non-blocking ``listener``, looked for once more after ``HANDSHAKE_S`` (a
    handshake answered before the filter completes within a round trip); None when none is, or the port is shut."""
    for wait in (0, HANDSHAKE_S):
        await asyncio.sleep(wait)
        with contextlib.suppress(OSError):  # BlockingIOError: none is queued
            return listener.accept()[0]
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
