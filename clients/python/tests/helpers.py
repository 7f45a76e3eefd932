"""Interceptors that make the network misbehave for one client."""

import threading

import grpc


class FakeRpcError(grpc.RpcError):
    """What a failed call raises, made up on the client side."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self):
        return self._code

    def details(self):
        return self._details


class DropReplies(grpc.UnaryUnaryClientInterceptor):
    """Sends the first ``count`` calls of ``method`` for real, then throws
    their replies away and reports UNAVAILABLE, as if the connection broke
    after the server answered. ``dropped`` keeps the lost replies."""

    def __init__(self, method: str, count: int = 1):
        self.method = method
        self.count = count
        self.dropped = []
        self.calls = []
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation, details, request):
        if not details.method.endswith(self.method):
            return continuation(details, request)
        with self._lock:
            self.calls.append(request)
        call = continuation(details, request)
        with self._lock:
            drop = len(self.dropped) < self.count
        if drop:
            reply = call.result()  # the server did answer
            with self._lock:
                self.dropped.append(reply)
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "reply lost on the way back")
        return call


class Partition(grpc.UnaryUnaryClientInterceptor):
    """While ``cut`` is set, calls whose method name contains ``method`` fail with UNAVAILABLE without
    reaching any node (this client is cut off for them)."""

    def __init__(self, method: str):
        self.method = method
        self.cut = threading.Event()
        self.refused = 0

    def intercept_unary_unary(self, continuation, details, request):
        if self.cut.is_set() and self.method in details.method:
            self.refused += 1
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "cut off (test)")
        return continuation(details, request)
