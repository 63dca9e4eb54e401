"""Code run in a fresh Python, as a notebook runs it (tests/gpu)."""

import os
import subprocess
import sys
import textwrap


def fresh_python(code: str, env: dict | None = None, timeout: float = 300) -> list[str]:
    """Run ``code`` with ``-c`` (``__main__`` without a file, as in a notebook), with ``env`` added
    to the environment; its printed lines."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()
