"""``python -m jaxaot.cli``."""
import sys

from jaxaot.cli.main import main

sys.exit(main())
