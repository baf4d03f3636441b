"""The error a refused cluster config raises, apart from the parser (corral.core.config) that
raises it: a shell catches it without importing the parser, whose pydantic models cost some
60 ms to import (`corral simulate --cluster 8x8` builds its cluster without them)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config refused at load time; the message is one line: ``[file: ]key.path: reason``."""

    def __init__(self, key_path: str, reason: str, file: str | None = None) -> None:
        self.key_path = key_path
        self.reason = reason
        self.file = file
        parts = [p for p in (file, key_path) if p] + [reason]
        super().__init__(one_line(": ".join(parts)))


def one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")
