"""A blocking HTTP/2 client over TLS (ALPN `h2`), for tests of the extender's HTTP/2: several
requests in flight on one connection, bodies sent within the server's flow-control windows,
and raw bytes when a test needs a broken frame."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events


@dataclass
class Reply:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: the error code of a RST_STREAM the server sent, if it reset the stream
    reset: int | None = None


class H2Client:
    def __init__(self, port: int, context: ssl.SSLContext, timeout_s: float = 30.0) -> None:
        context.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        #: the protocol the server chose ("h2" when it speaks HTTP/2)
        self.protocol = self.sock.selected_alpn_protocol()
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.replies: dict[int, Reply] = {}
        self._ended: set[int] = set()
        #: the server ended the connection (GOAWAY or EOF); `goaway`: with a GOAWAY first
        self.closed = False
        self.goaway = False
        self._flush()

    def send(self, method: str, path: str, body: bytes = b"",
             headers: tuple[tuple[str, str], ...] = (), end: bool = True,
             length: int | None = None) -> int:
        """Start a request; its stream id. `end=False` leaves the stream open (no body sent);
        `length`: the content-length to claim (default the body's)."""
        stream = self.conn.get_next_available_stream_id()
        self.replies[stream] = Reply()
        self.conn.send_headers(stream, [
            (":method", method), (":path", path), (":scheme", "https"),
            (":authority", "localhost"), *headers,
            *([("content-length", str(len(body) if length is None else length))]
              if body or length is not None else [])],
            end_stream=end and not body)
        self._flush()
        view = memoryview(body)
        while view:
            window = min(self.conn.local_flow_control_window(stream),
                         self.conn.max_outbound_frame_size)
            if window <= 0:
                if not self._read_some() or stream in self._ended:
                    return stream  # the server answered (or reset) before taking it all
                continue
            chunk, view = view[:window], view[window:]
            self.conn.send_data(stream, chunk.tobytes(), end_stream=end and not view)
            self._flush()
        return stream

    def reset(self, stream: int) -> None:
        self.conn.reset_stream(stream)
        self._flush()

    def wait(self, *streams: int) -> dict[int, Reply]:
        """Read until each of `streams` is answered or reset (or the connection ends)."""
        while not all(s in self._ended for s in streams) and self._read_some():
            pass
        return {s: self.replies[s] for s in streams}

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def wait_closed(self) -> bool:
        """Read until the server ends the connection; whether it did."""
        while self._read_some():
            pass
        return self.closed

    def close(self) -> None:
        self.sock.close()

    def _read_some(self) -> bool:
        if self.closed:
            return False
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise  # the server neither answered nor closed: a test's failure, not an end
        except (ConnectionError, ssl.SSLError, OSError):
            data = b""
        if not data:
            self.closed = True
            return False
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                reply = self.replies[event.stream_id]
                reply.headers = {str(k): str(v) for k, v in event.headers}
                reply.status = int(reply.headers[":status"])
            elif isinstance(event, h2.events.DataReceived):
                self.replies[event.stream_id].body += event.data
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._ended.add(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.replies[event.stream_id].reset = int(event.error_code)
                self._ended.add(event.stream_id)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.closed = self.goaway = True
        self._flush()
        return not self.closed

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)
