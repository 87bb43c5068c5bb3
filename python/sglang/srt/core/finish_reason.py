"""Why a request ended, in upstream's JSON shapes (`finish_reason` of `meta_info`)."""

from __future__ import annotations

from typing import Optional

# Upstream's user-visible texts of aborts.
ABORT_IN_QUEUE_MESSAGE = "Abort in waiting queue"
ABORT_RUNNING_MESSAGE = "Aborted"
QUEUE_FULL_MESSAGE = "The request queue is full."
QUEUED_TIMEOUT_MESSAGE = "Request waiting timeout reached."
RUNNING_TIMEOUT_MESSAGE = "Request running timeout reached."



class BaseFinishReason:
    def __init__(self, is_error: bool = False):
        self.is_error = is_error

    def to_json(self) -> dict:
        raise NotImplementedError


class FINISH_MATCHED_TOKEN(BaseFinishReason):
    def __init__(self, matched):
        super().__init__()
        self.matched = matched

    def to_json(self):
        return {"type": "stop", "matched": self.matched}


class FINISH_MATCHED_STR(BaseFinishReason):
    def __init__(self, matched: str):
        super().__init__()
        self.matched = matched

    def to_json(self):
        return {"type": "stop", "matched": self.matched}


class FINISH_LENGTH(BaseFinishReason):
    def __init__(self, length: int):
        super().__init__()
        self.length = length

    def to_json(self):
        return {"type": "length", "length": self.length}


class FINISH_ABORT(BaseFinishReason):
    def __init__(self, message: str = "Unknown error", status_code: Optional[int] = None, err_type: Optional[str] = None):
        super().__init__(is_error=True)
        self.message = message
        self.status_code = status_code
        self.err_type = err_type

    def to_json(self):
        return {"type": "abort", "message": self.message, "status_code": self.status_code, "err_type": self.err_type}
