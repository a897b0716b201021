"""How to install an optional extra, as a command that runs as printed: the pip of the interpreter running us, so
it lands in the environment `evermind` runs from (a clone's .venv, say), whatever `pip` the shell finds first.
A leaf module: it imports nothing from the package."""

from __future__ import annotations


def install_command(extra: str) -> str:
    """`<this python> -m pip install 'evermind_memory[extra]'`, quoted for a shell."""
    import shlex
    import sys

    return f"{shlex.quote(sys.executable or 'python3')} -m pip install 'evermind_memory[{extra}]'"
