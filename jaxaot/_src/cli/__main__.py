"""``python -m jaxaot._src.cli``."""
import sys

from jaxaot._src.cli.main import main

sys.exit(main())
