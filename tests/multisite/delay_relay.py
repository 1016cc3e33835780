"""A delaying TCP relay for the multi-site test bed: latency where ``netem`` does not exist.

``python delay_relay.py --listen HOST:PORT --to HOST:PORT --delay-ms D`` accepts connections
on ``--listen`` and relays each to ``--to``; every chunk read in either direction is written
on ``D`` milliseconds after it was read (a one-way delay of D, a round trip of 2·D through the
relay), in order, without holding the reader back (the bytes in flight are what a long link
holds). Killing the relay drops every connection through it: a cut link.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time

CHUNK = 256 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    more = asyncio.Event()
    done = False

    async def read() -> None:
        nonlocal done
        try:
            while data := await reader.read(CHUNK):
                queue.append((time.monotonic() + delay, data))
                more.set()
        except (ConnectionError, OSError):
            pass
        finally:
            done = True
            more.set()

    async def write() -> None:
        try:
            while True:
                if not queue:
                    if done:
                        break
                    more.clear()
                    await more.wait()
                    continue
                due, data = queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                queue.popleft()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                writer.write_eof()
            except (OSError, RuntimeError):
                writer.close()

    await asyncio.gather(read(), write())


async def _serve(listen: tuple[str, int], to: tuple[str, int], delay: float) -> None:
    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*to)
        except OSError:
            cw.close()
            return
        try:
            await asyncio.gather(_pipe(cr, sw, delay), _pipe(sr, cw, delay))
        finally:
            for w in (cw, sw):
                w.close()

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def main() -> None:
    """Parse the command line and relay until killed."""
    p = argparse.ArgumentParser(description="delaying TCP relay (test bed)")
    p.add_argument("--listen", type=_addr, required=True)
    p.add_argument("--to", type=_addr, required=True)
    p.add_argument("--delay-ms", type=float, default=0.0)
    a = p.parse_args()
    asyncio.run(_serve(a.listen, a.to, a.delay_ms / 1000.0))


if __name__ == "__main__":
    main()
