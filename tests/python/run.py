#!/usr/bin/python3
"""CTest entry for the Python package's tests: runs pytest on tests/python
with /usr/bin/python3 (Debian's numpy, h5py, torch, pytest). Exits 77 (CTest
SKIP_RETURN_CODE) when the shared library was not built or a needed module
is missing, saying which; otherwise pytest's exit status.

usage: run.py [pytest args...]   (AMPPROBE_LIB: the library under test)
"""
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    lib = os.environ.get("AMPPROBE_LIB")
    if lib and not os.path.exists(lib):
        print("SKIP: %s not built (the shared libampprobe)" % lib)
        return 77
    for mod in ("numpy", "pytest"):
        try:
            importlib.import_module(mod)
        except ImportError:
            print("SKIP: %s has no %s (apt-get install python3-%s)" %
                  (sys.executable, mod, mod))
            return 77
    import pytest

    class Count:
        """Counts outcomes, so that a run where everything skipped is
        reported to CTest as skipped (77), not as passed."""
        passed = skipped = 0

        def pytest_collectreport(self, report):
            if report.skipped:  # a whole module skipped (importorskip)
                Count.skipped += 1

        def pytest_runtest_logreport(self, report):
            if report.when == "call" and report.passed:
                Count.passed += 1
            elif report.skipped:
                Count.skipped += 1

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", HERE] +
                     sys.argv[1:], plugins=[Count()])
    # 5: nothing collected, as when every module given skipped itself
    if rc in (0, 5) and Count.passed == 0 and Count.skipped > 0:
        print("SKIP: every test skipped")
        return 77
    return rc


if __name__ == "__main__":
    sys.exit(main())
