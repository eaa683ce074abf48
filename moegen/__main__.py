"""`python -m moegen` is the `moegen` command."""
import sys

from .cli import main

sys.exit(main())
