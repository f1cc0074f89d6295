"""Every error pyfuser raises on purpose.

Invariant: a user mistake (bad IR text, FusionDefinition misuse, a wrong tensor at execute) is
reported with one of these types and a message that names *where* (line/column, op, input index)
and *what* was wrong. Internal failures that should never happen use plain assertions.
FusionDefinitionError and ExecuteError are RuntimeErrors too, as nvFuser's errors are, so programs
written for nvFuser's Python frontend that catch RuntimeError keep working.
"""


class PyfuserError(Exception):
    """Base class of all errors pyfuser raises for bad input or unsupported programs."""


class IRParseError(PyfuserError):
    """Malformed TorchScript IR text. Carries the 1-based line and column."""

    def __init__(self, message: str, line: int, column: int, source_line: str = ""):
        self.message = message
        self.line = line
        self.column = column
        self.source_line = source_line
        where = f"line {line}, column {column}"
        text = f"{where}: {message}"
        if source_line:
            text += f"\n  {source_line}\n  {' ' * max(column - 1, 0)}^"
        super().__init__(text)


class FusionDefinitionError(PyfuserError, RuntimeError):
    """Misuse of the Fusion IR builder / FusionDefinition API, raised at definition time."""


class ExecuteError(PyfuserError, RuntimeError):
    """Inputs given to execute() do not match what the fusion was defined for."""


class UnsupportedOpError(PyfuserError):
    """An op or pattern pyfuser does not lower; callers fall back to eager and log the reason."""


class SchedulerError(PyfuserError):
    """No scheduler accepts a segment (the segmenter cuts or falls back)."""


class CompileError(PyfuserError):
    """NVRTC rejected generated CUDA source; the message holds the log and the kernel's name."""


class RunnerError(PyfuserError):
    """The eager runner could not execute a TorchScript node; names the node."""
