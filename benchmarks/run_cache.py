"""A cache of benchmark runs: one JSON per run, named by a hash of everything that determines it.

A race of hours (``benchmarks.llm_queries --run-cache DIR``) saves each run as it ends; rerun with the
same arguments, it reads them back instead of computing them, so it resumes where it stopped and takes
the same decisions. The key is compared in full on reading (a hash collision recomputes the run).
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Callable

from sazo_lite.atomic import write_json

RUN_PROTOCOL = 1    # bump when query_run's rules or defaults change what a cached run would be


class RunNotCached(LookupError):
    """``--cached-only``: the race reached a run its cache does not hold (the race stops there)."""


def cached_run(cache: Path | None, key: dict, compute: Callable[[], dict], *, cached_only: bool = False,
               refresh: bool = False) -> dict:
    """A run's report: read from ``cache`` if a run with exactly this ``key`` was saved there, else
    ``compute()``-d and saved (one JSON per run, named by a hash of the key). Makes a race resumable:
    an interrupted ``--run-cache`` race repeats none of its finished runs and takes the same decisions.
    ``cached_only``: raise ``RunNotCached`` instead of computing (a report of the race so far). ``refresh``:
    compute the run even if it is saved, and save it in place of the saved one.

    >>> import tempfile; calls = []
    >>> with tempfile.TemporaryDirectory() as d:
    ...     a = cached_run(Path(d), {"lr": 1e-3}, lambda: calls.append(1) or {"q": 8})
    ...     b = cached_run(Path(d), {"lr": 1e-3}, lambda: calls.append(1) or {"q": 9})
    >>> a == b == {"q": 8}, len(calls)
    (True, 1)
    """
    if cache is None:
        return compute()
    key = {"protocol": RUN_PROTOCOL, **key}
    text = json.dumps(key, sort_keys=True, default=str)
    path = Path(cache) / f"run-{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    if path.exists() and not refresh:
        saved = _read_saved(path)
        if saved is not None and saved["key"] == json.loads(text):
            return saved["run"]
    if cached_only:
        what = f"lr={key['lr']:g} seed={key.get('seed')}" if isinstance(key.get("lr"), float) else "a run"
        raise RunNotCached(f"{what} (not in {Path(cache).name})")
    run = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"key": json.loads(text), "run": run})   # atomic: no half run left behind
    return run


def _read_saved(path: Path) -> dict | None:
    """A cache file's {"key": dict, "run": dict}, or None (with a warning naming the file) when it
    is truncated, not JSON or wrongly shaped: the run is then recomputed and the file rewritten."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        warnings.warn(f"run cache {path.name}: unreadable ({type(error).__name__}); recomputing the run")
        return None
    if not (isinstance(saved, dict) and isinstance(saved.get("key"), dict) and isinstance(saved.get("run"), dict)):
        warnings.warn(f"run cache {path.name}: not a {{key, run}} record; recomputing the run")
        return None
    return saved
