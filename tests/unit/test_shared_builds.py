"""tests/shared_builds.py: one build per session whichever worker asks first; a failure is
everyone's. Callers race in threads (each opens the lock file itself, so flock excludes them
as it excludes xdist's worker processes)."""

import threading
import time

import pytest

from tests.shared_builds import built_once


class Factory:
    """What built_once reads of pytest's tmp_path_factory: this session's basetemp."""

    def __init__(self, base):
        self.base = base

    def getbasetemp(self):
        return self.base


def race(n, ask):
    results = [None] * n

    def call(i):
        try:
            results[i] = ask()
        except BaseException as e:  # noqa: BLE001 (pytest.fail raises a BaseException)
            results[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_the_first_caller_builds_and_the_others_wait_for_its_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    builds = []

    def build(folder):
        builds.append(folder)
        time.sleep(0.2)  # long enough that the others arrive while it builds
        folder.mkdir()
        (folder / "done").write_text("yes")

    results = race(4, lambda: built_once(Factory(tmp_path), "camp", build))
    assert builds == [tmp_path / "camp"]
    assert results == [tmp_path / "camp"] * 4 and (tmp_path / "camp" / "done").read_text() == "yes"
    assert built_once(Factory(tmp_path), "camp", build) == tmp_path / "camp" and len(builds) == 1


def test_workers_share_the_folder_above_their_own_basetemp(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    (tmp_path / "popen-gw1").mkdir()
    assert (
        built_once(Factory(tmp_path / "popen-gw1"), "camp", lambda f: f.mkdir())
        == tmp_path / "camp"
    )


def test_a_failed_build_fails_every_caller_with_its_error_and_is_not_retried(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    calls = []

    def build(folder):
        calls.append(folder)
        raise RuntimeError("snakemake failed: rule fit_predictor")

    with pytest.raises(RuntimeError, match="rule fit_predictor"):
        built_once(Factory(tmp_path), "camp", build)
    with pytest.raises(pytest.fail.Exception, match="(?s)building camp failed.*rule fit_predictor"):
        built_once(Factory(tmp_path), "camp", build)
    assert len(calls) == 1
