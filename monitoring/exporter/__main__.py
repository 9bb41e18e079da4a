"""`python -m monitoring.exporter`: what the launcher starts; the same as `trainstack exporter`."""

import sys

from monitoring.exporter.cli import main

sys.exit(main())
