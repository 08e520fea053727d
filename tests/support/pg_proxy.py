"""A TCP proxy in front of the real PostgreSQL server that can cut a client off right after it
sent COMMIT: the server commits, the client never hears so. This is how a connection lost
around COMMIT looks to a sink, which no in-process fake could show."""

from __future__ import annotations

import socket
import threading
from types import TracebackType

from psycopg.conninfo import conninfo_to_dict, make_conninfo

# The simple-query message psycopg sends to commit: type 'Q', length, "COMMIT\0".
_COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"


class CommitCutter:
    def __init__(self, url: str) -> None:
        params = conninfo_to_dict(url)
        self._upstream = (str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        # Plain text, so that the proxy can see the COMMIT go by.
        self.url = make_conninfo(url, host="127.0.0.1", port=port, sslmode="disable")
        self._armed = threading.Event()
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_next_commit(self) -> None:
        self._armed.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        try:
            while data := source.recv(65536):
                if from_client and _COMMIT in data and self._armed.is_set():
                    self._armed.clear()
                    self.cuts += 1
                    # The client loses its connection first, so no answer can reach it, then
                    # the server gets the COMMIT. The server side stays open until the server
                    # is done with it.
                    source.shutdown(socket.SHUT_RDWR)
                    target.sendall(data)
                    return
                target.sendall(data)
        except OSError:
            pass
        finally:
            if from_client:
                target.shutdown(socket.SHUT_WR)

    def __enter__(self) -> CommitCutter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._listener.close()
