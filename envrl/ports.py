"""The one port check every envrl server makes before it binds.

Out of range, a port is not refused by the socket layer the same way everywhere: ``-5`` raises
``OverflowError`` deep in the server and ``99999`` is silently served on another port. So the
command line, ``envrl serve``, ``serve-model``, ``serve-env`` and the WebShop server all check with
:func:`check_port` first, and say so in one line.
"""

from __future__ import annotations

#: the ports a server can listen on (0: any free port, printed when listening)
PORT_RANGE = range(0, 65536)


def check_port(port: int) -> int:
    """``port`` if a server can listen on it, else ValueError saying the range."""
    if isinstance(port, bool) or not isinstance(port, int) or port not in PORT_RANGE:
        raise ValueError(f"must be in {PORT_RANGE.start}..{PORT_RANGE.stop - 1}, got {port}")
    return port


def port_argument(text: str) -> int:
    """The argparse type of every server command's ``--port`` (``envrl serve``, ``serve-model``,
    ``serve-env``, ``webshop serve``): a one-line usage error for text or a port out of range."""
    import argparse

    try:
        port = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    try:
        return check_port(port)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
