# -*- test-case-name: tests.client.test_client_sync -*-
"""
The reactor thread behind the blocking face (L{lockservice.client.sync})
and the asyncio face (L{lockservice.client.aio}).

One private reactor per process -- not the global C{twisted.internet.reactor},
so it never clashes with an application that runs its own -- in one
daemon thread, started on first use and kept until interpreter exit (a
Twisted reactor cannot be restarted).  Every client call is handed to it
with C{callFromThread}; answers come back through a
C{concurrent.futures.Future}.

Why not crochet (a good library for "Twisted in a thread"): it runs the
global reactor (so a process that also runs Twisted itself must call
C{no_setup()} first), routes all of Twisted's logging to the stdlib, polls
for main-thread exit from a second thread, and has no answer to C{fork()}:
a child inherits C{setup()}'s "started" flag but not the thread, so every
call there hangs until its timeout.  We need ~150 lines, and these rules:

  - B{Forks.}  A client made before a fork belongs to the parent: in the
    child each of its calls raises L{ForkedClient} at once (its sockets are
    the parent's; using them would interleave two processes' requests).
    A client made in the child works: the child gets its own reactor
    thread on first use, whatever the parent did.
  - B{Exit.}  The thread is a daemon, so it never holds the interpreter
    up; at exit we close the clients still open (their connections end
    with a FIN, so the node drops their waiters at once) and stop the
    reactor, waiting L{EXIT_WAIT} seconds at most.  Calls still waiting
    then (only daemon threads are left at exit) are never answered: an
    answer would wake their thread to raise and print a traceback while
    the interpreter finalizes, which can abort it ("could not acquire
    lock for stderr at interpreter shutdown").
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import queue
import signal
import threading
import time
from typing import Any, Callable, Optional, Set, TypeVar

from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.python.failure import Failure

from lockservice.client.errors import ForkedClient

T = TypeVar("T")

# How long interpreter exit waits for open clients to close.
EXIT_WAIT = 2.0
START_WAIT = 10.0
# How often a thread waiting on the reactor thread wakes (see waitFor).
WAKE_EVERY = 0.05


def _newReactor() -> Any:
    """
    A reactor instance that is not installed as the global one.
    """
    try:
        from twisted.internet.epollreactor import EPollReactor

        return EPollReactor()
    except ImportError:  # not Linux
        from twisted.internet.pollreactor import PollReactor

        return PollReactor()


# Signals a thread raises itself (a fault): never blocked.
_SYNCHRONOUS = frozenset(getattr(signal, name) for name in
                         ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS")
                         if hasattr(signal, name))


def _blockSignals() -> None:
    """
    Leave every signal to the application's threads (the main thread runs
    Python's handlers).  A signal delivered to the reactor thread while
    the main thread waits for it (a blocking call) is one no thread can
    handle: the main thread is not woken, and CPython 3.11 then spins the
    reactor thread on the pending signal for ever (seen with a child
    process's SIGCHLD after it was stopped and continued).
    """
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _SYNCHRONOUS)


class ReactorThread:
    """
    A private reactor running in a daemon thread of this process.

    @ivar closers: what interpreter exit closes (open clients'
        C{close}, each returning a Deferred), called in the reactor thread.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.reactor = _newReactor()
        self.closers: Set[Callable[[], "Deferred[Any]"]] = set()
        # Set at interpreter exit: from then on no waiting call is answered.
        self.exiting = False
        self._running = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lockservice-reactor",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()
        if not self._running.wait(START_WAIT):
            raise RuntimeError("the lockservice reactor thread did not start")

    def _run(self) -> None:
        _blockSignals()
        self.reactor.callWhenRunning(self._running.set)
        self.reactor.run(installSignalHandlers=False)

    def check(self, what: str = "this client") -> None:
        """
        @raise ForkedClient: in a child process that inherited this thread.
        """
        if os.getpid() != self.pid:
            raise ForkedClient(
                f"{what} was made in process {self.pid}, before a fork; a client cannot "
                f"cross a fork (its connections stay with the parent). Make a new client "
                f"in this process (pid {os.getpid()}), after the fork.")

    def submit(self, f: Callable[..., Any], *args: Any,
               onAbandon: Optional[Callable[[Any], None]] = None,
               cancellable: bool = True, **kwargs: Any) -> "concurrent.futures.Future[Any]":
        """
        Run C{f(*args, **kwargs)} in the reactor thread; the future gets its
        result (the result of its Deferred, if it returns one).

        Cancelling the future cancels that Deferred (when C{cancellable}).
        A result that arrives once the future is cancelled is given to
        C{onAbandon}, in the reactor thread (a grant to release).
        """
        self.check()
        if threading.current_thread() is self.thread:
            raise RuntimeError("a blocking lockservice call from inside its own reactor thread")
        future: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        running: "list[Deferred[Any]]" = []

        def succeeded(value: Any) -> None:
            if self.exiting:
                return
            try:
                future.set_result(value)
            except concurrent.futures.InvalidStateError:  # cancelled meanwhile
                if onAbandon is not None:
                    onAbandon(value)

        def failed(failure: Failure) -> None:
            if self.exiting:
                return
            try:
                future.set_exception(failure.value)
            except concurrent.futures.InvalidStateError:
                pass

        def run() -> None:
            d = maybeDeferred(f, *args, **kwargs)
            running.append(d)
            d.addCallbacks(succeeded, failed)
            if future.cancelled() and cancellable:
                d.cancel()

        def cancelRunning() -> None:
            for d in running:
                d.cancel()

        def whenDone(done: "concurrent.futures.Future[Any]") -> None:
            # Queued behind run(), so `running` is filled by then.
            if done.cancelled() and cancellable:
                self.reactor.callFromThread(cancelRunning)

        future.add_done_callback(whenDone)
        self.reactor.callFromThread(run)
        return future

    def call(self, f: Callable[..., Any], *args: Any, timeout: Optional[float] = None,
             onAbandon: Optional[Callable[[Any], None]] = None,
             cancellable: bool = True, **kwargs: Any) -> Any:
        """
        L{submit}, then wait for the result in this thread.  An interrupted
        wait (KeyboardInterrupt, a timeout) cancels the call.
        """
        future = self.submit(f, *args, onAbandon=onAbandon, cancellable=cancellable, **kwargs)
        try:
            return waitFor(future, timeout)
        except BaseException:
            future.cancel()
            raise


def waitFor(future: "concurrent.futures.Future[T]", timeout: Optional[float] = None) -> T:
    """
    C{future.result(timeout)}, waking every L{WAKE_EVERY} seconds meanwhile.

    A signal that reaches the main thread just before it starts to wait
    (a SIGCHLD from a child process that stopped, continued or exited) is
    handled only when that thread runs Python code again, and until then
    CPython 3.11 interrupts every other thread at every instruction; under
    a tracer (coverage, a debugger) the reactor thread then made no
    progress at all, so a call waited on never finished (the test of a
    lost lease hung in 2 runs of 6 under coverage).  Waking lets the
    signal be handled within L{WAKE_EVERY}.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = WAKE_EVERY if deadline is None else max(0.0, min(WAKE_EVERY,
                                                                deadline - time.monotonic()))
        try:
            return future.result(wait)
        except concurrent.futures.TimeoutError:
            if future.done() or (deadline is not None and time.monotonic() >= deadline):
                raise  # the call's own error, or the caller's timeout


def waitForQueue(items: "queue.Queue[T]", timeout: Optional[float] = None) -> T:
    """
    C{items.get(timeout=timeout)}, waking every L{WAKE_EVERY} seconds
    meanwhile (see L{waitFor}).

    @raise queue.Empty: nothing came within C{timeout}.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = WAKE_EVERY if deadline is None else max(0.0, min(WAKE_EVERY,
                                                                deadline - time.monotonic()))
        try:
            return items.get(timeout=wait)
        except queue.Empty:
            if deadline is not None and time.monotonic() >= deadline:
                raise


_lock = threading.Lock()
_current: Optional[ReactorThread] = None


def current() -> ReactorThread:
    """
    This process's reactor thread, started on first use (again in a forked
    child: the parent's thread did not come along).
    """
    global _current
    with _lock:
        if _current is None or _current.pid != os.getpid():
            thread = ReactorThread()
            thread.start()
            _current = thread
        return _current


def _beforeFork() -> None:
    _lock.acquire()


def _afterForkInParent() -> None:
    _lock.release()


def _afterForkInChild() -> None:
    # The parent's reactor thread does not exist here; its objects are left
    # alone (closing them could touch the parent's sockets' shared state).
    global _lock
    _lock = threading.Lock()


os.register_at_fork(before=_beforeFork, after_in_parent=_afterForkInParent,
                    after_in_child=_afterForkInChild)


def _atExit() -> None:
    thread = _current
    if thread is None or thread.pid != os.getpid() or not thread.thread.is_alive():
        return
    thread.exiting = True

    def stop() -> None:
        closing = []
        for close in list(thread.closers):
            try:
                closing.append(close())
            except Exception:
                pass
        gatherResults(closing, consumeErrors=True).addBoth(lambda _: thread.reactor.stop())

    thread.reactor.callFromThread(stop)
    thread.thread.join(EXIT_WAIT)


atexit.register(_atExit)
