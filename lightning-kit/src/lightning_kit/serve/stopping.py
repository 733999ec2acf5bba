"""How the server runs and stops: SIGTERM answers every request taken, then ends every process the server started.

LitServe (0.2.19) runs no SIGTERM handler of its own, and its shutdown closes the model's queues before the HTTP
servers, so requests in flight would go unanswered. ``Stopper`` runs ``LitServer.run`` in the main thread; on SIGTERM
a thread of its own sends SIGTERM to the HTTP servers (LitServe's ``LitServer-<n>`` processes), on which uvicorn
answers every request it took, waits for them, then sets LitServe's shutdown event: ``LitServer.run`` then stops the
model's processes and returns. Should the server not have stopped ``stop_s`` seconds after SIGTERM, its processes
are killed and it exits 1.

The signal handler (``catch_sigterm``) only sets an event: an exception raised from a handler lands wherever the
main thread is, in LitServe's start-up too, where a finalizer could drop it (the server then served on, ignoring
SIGTERM). A SIGTERM during an export stops the command once the export is done; during LitServe's start-up, where it
creates its HTTP servers. Ctrl-C is LitServe's own (uvicorn's in the HTTP servers).
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
    model_processes,
    request_shutdown,
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
    """Raised in the main thread where LitServe creates an HTTP server, once SIGTERM has come: none is started."""


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
        self.http_servers_created = 0  # counted in the main thread, before LitServe forks each one's process
        self.worker_ended: int | None = None  # the exit code of a model process that ended during the start-up

    def run(self, server, **options) -> None:
        """``server.run(**options)`` in the main thread; ``WorkerEndedError`` where a model process ended during the
        start-up, unless SIGTERM came first."""
        self.server = server
        catch_sigterm()
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where Ctrl-C is ignored
            signal.signal(signal.SIGINT, self._on_sigint)
        stopping = threading.Thread(target=self._stop_when_asked, name="serve-stopper", daemon=True)
        stopping.start()
        threading.Thread(target=self._watch_the_start_up, name="serve-start-watch", daemon=True).start()
        try:
            if not _REQUESTED.is_set():  # SIGTERM before: LitServe is not started
                server.run(**options)
        except StopRequestedError:  # SIGTERM before the HTTP servers started: LitServe stopped its model processes
            pass
        except KeyboardInterrupt:  # Ctrl-C before the HTTP servers started: LitServe leaves its processes to us
            self.stopping.set()
        except RuntimeError:  # LitServe's "workers failed to start": a model process failed, or ended
            if self.worker_ended is not None and _REQUESTED.is_set():
                pass  # ended by the SIGTERM that stops the server
            elif self.worker_ended is not None or self._a_start_failed():
                raise WorkerEndedError(self.worker_ended) from None
            else:
                raise
        finally:
            self.finished.set()
            if _REQUESTED.is_set():
                stopping.join()  # it has said it is stopping (before this thread says it stopped), and has done
            self.model_processes.allow()
            end_children()

    def _a_start_failed(self) -> bool:
        with contextlib.suppress(Exception):  # the manager is gone
            return setup_status().ERROR in list(self.server.workers_setup_status.values())
        return False

    def _on_sigint(self, signum, frame) -> None:
        self.model_processes.allow()  # LitServe's shutdown on Ctrl-C ends them with SIGTERM
        signal.default_int_handler(signum, frame)

    def _watch_the_start_up(self) -> None:
        """Until the HTTP servers are created: a model process that ended before it was ready is marked failed,
        so that LitServe stops waiting for it (it waits for a process to be ready, or to say it failed)."""
        WorkerSetupStatus = setup_status()
        while not self.finished.wait(0.1) and not self.http_servers_created:
            for worker in model_processes(self.server):
                if worker.exitcode is None:
                    continue
                self.worker_ended = worker.exitcode
                with contextlib.suppress(Exception):  # the manager is gone: LitServe has stopped already
                    status = self.server.workers_setup_status
                    for key, stage in list(status.items()):
                        if stage != WorkerSetupStatus.READY:
                            status[key] = WorkerSetupStatus.ERROR
                return

    def _stop_when_asked(self) -> None:
        _REQUESTED.wait()
        self.stopping.set()
        deadline = time.monotonic() + self.stop_s
        say("stopping: answering the requests taken, refusing new connections")
        told: dict[int, multiprocessing.Process] = {}
        # Every HTTP server created is told, the one whose process was being started as SIGTERM came included; none
        # is created after it (StopRequestedError).
        while not self.finished.is_set() and len(told) < self.http_servers_created and time.monotonic() < deadline:
            for child in multiprocessing.active_children():
                if child.name.startswith(HTTP_PROCESS_PREFIX) and child.pid not in told:
                    os.kill(child.pid, signal.SIGTERM)
                    told[child.pid] = child
            self.finished.wait(0.01)
        for child in told.values():
            child.join(max(0.0, deadline - time.monotonic()))
        if told:  # the HTTP servers have answered what they took (in the start-up, StopRequestedError allows it)
            self.model_processes.allow()
        request_shutdown(self.server)
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

    def http_server_class(self):
        """uvicorn's server as LitServe runs it (``upstream.litserve``), which on SIGTERM answers every connection
        it had taken: the HTTP servers of a ``upstream.litserve.server_class(...)``."""
        WorkerSetupStatus = setup_status()
        stopper = self

        class DrainingServer(http_server_base()):
            """Takes requests once every model worker is ready (the first then prints ``ready``); not created once
            SIGTERM has come (StopRequestedError: LitServe stops its model processes).

            On SIGTERM it stops answering new connections (``drop_new_handshakes``), takes those already queued
            (their clients are sending), shuts the port for every process (later ones are refused, not reset), waits
            until each connection taken has started its request (at most ``REQUEST_START_S``), then shuts down as
            uvicorn does: each request started is answered, idle connections are closed.
            """

            def __init__(self, *args, **kwargs) -> None:
                if _REQUESTED.is_set():
                    stopper.model_processes.allow()  # LitServe ends them now
                    raise StopRequestedError
                super().__init__(*args, **kwargs)
                stopper.http_servers_created += 1

            async def startup(self, sockets=None) -> None:
                state = self.config.app.state
                status = state.lit_server.workers_setup_status
                ready = False
                while not self.should_exit and not ready:  # SIGTERM meanwhile: stop at once
                    stages = list(status.values())
                    ready = bool(stages) and all(stage == WorkerSetupStatus.READY for stage in stages)
                    if WorkerSetupStatus.ERROR in stages:
                        break  # LitServe stops the server
                    if not ready:
                        await asyncio.sleep(0.05)
                await super().startup(sockets)
                # Said once the port takes connections (the socket listens from here on), by the first HTTP server.
                if ready and self.started and os.environ.get(HTTP_SERVER_ID) == "0":
                    say(state.ready_line)

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

        return DrainingServer


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
