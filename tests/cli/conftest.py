"""Session fixtures of the CLI tests: runs that several tests read (tests/cli/crash_resume.py says
which, and why one run serves them)."""

from __future__ import annotations

import pytest
from crash_resume import CrashAndResume, crash_and_resume


@pytest.fixture(scope="session")
def gravac_crash(tmp_path_factory) -> CrashAndResume:
    """crash_resume.GRAVAC uninterrupted, crashed and resumed (:func:`crash_resume.crash_and_resume`)."""
    return crash_and_resume(tmp_path_factory.mktemp("gravac-crash"))
