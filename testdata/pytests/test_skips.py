"""scripts/python_tests.py's fixture: a test that passes and two that skip."""
import unittest


class Fixture(unittest.TestCase):
    def test_passes(self):
        pass

    def test_needs_root(self):
        self.skipTest("needs root to chown")

    @unittest.skipUnless(False, "pip or venv is not available")
    def test_install(self):
        pass
