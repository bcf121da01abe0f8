"""Who may hold the coordinator's handler threads, and for how long.

The coordinator serves every call from a fixed pool of threads. Without bounds, one caller could
hold all of them with idle streams and lock every participant out. :class:`CallGuard` (a gRPC
server interceptor) therefore, for every call and before any request message is read:

1. authenticates the caller from the call itself: the participant id it claims in the
   ``lensemble-participant`` metadata, checked against its bearer token (read by the interceptor,
   so a caller without a valid token never gets further) and its client certificate (checked
   first thing in the handler thread). The ids inside request messages must then match it;
2. counts the call against that participant's own allowance
   (``network.max_calls_per_participant``, at most one update upload): the pool holds that many
   threads per participant plus a few spare ones for refusals, so no participant can starve
   another;
3. arms a server-side deadline (:class:`Deadlines`): a call still running past it is cancelled,
   whatever deadline the caller asked for (or none), so an idle stream frees its thread.

Unary requests are read by the guard itself, under the deadline, after these checks: every
method is served as a request stream, so no thread ever blocks on a request of an unknown caller.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.identity import PARTICIPANT_KEY

#: Handler threads beyond the participants' allowances, for calls refused at once.
SPARE_THREADS = 8
#: RPCs a participant may have at most one of at a time.
SINGLE_CALLS = frozenset({"SubmitUpdate", "Join", "Presence"})


@dataclass(frozen=True)
class CallPolicy:
    """The guard's limits.

    Attributes:
        per_participant: Concurrent calls one participant may hold.
        deadline_s: Server-side deadline (seconds) of each method by name; a method not listed
            gets ``default_deadline_s``.
        default_deadline_s: Deadline of every other method (seconds).
    """

    per_participant: int
    deadline_s: Mapping[str, float]
    default_deadline_s: float

    def deadline_of(self, method: str) -> float:
        """Server-side deadline (seconds) of ``method``."""
        return self.deadline_s.get(method, self.default_deadline_s)


def pool_size(participants: int, per_participant: int) -> int:
    """Handler threads (and concurrent calls) of a coordinator: every allowance plus spares."""
    return participants * per_participant + SPARE_THREADS


class Deadlines:
    """Cancels calls that outlive their server-side deadline (one timer thread for all).

    A cancelled call's blocked read raises in its handler thread, and a streaming reply stops,
    so the thread returns to the pool.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # The heap holds (when, handle) only: a disarmed call's context is released at once.
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, tuple[float, Any]] = {}
        self._ids = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="rpc-deadlines", daemon=True)
        self._thread.start()

    def arm(self, context: Any, seconds: float) -> int:
        """Cancel ``context`` in ``seconds`` unless :meth:`disarm` comes first; returns a handle."""
        handle = next(self._ids)
        self.extend(handle, context, seconds)
        return handle

    def extend(self, handle: int, context: Any, seconds: float) -> None:
        """Move the deadline of ``handle`` to ``seconds`` from now."""
        when = time.monotonic() + seconds
        with self._cond:
            self._armed[handle] = (when, context)
            heapq.heappush(self._heap, (when, handle))
            self._cond.notify()

    def disarm(self, handle: int) -> None:
        """The call ended: forget its deadline."""
        with self._cond:
            self._armed.pop(handle, None)

    def stop(self) -> None:
        """End the timer thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            due = []
            with self._cond:
                if self._stopped:
                    return
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    when, handle = heapq.heappop(self._heap)
                    armed = self._armed.get(handle)
                    if armed is not None and armed[0] == when:  # not disarmed, not extended
                        del self._armed[handle]
                        due.append(armed[1])
                timeout = self._heap[0][0] - now if self._heap else None
                if not due:
                    self._cond.wait(timeout)
            for context in due:
                context.cancel()


class Allowances:
    """Per-participant counts of calls in flight."""

    def __init__(self, per_participant: int) -> None:
        self.per_participant = per_participant
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._single: set[tuple[str, str]] = set()

    def take(self, participant: str, method: str) -> str | None:
        """Count one call; returns why not when the participant is at its limit."""
        with self._lock:
            if self._calls[participant] >= self.per_participant:
                return (
                    f"participant '{participant}' already holds {self._calls[participant]} calls "
                    f"(network.max_calls_per_participant is {self.per_participant})."
                )
            if method in SINGLE_CALLS:
                if (participant, method) in self._single:
                    return f"participant '{participant}' already has a {method} call in flight."
                self._single.add((participant, method))
            self._calls[participant] += 1
            return None

    def give_back(self, participant: str, method: str) -> None:
        """The call ended."""
        with self._lock:
            self._calls[participant] -= 1
            if self._calls[participant] <= 0:
                del self._calls[participant]
            self._single.discard((participant, method))


def claimed_participant(context: Any) -> str:
    """The participant id a call claims in its metadata ("" when it claims none)."""
    for key, value in context.invocation_metadata() or ():
        if key == PARTICIPANT_KEY:
            return str(value)
    return ""


Refuse = Callable[[Any, str, str, grpc.StatusCode, str], None]


class CallGuard(grpc.ServerInterceptor):  # type: ignore[misc]
    """The interceptor described in the module docstring.

    Args:
        authenticator: Decides who a caller is.
        policy: Limits and deadlines.
        refuse: Ends a call: ``refuse(context, reason, message, status, method)`` aborts it
            with the reason in the trailing metadata (and counts it); it raises.
    """

    def __init__(self, authenticator: Authenticator, policy: CallPolicy, refuse: Refuse) -> None:
        self.auth = authenticator
        self.policy = policy
        self.allowances = Allowances(policy.per_participant)
        self.deadlines = Deadlines()
        self._refuse = refuse

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        """Wrap the method's handler (runs on gRPC's polling thread: cheap checks only)."""
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        metadata = {k: v for k, v in details.invocation_metadata or () if isinstance(v, str)}
        claimed = metadata.get(PARTICIPANT_KEY, "")
        early = self.auth.check(claimed, {}, metadata, certificate=False)
        if early is not None:
            reason, message = early.reason, early.message

            def refuse_now(request_iterator: Iterator[Any], context: Any) -> Any:
                self._refuse(context, reason, message, grpc.StatusCode.PERMISSION_DENIED, method)

            return _as_stream_handler(handler, refuse_now)
        return _as_stream_handler(handler, self._guarded(handler, method, claimed, metadata))

    def _guarded(
        self, handler: Any, method: str, claimed: str, metadata: Mapping[str, str]
    ) -> Callable[[Iterator[Any], Any], Any]:
        unary_request = not handler.request_streaming
        behaviour = _behaviour(handler)

        def admit(request_iterator: Iterator[Any], context: Any) -> Any:
            refusal = self.auth.check(claimed, context.auth_context(), metadata)
            if refusal is not None:
                self._refuse(
                    context,
                    refusal.reason,
                    refusal.message,
                    grpc.StatusCode.PERMISSION_DENIED,
                    method,
                )
            why = self.allowances.take(claimed, method)
            if why is not None:
                self._refuse(
                    context, nerr.TOO_MANY_CALLS, why, grpc.StatusCode.RESOURCE_EXHAUSTED, method
                )
            handle = self.deadlines.arm(context, self.policy.deadline_of(method))
            ended = threading.Event()

            def end() -> None:
                if ended.is_set():
                    return
                ended.set()
                self.deadlines.disarm(handle)
                self.allowances.give_back(claimed, method)

            if not context.add_callback(end):
                end()
            context.lensemble_deadline = (self.deadlines, handle)
            if not unary_request:
                return request_iterator
            request = next(request_iterator, None)
            if request is None:
                self._refuse(
                    context,
                    "bad_request",
                    f"the {method} call carried no request message.",
                    grpc.StatusCode.INVALID_ARGUMENT,
                    method,
                )
            return request

        if handler.response_streaming:

            def streaming(request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
                yield from behaviour(admit(request_iterator, context), context)

            return streaming

        def unary(request_iterator: Iterator[Any], context: Any) -> Any:
            return behaviour(admit(request_iterator, context), context)

        return unary

    def close(self) -> None:
        """Stop the deadline thread."""
        self.deadlines.stop()


def extend_deadline(context: Any, seconds: float) -> None:
    """Move the call's server-side deadline to ``seconds`` from now (a long upload)."""
    armed = getattr(context, "lensemble_deadline", None)
    if armed is not None:
        deadlines, handle = armed
        deadlines.extend(handle, context, seconds)


def _behaviour(handler: Any) -> Callable[[Any, Any], Any]:
    for name in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        found = getattr(handler, name)
        if found is not None:
            return found  # type: ignore[no-any-return]
    raise TypeError("a gRPC method handler without behaviour")


def _as_stream_handler(handler: Any, behaviour: Callable[[Iterator[Any], Any], Any]) -> Any:
    """``handler``'s method served as a request stream with ``behaviour``."""
    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            behaviour, handler.request_deserializer, handler.response_serializer
        )
    return grpc.stream_unary_rpc_method_handler(
        behaviour, handler.request_deserializer, handler.response_serializer
    )
