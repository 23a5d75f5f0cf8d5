import os
import sys

# Make `gpumem` importable when run as
#   python3 -m unittest discover -s clients/python
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PACKAGE_ROOT not in sys.path:
    sys.path.insert(0, PACKAGE_ROOT)
