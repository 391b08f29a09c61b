"""The judge's HTTP answers, bounded: a decoded size and a total deadline.

A judge is a server we do not control, so its answer is untrusted input. httpx decompresses a
``Content-Encoding: gzip`` body whole (4.7 MB on the wire can be 1 GiB in memory) and its
``timeout`` bounds each read, not the call (a server dripping a byte every few seconds holds a
call for minutes). :class:`BoundedTransport` wraps httpx's own transport and reads the body itself:

- decoded as it arrives (``gzip``/``deflate`` through ``zlib`` with an output cap; nothing else is
  offered in ``Accept-Encoding``, and a body in any other encoding is refused), and refused as soon
  as it passes ``max_bytes`` decoded;
- refused when it is not complete ``deadline_s`` after the request was sent (checked as each piece
  arrives; each read itself is bounded by the client's ``timeout``).

A refusal raises an ``httpx`` error, which the ``openai`` client reports as a failed call; the
judge retries it like any other and, after ``max_attempts``, fails the group.
"""

from __future__ import annotations

import time
import zlib

import httpx

__all__ = ["BoundedTransport", "MAX_ANSWER_BYTES"]

#: The most a judge's answer may take decoded: a chat completion of the judge's ``max_tokens`` is
#: kilobytes; this leaves room for verbose servers and refuses bombs.
MAX_ANSWER_BYTES = 4 * 2**20

_DECODED = {"gzip", "x-gzip", "deflate"}


class BoundedTransport(httpx.BaseTransport):
    """httpx's transport, with each response body read whole within ``max_bytes`` (decoded) and
    ``deadline_s`` (from the request's start); see the module docstring."""

    def __init__(self, *, max_bytes: int = MAX_ANSWER_BYTES, deadline_s: float, inner: httpx.BaseTransport | None = None) -> None:
        if max_bytes < 1 or not deadline_s > 0:
            raise ValueError(f"max_bytes must be >= 1 and deadline_s > 0; got {max_bytes}, {deadline_s}")
        self.max_bytes = max_bytes
        self.deadline_s = deadline_s
        self._inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = time.monotonic() + self.deadline_s
        request.headers["Accept-Encoding"] = "gzip, deflate"  # only what is decoded here, within bounds
        response = self._inner.handle_request(request)
        try:
            body = self._read(response, request, deadline)
        finally:
            response.close()
        # The body is decoded already: httpx must not decode it again, nor trust the old length.
        skip = {"content-encoding", "content-length", "transfer-encoding"}
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in skip]
        return httpx.Response(response.status_code, headers=headers, content=body, request=request)

    def _read(self, response: httpx.Response, request: httpx.Request, deadline: float) -> bytes:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in _DECODED | {"identity", ""}:
            raise httpx.DecodingError(f"the judge answered in content encoding {encoding!r}, which was not asked for", request=request)
        # wbits 32+: zlib reads a gzip or a zlib header, whichever the body has.
        inflater = zlib.decompressobj(wbits=32 + zlib.MAX_WBITS) if encoding in _DECODED else None
        pieces: list[bytes] = []
        size = 0
        assert isinstance(response.stream, httpx.SyncByteStream)
        for chunk in response.stream:
            if inflater is not None:
                try:
                    # At most one byte past the bound is inflated: enough to know it is passed.
                    chunk = inflater.decompress(chunk, self.max_bytes - size + 1)
                except zlib.error as exc:
                    raise httpx.DecodingError(f"the judge's answer is not valid {encoding} ({exc})", request=request) from None
            size += len(chunk)
            if size > self.max_bytes:
                raise httpx.DecodingError(
                    f"the judge's answer is over {self.max_bytes:,} bytes decoded: refused", request=request
                )
            pieces.append(chunk)
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout(
                    f"the judge's answer was not complete within timeout_s={self.deadline_s:g} s", request=request
                )
        return b"".join(pieces)

    def close(self) -> None:
        self._inner.close()
