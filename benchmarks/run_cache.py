"""A cache of benchmark runs: one JSON per run, named by a hash of everything that determines it.

A race of hours (``benchmarks.llm_queries --run-cache DIR``) saves each run as it ends; rerun with the
same arguments, it reads them back instead of computing them, so it resumes where it stopped and takes
the same decisions. The key is compared in full on reading (a hash collision recomputes the run). Each key
holds ``RUN_PROTOCOL``, the version of ``query_run``'s rules; a run saved under an earlier protocol is read only
where ``CARRIED_OVER`` shows from its own log that today's rules would make the same run.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Callable

from sazo_lite.atomic import write_json
from sazo_lite.train import reached

# bump when query_run's rules or defaults change what a cached run would be, and add to CARRIED_OVER the test
# of which runs saved under the protocol before are still what a run would be (those are read, the rest recomputed)
RUN_PROTOCOL = 2


def budget_stop_agrees(run: dict, *, stop_fraction, accuracy_at) -> bool:
    """Protocol 1 → 2 (2026-12-07, ``query_run`` with ``accuracy_at``): a stop target met at any log point up to
    the budget stops the run at the budget; under 1 only the budget's own point did. A run saved under 1 is what
    a run under 2 would be unless it met the target at a log point before its budget and ran on past the budget
    (read from its own log: ``queries``, ``train_loss``, ``budget_queries``).

    >>> log = {"queries": [0, 8, 16, 24], "train_loss": [1.0, 0.4, 0.6, 0.3], "budget_queries": 16}
    >>> budget_stop_agrees(log, stop_fraction=0.5, accuracy_at=16), budget_stop_agrees(log, stop_fraction=0.3,
    ...                                                                                 accuracy_at=16)
    (False, True)
    """
    budget = run.get("budget_queries")
    if not accuracy_at or stop_fraction is None or budget is None:
        return True         # no budget, or no target: the rule did not change
    queries, losses = run["queries"], run["train_loss"]
    target = stop_fraction * losses[0]
    met = any(reached(loss, target) for q, loss in zip(queries[1:], losses[1:]) if q <= budget)
    return not (met and queries[-1] > budget)


# protocol p → whether a run saved under p (its key, its report) is what a run under p + 1 would be
CARRIED_OVER = {1: lambda key, run: budget_stop_agrees(run, stop_fraction=key.get("stop_fraction"),
                                                       accuracy_at=key.get("accuracy_at"))}


def carried_over(protocol: int, key: dict, run: dict, to: int | None = None) -> bool:
    """Whether a run saved under ``protocol`` is what a run under ``to`` (default ``RUN_PROTOCOL``) would be: every
    step of ``CARRIED_OVER`` between them says so; a step it does not know carries nothing over."""
    to = RUN_PROTOCOL if to is None else to
    return (isinstance(protocol, int) and not isinstance(protocol, bool) and 1 <= protocol <= to
            and all(p in CARRIED_OVER and CARRIED_OVER[p](key, run) for p in range(protocol, to)))


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
    if not refresh:
        saved = _saved_run(Path(cache), key)
        if saved is not None:
            return saved
    key = {"protocol": RUN_PROTOCOL, **key}
    text = json.dumps(key, sort_keys=True, default=str)
    path = _run_path(Path(cache), text)
    if cached_only:
        what = f"lr={key['lr']:g} seed={key.get('seed')}" if isinstance(key.get("lr"), float) else "a run"
        raise RunNotCached(f"{what} (not in {Path(cache).name})")
    run = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"key": json.loads(text), "run": run})   # atomic: no half run left behind
    return run


def _run_path(cache: Path, text: str) -> Path:
    return cache / f"run-{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"


def _saved_run(cache: Path, key: dict) -> dict | None:
    """The run saved in ``cache`` under ``key`` at this protocol, else at an earlier one that ``carried_over``
    says is still what a run would be (the newest first), else None. An earlier one that is not is named in a
    warning: it is recomputed (and saved under this protocol beside it)."""
    for protocol in range(RUN_PROTOCOL, 0, -1):
        text = json.dumps({"protocol": protocol, **key}, sort_keys=True, default=str)
        path = _run_path(cache, text)
        saved = _read_saved(path) if path.exists() else None
        if saved is None or saved["key"] != json.loads(text):
            continue
        if carried_over(saved["key"].get("protocol"), saved["key"], saved["run"]):
            return saved["run"]
        warnings.warn(f"run cache {path.name}: saved under protocol {protocol}, whose rules made another run than "
                      f"protocol {RUN_PROTOCOL}'s would; recomputing the run")
    return None


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
