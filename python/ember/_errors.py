"""Errors raised by Ember's Python client."""

import enum


class StatusCode(enum.IntEnum):
    """gRPC's status codes, as Ember's shards and client return them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class EmberError(RuntimeError):
    """A failed Ember call: `code` is the gRPC status code, `message` the
    shard's or the client's message (it names the table, the field and the
    expected vs. received values)."""

    def __init__(self, code, message):
        try:
            self.code = StatusCode(code)
        except ValueError:
            self.code = StatusCode.UNKNOWN
        self.message = message
        super().__init__(f"{self.code.name}: {message}")
