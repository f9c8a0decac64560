"""`python -m cosy.random_model`: the documented command name of `cosy.verify.random_model` (kept stable)."""
import sys

from cosy.verify.random_model.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
