"""A tiny asyncio TCP proxy that adds a fixed one-way delay to every byte stream,
for putting a database (PostgreSQL, MariaDB) at a realistic distance from a benchmark.

Each direction of each connection is a FIFO of timestamped chunks: a chunk read at time
*t* is written at *t* + ``delay_ms``, so a request/answer round trip costs 2 x
``delay_ms`` more, as on a network with that one-way latency, and pipelined traffic is
not serialised behind the delay (no sleeping per chunk). Kafka needs more than a byte
pipe (the broker's addresses in Metadata and FindCoordinator must point at the proxy
too): ``tests.proxies.kafka_proxy.KafkaProxy`` does that with the same ``delay_ms``.

Run as ``python -m bench._delay --delay-ms 1 [--kafka HOST:PORT] [--tcp HOST:PORT ...]``
it serves both kinds in a process of its own, so that the proxies' Python code never
competes with the benchmark for its GIL; it prints one JSON line mapping each upstream
to its local address, and stops when its standard input closes. ``bench._common`` starts
and stops it (``behind_delay``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
from pathlib import Path

__all__ = ["DelayProxy"]

_CHUNK = 256 * 1024


class DelayProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream`` (host, port), delaying every byte by
    ``delay_ms`` in each direction. Runs its own event loop in a daemon thread."""

    def __init__(self, upstream: tuple[str, int], delay_ms: float) -> None:
        self._upstream = upstream
        self._delay = delay_ms / 1000
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delay-proxy")
        self._thread.daemon = True
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port: int = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_r, up_w = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        pipes = [
            asyncio.ensure_future(_pipe(client_r, up_w, self._delay)),
            asyncio.ensure_future(_pipe(up_r, client_w, self._delay)),
        ]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            for writer in (client_w, up_w):
                writer.close()
            self._tasks.discard(task)

    def close(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=5)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read; the
    end of the stream is passed on (half-close) after the data before it."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            if queue.empty():
                await writer.drain()

    sender = asyncio.ensure_future(send())
    try:
        while True:
            try:
                data = await reader.read(_CHUNK)
            except OSError:
                data = b""
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
        await sender
    finally:
        sender.cancel()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--kafka", help="the broker's bootstrap servers")
    parser.add_argument("--tcp", action="append", default=[], help="HOST:PORT of a database")
    args = parser.parse_args(argv)
    closers = []
    served: dict[str, str] = {}
    if args.kafka:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.proxies.kafka_proxy import KafkaProxy

        kafka = KafkaProxy(args.kafka, delay_ms=args.delay_ms)
        closers.append(kafka.close)
        served[args.kafka] = kafka.bootstrap_servers
    for upstream in args.tcp:
        proxy = DelayProxy(_address(upstream), args.delay_ms)
        closers.append(proxy.close)
        served[upstream] = f"127.0.0.1:{proxy.port}"
    print(json.dumps(served), flush=True)
    sys.stdin.read()  # until the benchmark closes our standard input (or dies)
    for close in reversed(closers):
        with contextlib.suppress(Exception):
            close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
