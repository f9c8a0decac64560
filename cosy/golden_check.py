"""`python -m cosy.golden_check`: the documented command name of `cosy.verify.golden_check` (kept stable)."""
import sys

from cosy.verify.golden_check import main

if __name__ == "__main__":
    sys.exit(main())
