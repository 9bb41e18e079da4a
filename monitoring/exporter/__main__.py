"""`python -m trainstack.monitoring.exporter`: what the launcher starts; the same as `trainstack exporter`."""

import sys

from trainstack.monitoring.exporter.cli import main

sys.exit(main())
