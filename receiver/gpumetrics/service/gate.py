"""The server interceptor every call passes: authentication, stream slots, malformed requests.

One :class:`Gatekeeper` per ``grpc.Server``, all of them sharing one :class:`StreamTable`:

1. **Authentication** (:mod:`gpumetrics.service.auth`): the service's :class:`AuthPolicy` is
   checked against the call's bearer token; a refused call never reaches a servicer and is
   answered UNAUTHENTICATED or PERMISSION_DENIED. The check runs in grpcio's polling thread
   (it must be quick: a dictionary lookup and constant-time compares).
2. **Stream slots, per service, for every listener together.** In grpcio's synchronous server
   each open streaming call holds a worker thread for its whole life (style item 14; grpc PR
   #17747). So every service with streaming methods (the profiler's ``StreamDeclarations``,
   reflection, go-plugin's ``StreamStdio``) gets its own :class:`StreamSlots`: ``max_streams``
   slots and a thread pool of its own (grpcio's per-method ``experimental_thread_pool``), one
   thread more than its slots, so one stream beyond the limit is refused with RESOURCE_EXHAUSTED
   at once. The slots are the :class:`StreamTable`'s, shared by the Gatekeepers of every server
   of the sidecar: a service served on two listeners (reflection on the main and the profiler
   socket) has ``max_streams`` slots in all, and reflection's ``v1`` and ``v1alpha`` (one
   servicer) share theirs. Streams never run on the servers' pool, which keeps its
   ``unary_workers`` threads for Pull, Check and declarations, and one service's streams (four
   idle reflection streams, say) never take another's slots. Health ``Watch`` is non-blocking
   (it holds no thread) and is not counted.
3. **Malformed and oversized requests.** grpcio answers a request it cannot parse with INTERNAL;
   here the parse error becomes INVALID_ARGUMENT naming the message type, before any servicer
   code runs. A request whose type can hold repeated fields is first counted on the wire
   (:mod:`gpumetrics.service.wirecount`): one of more than ``max_elements`` repeated elements
   is answered RESOURCE_EXHAUSTED without being parsed, so its parsed form stays near its wire
   size.

Refusals are counted in ``gpumetrics.server.rejected_calls{rpc.method, reason}`` and logged at
WARNING the first time for each method, refusal message (a missing token and a wrong one are two)
and consumer (a Pull's ``consumer``, else the ``gpumetrics-declarer`` metadata), then at DEBUG;
at most 256 such keys are remembered, so an unauthenticated client cannot grow the set.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from typing import Any

import grpc

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.service.auth import AuthPolicy, Denial, TokenAuth
from gpumetrics.service.names import service_of
from gpumetrics.service.profiler import DECLARER_METADATA_KEY
from gpumetrics.service.settings import REQUEST_BYTES_PER_ELEMENT
from gpumetrics.service.wirecount import Shape, TooManyElements, count_elements, shape_of

log = logging.getLogger(__name__)

_LOGGED_MAX = 256
_NAME_MAX = 128  # the longest consumer or declarer name the services accept


def join_pool(pool: futures.ThreadPoolExecutor, deadline: float | None) -> bool:
    """Shut ``pool`` down (queued work cancelled) and join its threads by ``deadline``.

    ``ThreadPoolExecutor.shutdown(wait=True)`` has no timeout, and a thread still in a call that
    ignores cancellation would hold a shutdown for ever; the threads are joined one by one
    against ``deadline`` (``time.monotonic()``; None: not at all) instead, so a stopped server
    leaves no thread behind (a test's or a restart's) without risking the shutdown budget.

    Returns:
        True when every thread the pool started has ended.

    """
    pool.shutdown(wait=False, cancel_futures=True)
    threads = list(getattr(pool, "_threads", ()))  # CPython's set of the pool's workers
    for thread in threads:
        if deadline is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


class _Malformed:
    """What the tolerant parser returns instead of a request it refused (``error`` says why)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class StreamSlots:
    """Counts the open streaming calls of one service against a limit, on threads of their own.

    Args:
        limit: most streaming calls open at once (>= 1).
        name: the service (names the pool's threads).

    Attributes:
        pool: the threads the service's streams run on (``limit + 1``: the extra one refuses a
            stream beyond the limit at once). Created threads stay until :meth:`close`.

    """

    def __init__(self, limit: int, name: str = "streams") -> None:
        if limit < 1:
            raise ValueError(f"max_streams: must be >= 1, got {limit}")
        self.limit = limit
        self._cond = threading.Condition()
        self._open = 0
        self.pool = futures.ThreadPoolExecutor(
            max_workers=limit + 1, thread_name_prefix=f"grpc-{name.rsplit('.', 1)[-1]}"
        )

    def close(self, deadline: float | None = None) -> bool:
        """End the pool's threads once their calls have (the server has stopped).

        Args:
            deadline: ``time.monotonic()`` by which to have joined them (None: do not wait).

        Returns:
            True when every thread of the pool has ended.

        """
        return join_pool(self.pool, deadline)

    @property
    def open(self) -> int:
        """Streaming calls open now."""
        with self._cond:
            return self._open

    def try_enter(self) -> bool:
        """Take a slot; False when all are taken."""
        with self._cond:
            if self._open >= self.limit:
                return False
            self._open += 1
            return True

    def leave(self) -> None:
        """Give a slot back."""
        with self._cond:
            self._open -= 1
            self._cond.notify_all()

    def wait_open_at_most(self, n: int, timeout: float) -> bool:
        """Wait until at most ``n`` streams are open; False if ``timeout`` s passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._open <= n, timeout)


class StreamTable:
    """The :class:`StreamSlots` of every streaming service, for every server that shares it.

    Args:
        limit: ``max_streams``: streaming calls open at once per service, all listeners
            together (>= 1).
        same_slots: service → the service whose slots it uses (reflection ``v1`` →
            ``v1alpha``: one servicer under two names).

    A service's slots are made on its first stream and kept until :meth:`close`.

    """

    def __init__(self, limit: int, same_slots: Mapping[str, str] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"max_streams: must be >= 1, got {limit}")
        self.limit = limit
        self._same = dict(same_slots or {})
        self._slots: dict[str, StreamSlots] = {}
        self._lock = threading.Lock()

    def slots(self, service: str) -> StreamSlots:
        """Return the stream slots of ``service`` (made on first use)."""
        key = self._same.get(service, service)
        with self._lock:
            slots = self._slots.get(key)
            if slots is None:
                slots = self._slots[key] = StreamSlots(self.limit, key)
            return slots

    def _every(self) -> list[StreamSlots]:
        with self._lock:
            return list(self._slots.values())

    @property
    def open(self) -> int:
        """Streaming calls open now, all services together."""
        return sum(s.open for s in self._every())

    def wait_closed(self, timeout: float) -> bool:
        """Wait until no streaming call is open; False if ``timeout`` s passed first."""
        return all(s.wait_open_at_most(0, timeout) for s in self._every())

    def close(self, deadline: float | None = None) -> bool:
        """Release the stream threads (after every server sharing the table has stopped).

        Args:
            deadline: ``time.monotonic()`` by which to have joined them (None: do not wait).

        Returns:
            True when every stream thread has ended.

        """
        ended = [s.close(deadline) for s in self._every()]
        return all(ended)


class Gatekeeper(grpc.ServerInterceptor):
    """Authentication, stream slots and malformed-request handling for one ``grpc.Server``.

    Args:
        auth: the configured tokens.
        policies: service name → policy; services not listed get ``default_policy``.
        streams: the stream slots, shared with the other servers' Gatekeepers (the caller
            closes it once every server has stopped).
        telemetry: receives ``gpumetrics.server.rejected_calls``.
        default_policy: policy of services not in ``policies`` (default: either token).
        max_elements: repeated elements a request may hold
            (:mod:`gpumetrics.service.wirecount`); None: not counted.

    """

    def __init__(
        self,
        auth: TokenAuth,
        policies: Mapping[str, AuthPolicy],
        streams: StreamTable,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        default_policy: AuthPolicy = AuthPolicy.ANY,
        max_elements: int | None = None,
    ) -> None:
        if max_elements is not None and max_elements < 1:
            raise ValueError(f"max_elements: must be >= 1, got {max_elements}")
        self._auth = auth
        self._policies = dict(policies)
        self._default = default_policy
        self.streams = streams
        self._max_elements = max_elements
        self._telemetry = telemetry
        self._logged_lock = threading.Lock()
        self._logged: set[tuple[str, str, str]] = set()

    def set_policy(self, service: str, policy: AuthPolicy) -> None:
        """Set the policy of ``service`` (before the server starts)."""
        self._policies[service] = policy

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: Any
    ) -> Any:
        """Return the method's handler wrapped, a refusing handler, or None (UNIMPLEMENTED)."""
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        policy = self._policies.get(service_of(method), self._default)
        metadata = handler_call_details.invocation_metadata
        denial = self._auth.check(policy, metadata)
        if denial is not None:
            self._count(method, denial.reason)
            declarer = _metadata_value(metadata, DECLARER_METADATA_KEY)
            return self._refusing(handler, method, denial, declarer)
        return self._wrap(handler, method, service_of(method))

    # -- refusing and counting ------------------------------------------------------------------

    def _count(self, method: str, reason: str, message: str | None = None) -> None:
        self._telemetry.add(
            "gpumetrics.server.rejected_calls",
            1,
            {"rpc.method": method.lstrip("/"), "reason": reason},
        )
        if message is not None:
            self._log_refusal(method, reason, message, "")

    def _log_refusal(
        self, method: str, why: str, message: str, consumer: str, peer: str = ""
    ) -> None:
        """Log a refusal at WARNING once per (method, ``why``, consumer), else at DEBUG."""
        key = (method, why, consumer)
        with self._logged_lock:
            first = key not in self._logged and len(self._logged) < _LOGGED_MAX
            if first:
                self._logged.add(key)
        who = f" from {peer}" if peer else ""
        who += f" (consumer {consumer!r})" if consumer else ""
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "refused %s%s: %s", method, who, message)

    def _refusing(self, handler: Any, method: str, denial: Denial, declarer: str) -> Any:
        """Return a handler shaped like ``handler`` that logs the refusal and answers it.

        A unary request is parsed (tolerantly) only to name its ``consumer`` in the log.
        """
        parse = (
            self._tolerant(handler.request_deserializer) if not handler.request_streaming else None
        )

        def refuse(request: Any, context: Any) -> Any:
            consumer = getattr(request, "consumer", "") or declarer
            name = consumer[:_NAME_MAX] if isinstance(consumer, str) else ""
            self._log_refusal(method, denial.message, denial.message, name, context.peer() or "")
            context.abort(denial.code, denial.message)

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(refuse)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse, parse)
        return grpc.unary_unary_rpc_method_handler(refuse, parse)

    # -- wrapping -------------------------------------------------------------------------------

    def _check(self, request: Any, context: Any, method: str) -> None:
        if not isinstance(request, _Malformed):
            return
        error = request.error
        if isinstance(error, TooManyElements):
            self._count(method, "too_many_elements", str(error))
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"request: {error} (server.max_receive_message_bytes / "
                f"{REQUEST_BYTES_PER_ELEMENT}); split it into smaller requests",
            )
        self._count(method, "malformed_request", str(error))
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request: not a valid message for {method}: {type(error).__name__}",
        )

    def _enter_stream(self, context: Any, method: str, slots: StreamSlots) -> None:
        if not slots.try_enter():
            self._count(method, "too_many_streams", "stream limit reached")
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{slots.limit} streams of {service_of(method)} are open "
                "(server.max_streams, all listeners together); retry later",
            )
        if not context.add_callback(slots.leave):
            slots.leave()  # the call had already ended

    def _checked_iter(self, requests: Iterator[Any], context: Any, method: str) -> Iterator[Any]:
        for request in requests:
            self._check(request, context, method)
            yield request

    def _wrap(self, handler: Any, method: str, service: str) -> Any:
        tolerant = self._tolerant(handler.request_deserializer)
        ser = handler.response_serializer
        check, checked = self._check, self._checked_iter
        streaming = handler.request_streaming or handler.response_streaming
        slots = self.streams.slots(service) if streaming else None

        def enter(context: Any, method: str) -> None:
            assert slots is not None
            self._enter_stream(context, method, slots)

        def own_threads(behavior: Any) -> Any:
            assert slots is not None
            behavior.experimental_thread_pool = slots.pool
            return behavior

        if not handler.request_streaming and not handler.response_streaming:
            uu = handler.unary_unary

            def unary_unary(request: Any, context: Any) -> Any:
                check(request, context, method)
                return uu(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, tolerant, ser)
        if not handler.request_streaming:
            us = handler.unary_stream
            if getattr(us, "experimental_non_blocking", False):

                def non_blocking(
                    request: Any, context: Any, send_response_callback: Any = None
                ) -> Any:
                    check(request, context, method)
                    return us(request, context, send_response_callback=send_response_callback)

                non_blocking.experimental_non_blocking = True  # type: ignore[attr-defined]
                non_blocking.experimental_thread_pool = getattr(  # type: ignore[attr-defined]
                    us, "experimental_thread_pool", None
                )
                return grpc.unary_stream_rpc_method_handler(non_blocking, tolerant, ser)

            def unary_stream(request: Any, context: Any) -> Any:
                check(request, context, method)
                enter(context, method)
                return us(request, context)

            return grpc.unary_stream_rpc_method_handler(own_threads(unary_stream), tolerant, ser)
        if not handler.response_streaming:
            su = handler.stream_unary

            def stream_unary(requests: Any, context: Any) -> Any:
                enter(context, method)
                return su(checked(requests, context, method), context)

            return grpc.stream_unary_rpc_method_handler(own_threads(stream_unary), tolerant, ser)
        ss = handler.stream_stream

        def stream_stream(requests: Any, context: Any) -> Any:
            enter(context, method)
            return ss(checked(requests, context, method), context)

        return grpc.stream_stream_rpc_method_handler(own_threads(stream_stream), tolerant, ser)

    def _tolerant(self, parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
        """Wrap a request parser: a refused request becomes a :class:`_Malformed`.

        Runs where grpcio parses requests: on the server's polling thread, one at a time.
        """
        if parse is None:
            return None
        limit = self._max_elements
        shape = _request_shape(parse) if limit is not None else None

        def tolerant(data: bytes) -> Any:
            try:
                if shape is not None and limit is not None:
                    count_elements(data, shape, limit)
                return parse(data)
            except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's bad input
                return _Malformed(exc)

        return tolerant


def _request_shape(parse: Callable[[bytes], Any]) -> Shape | None:
    """Return the wire shape of the type a generated ``Message.FromString`` parses, if any."""
    descriptor = getattr(getattr(parse, "__self__", None), "DESCRIPTOR", None)
    return _shape_of(descriptor) if descriptor is not None else None


@functools.lru_cache(maxsize=256)
def _shape_of(descriptor: Any) -> Shape | None:
    return shape_of(descriptor)  # once per request type: handlers are wrapped for every call


def _metadata_value(metadata: Any, key: str) -> str:
    for k, v in metadata or ():
        if k == key and isinstance(v, str):
            return v
    return ""
