"""The paragraph the client prints to stderr for a verdict or a warning:
a head line, the daemon's summary and first remedy where it gave them,
and a last line that says where to read more and how to turn it off."""

import sys


def paragraph(head, summary, remedy, last):
    """The lines, each but the head indented under "gpumem:"."""
    lines = [head]
    if summary:
        lines.append("gpumem:   " + summary)
    if remedy:
        lines.append("gpumem:   First: " + remedy)
    lines.append("gpumem:   " + last)
    return "\n".join(lines) + "\n"


def show(render, value, stream=None):
    """Write render(value) to stream (stderr by default); never raises: a
    message about memory must not be what stops the process."""
    try:
        out = stream if stream is not None else sys.stderr
        out.write(render(value))
        out.flush()
    except Exception:
        pass
