"""``python -m engine`` (and the ``blasnet`` console script): see ``engine.cli``."""
from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
