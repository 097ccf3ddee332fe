"""Run the binding's pytest suite (argument: the tests folder); exit 77 (skipped) without pytest."""
import sys

try:
    import pytest
except ImportError:
    print("SKIP: pytest is not installed (Debian: python3-pytest)")
    sys.exit(77)

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs", sys.argv[1]]))
