"""What guards the playground's server before and around its app, none of it touching a model:
the limits, a Host that names the server and an Origin that is its own or allowed (against DNS
rebinding and other web pages), JSON bodies within MAX_BODY, a deadline for every request, slots
for the requests decoding at once, a head read within HEAD_SECONDS, slow readers cut at the
deadline, and a listening socket that stays quiet when out of file descriptors. Its HTTP/1.1 is
uvicorn's h11 protocol, extended (pyproject.toml pins the uvicorn versions it is tested on)."""

import asyncio
import errno
import ipaddress
import socket
import struct
import time
import urllib.parse

from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from lib.common import Error

MAX_BODY = 1 << 20  # bytes of one request's JSON (batches of token-id prompts are long)
MAX_ACTIVE = 16  # completion requests decoding at once, and classify requests
MAX_CONNECTIONS = 256  # open connections; past it every request gets a 503
WAIT = 10  # seconds a request waits for one of the MAX_ACTIVE slots, then gets a 503
DEADLINE = 120  # seconds a request may take, its head read to its last byte sent
HEAD_SECONDS = 10  # seconds a client may take to send a request's head
LOOPBACK = {"localhost", "127.0.0.1", "::1"}


class RequestError(Exception):
    """A request the server refuses: (HTTP status, message, the field it names or None)."""

    def __init__(self, status, message, param=None):
        super().__init__(message)
        self.status = status
        self.param = param

    def response(self):
        """OpenAI's error object."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        error = {"message": str(self), "type": kind, "param": self.param}
        return JSONResponse({"error": error}, self.status)


class Slots:
    """At most `size` requests of a kind at once; one more waits up to WAIT seconds for a slot,
    then is refused with a 503."""

    def __init__(self, size):
        self.semaphore = asyncio.Semaphore(size)

    async def take(self):
        try:
            async with asyncio.timeout(WAIT):
                await self.semaphore.acquire()
        except TimeoutError:
            raise RequestError(
                503, "the server is busy with other requests: try again shortly"
            ) from None

    def give_back(self):
        self.semaphore.release()


def host_names(host):
    """The names a Host header may give for a server listening on host: the loopback ones for a
    loopback address, else the address itself; None for a wildcard address (then any IP address:
    a rebinding page sends its domain name)."""
    if host in ("", "0.0.0.0", "::"):
        return None
    if host in LOOPBACK or host.startswith("127."):
        return LOOPBACK | {host}
    return {host.lower()}


def exposure(host):
    """The warning that listening on host deserves, or None for a loopback address."""
    names = host_names(host)
    if names is not None and names & LOOPBACK:
        return None
    return (
        f"warning: listening on {host}, beyond this machine: anyone who can reach it on the "
        "network can use every model, with no password"
    )


def names_server(netloc, names, port):
    """Whether a Host header (or an Origin's host) names this server: one of names (or an IP
    address where names is None), with its port."""
    try:
        parts = urllib.parse.urlsplit("//" + netloc)
        given = parts.port or 80
    except ValueError:  # a port that is not a number
        return False
    if given != port or parts.hostname is None:
        return False
    if names is not None:
        return parts.hostname in names
    try:
        ipaddress.ip_address(parts.hostname)
    except ValueError:
        return False
    return True


class Guard:
    """What every request passes before the app sees it (an ASGI middleware): a Host that names
    this server, an Origin (when a browser sends one) that is the server's own or allowed, POST
    bodies of JSON within MAX_BODY, and its deadline."""

    def __init__(self, app, names, port, origins, deadline):
        self.app = app
        self.names = names
        self.port = port
        self.origins = set(origins)
        self.deadline = deadline

    def refusal(self, scope, headers):
        """The RequestError that refuses this request, or None."""
        host = headers.get("host", "")
        if not names_server(host, self.names, self.port):
            return RequestError(
                421, f"Host {host[:60]!r} does not name this server: use its address"
            )
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins:
            parts = urllib.parse.urlsplit(origin)
            own = parts.scheme == "http" and names_server(parts.netloc, self.names, self.port)
            if not own:
                return RequestError(
                    403, f"Origin {origin[:60]!r} is not allowed: serve.py --allow_origin names it"
                )
        if scope["method"] != "POST":
            return None
        kind, *parameters = headers.get("content-type", "").lower().split(";")
        if kind.strip() != "application/json":
            return RequestError(415, "POST a JSON body with Content-Type: application/json")
        for parameter in parameters:  # JSON is UTF-8 (RFC 8259): any other charset is refused
            name, _, value = parameter.strip().partition("=")
            if name == "charset" and value.strip('"') not in ("utf-8", "utf8"):
                return RequestError(
                    415, f"charset {value[:20]!r}: POST JSON in UTF-8 (charset=utf-8, or none)"
                )
        length = headers.get("content-length")
        if length is None:
            return RequestError(411, "send a Content-Length header with the JSON body")
        # RFC 9112 lets a server refuse both framings at once: h11 would frame by the chunks
        if "transfer-encoding" in headers:
            return RequestError(
                400, "send the body with Content-Length alone, no Transfer-Encoding"
            )
        digits = length.lstrip("0")  # h11 has checked it is a number
        if len(digits) > 9 or int(digits or 0) > MAX_BODY:
            return RequestError(413, f"the body is {digits} bytes, more than {MAX_BODY}")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        started = []

        async def send_watched(message):
            started.append(message["type"])
            await send(message)

        deadline = asyncio.timeout(self.deadline)
        try:
            async with deadline:
                refused = self.refusal(scope, headers)
                if refused is None and scope["method"] == "POST":
                    receive = await read_body(receive)
                if refused is None:
                    return await self.app(scope, receive, send_watched)
        except RequestError as e:  # read_body's
            refused = e
        except TimeoutError:
            if not deadline.expired():
                raise
            if started:  # Protocol has dropped the connection
                return
            refused = RequestError(503, f"the request ran past its {self.deadline} s deadline")
        response = refused.response()
        # a page --allow_origin names may read why it was refused
        origin = headers.get("origin")
        if origin in self.origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"
        await response(scope, receive, send)


async def read_body(receive):
    """A POST's whole body, counted on the bytes received whatever the framing, a 413 past
    MAX_BODY -> the receive the app reads it through (then on, the client's own, which tells
    when it leaves)."""
    chunks = []
    size = 0
    message = {"more_body": True}
    while message.get("more_body"):
        message = await receive()
        if message["type"] != "http.request":  # the client left: the app hears so
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise RequestError(413, f"the body passed {MAX_BODY} bytes")
        chunks.append(chunk)
    else:
        message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
    given = []

    async def replayed():
        """The body (or the client's leaving) once, then the client's own receive."""
        if given:
            return await receive()
        given.append(message)
        return message

    return replayed


class Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 with two more limits, past which the connection is dropped with what
    is buffered for it: HEAD_SECONDS for a client to send a request's head (uvicorn times only
    a connection idle between requests, so one header line now and then would hold it for ever),
    and the request's deadline for a response begun to be sent (a graceful close would wait for
    a slow reader to take the buffers; one not begun gets the Guard's 503)."""

    timer = None

    def connection_made(self, transport):
        super().connection_made(transport)
        self.start_timer(HEAD_SECONDS)

    def handle_events(self):
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's head came
            self.start_timer(self.config.deadline, self.past_deadline)

    def on_response_complete(self):
        super().on_response_complete()
        self.start_timer(HEAD_SECONDS)

    def start_timer(self, seconds, then=None):
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(seconds, then or self.drop)

    def past_deadline(self):
        if self.cycle.response_started:
            self.drop()
        else:  # the 503 has a second to go out
            self.start_timer(1)

    def drop(self):
        """The connection reset: what its kernel buffers hold goes too (a linger of 0)."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:  # closed already
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def connection_lost(self, exc):
        self.timer.cancel()
        super().connection_lost(exc)


class Listener(socket.socket):
    """The listening socket. Out of file descriptors, asyncio's accept loop tries each slot of
    its backlog in turn, every failure logged with a traceback (a core spent while the clients
    wait): here the first failure stands for the rest until asyncio retries, a second later."""

    full_until = 0.0

    def accept(self):
        if time.monotonic() < self.full_until:
            raise BlockingIOError  # to asyncio: nothing more to accept now
        try:
            return super().accept()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                self.full_until = time.monotonic() + 0.5
            raise


def listen(host, port):
    """A socket bound to host:port (IPv4 or IPv6, as host is written), or Error saying why."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = Listener(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # uvicorn's backlog: connections queue from here on
    except socket.gaierror as e:
        raise Error(
            f"cannot listen on {host!r} ({e.strerror}): give an address of this machine"
        ) from None
    except OSError as e:
        raise Error(f"cannot listen on {host}:{port} ({e.strerror}): pick another --port") from None
    return sock
