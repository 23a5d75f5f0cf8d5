"""Runs the Python tests as `python3 -m unittest discover -s DIR` does, then
lists every skipped test with its reason, or, where GOTEST_SKIPS names a
file, adds them to it as "package<TAB>test<TAB>reason" lines, as
scripts/gotest.sh does for Go's (make test lists them all at its end).

    python3 scripts/python_tests.py clients/python
"""
import os
import sys
import unittest


def main():
    start = sys.argv[1] if len(sys.argv) > 1 else "."
    prog = unittest.main(module=None, argv=["unittest", "discover", "-s", start], exit=False)
    result = prog.result
    lines = ["python\t%s\t%s\n" % (test.id(), " ".join(str(reason).split()) or "(no reason given)")
             for test, reason in result.skipped]
    path = os.environ.get("GOTEST_SKIPS")
    if path:
        with open(path, "a") as f:
            f.writelines(lines)
    elif lines:
        print("Skipped tests (%d), with their reasons:" % len(lines))
        for line in sorted(lines):
            pkg, name, reason = line.rstrip("\n").split("\t")
            print("  %s %s: %s" % (pkg, name, reason))
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
