"""The fast tier's guard (tests/conftest.py): a test without the `slow` mark that starts a process fails with one
line saying so, however it starts it; threads are fine. The planted tests run in this process (pytester), so this
test starts none itself."""

from __future__ import annotations

from tests.conftest import GPU_UNMARKED
from tests.helpers.runs import REPO

PLANTED = """
import multiprocessing
import os
import subprocess
import sys
import threading

import pytest


def test_a_subprocess():
    subprocess.run([sys.executable, "-c", "pass"])


def test_a_process_started_in_a_thread_and_its_error_swallowed():
    def start():
        try:
            subprocess.run(["true"])
        except BaseException:
            pass

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()


def test_a_multiprocessing_process():
    multiprocessing.get_context("spawn").Process(target=print).start()


def test_a_fork():
    os.fork()


@pytest.fixture
def started():
    subprocess.run(["true"])


def test_a_fixture_that_starts_one(started):
    pass


def test_a_thread_is_fine():
    done = []
    thread = threading.Thread(target=done.append, args=[1])
    thread.start()
    thread.join()
    assert done == [1]
"""


def test_a_test_skipped_for_want_of_a_gpu_must_be_marked_gpu(pytester):
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makepyfile(
        test_planted="""
import pytest

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_marked(): ...

@pytest.mark.skipif(True, reason="needs 2 CUDA GPUs")
def test_unmarked(): ...

@pytest.mark.skipif(True, reason="needs docker")
def test_other(): ...

@pytest.mark.skipif(True, reason="a GPU is here: this checks a CPU host")
def test_cpu_only(): ...
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-rfs")
    result.assert_outcomes(errors=1, skipped=3)  # it fails in its setup, before its skip is looked at
    # one line, no traceback, naming the test
    assert result.outlines.count(GPU_UNMARKED) == 1 and "ERROR at setup of test_unmarked" in result.stdout.str()


def test_every_way_of_starting_a_process_fails_an_unmarked_test_in_one_line(pytester):
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=4, errors=1, passed=1)
    # Each failure's whole report is that one line: no traceback.
    assert result.outlines.count("this test starts a process: mark it slow") == 5
