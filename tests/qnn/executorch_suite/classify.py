"""Classifying outcomes: an error's one-line summary, whether the emulator run cannot do the test,
and which of passed both / stock only / fold only / neither a test falls in.

Categories of a test (issue 31, item 3):

- ``skipped``: the suite skips it itself (``@unittest.skip``/``skipIf``), in the stock run;
- ``cannot_run``: the stock run stopped on something this machine does not have (a device, the
  runner binary, a package that is not installed, a download); listed with the reason, not
  counted;
- ``both``: stock and fold pass; ``fold_only``: only fold passes; ``neither``: both fail;
- ``stock_only``: stock passes and fold fails, a **regression**. A test where both fail but fold
  fails a subtest that stock passes is also a regression (``neither`` with
  ``regressed_subtests``).

A timeout or a crashed worker counts as a failure of that side.
"""

from __future__ import annotations

import os
import traceback
from typing import Dict, List, Optional

from .emulator import NotOnEmulator

CATEGORIES = ("both", "stock_only", "fold_only", "neither", "cannot_run", "skipped")
_NETWORK_ERRORS = ("URLError", "HTTPError", "gaierror", "ConnectionError", "LocalEntryNotFoundError",
                   "OfflineModeIsEnabled", "MaxRetryError", "NameResolutionError")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + os.sep


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (the message's first non-empty line)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _chain(exc: BaseException) -> List[BaseException]:
    seen: List[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def emulator_limit(exc: BaseException) -> Optional[str]:
    """Why this machine cannot run the test, when `exc` says so; None for a real failure."""
    for link in _chain(exc):
        if isinstance(link, NotOnEmulator):
            return str(link)
        if isinstance(link, ModuleNotFoundError):
            return f"needs the {link.name or str(link)} package (not installed)"
        if type(link).__name__ in _NETWORK_ERRORS:
            return f"needs a download (no network here): {first_line(link)}"
    return None


def where(exc: BaseException) -> str:
    """The innermost frame of `exc`'s traceback: ``path:line function`` (path short)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    path = frame.filename
    for marker in ("site-packages/", _REPO):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{frame.lineno} {frame.name}"


def side_status(record: Dict) -> str:
    """One variant's status: ``passed``, ``failed``, ``skipped``, ``cannot_run``, ``timeout``,
    ``crashed``, computed from its entries (one per test or subtest outcome)."""
    if record.get("status") in ("timeout", "crashed"):
        return record["status"]
    entries = record.get("entries", [])
    failures = [e for e in entries if e["outcome"] in ("failure", "error")]
    limits = [e for e in failures if e.get("limit")]
    if failures and len(limits) == len(failures):
        return "cannot_run"
    if failures:
        return "failed"
    if entries and all(e["outcome"] == "skip" for e in entries):
        return "skipped"
    return "passed"


def first_failure(record: Dict) -> Optional[Dict]:
    """The first failing entry of a variant (or the timeout/crash), None when it passed."""
    if record.get("status") in ("timeout", "crashed"):
        return {"first_line": record.get("first_line", record["status"]), "where": "", "subtest": None}
    for entry in record.get("entries", []):
        if entry["outcome"] in ("failure", "error"):
            return entry
    return None


def _failed_subtests(record: Dict) -> set:
    return {e["subtest"] for e in record.get("entries", []) if e["outcome"] in ("failure", "error")}


def _passed_subtests(record: Dict) -> set:
    return {e["subtest"] for e in record.get("entries", []) if e["outcome"] == "success" and e["subtest"]}


def classify(stock: Dict, fold: Dict) -> Dict:
    """The category of one test from its two variant records.

    Returns:
        ``{"category", "regression", "regressed_subtests", "reason"}``; ``reason`` is the skip or
        cannot-run reason when the test is not compared.
    """
    s, f = side_status(stock), side_status(fold)
    out = {"category": None, "regression": False, "regressed_subtests": [], "reason": None}
    if s == "skipped":
        out["category"] = "skipped"
        out["reason"] = next((e["first_line"] for e in stock["entries"] if e["outcome"] == "skip"), "")
        return out
    if s == "cannot_run":
        out["category"] = "cannot_run"
        out["reason"] = next(e["limit"] for e in stock["entries"] if e.get("limit"))
        return out
    stock_ok, fold_ok = s == "passed", f == "passed"
    if stock_ok and fold_ok:
        out["category"] = "both"
    elif stock_ok:
        out["category"] = "stock_only"
        out["regression"] = True
    elif fold_ok:
        out["category"] = "fold_only"
    else:
        out["category"] = "neither"
        regressed = sorted(_passed_subtests(stock) & _failed_subtests(fold))
        out["regressed_subtests"] = regressed
        out["regression"] = bool(regressed)
    return out
