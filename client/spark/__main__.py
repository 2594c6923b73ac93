"""`python -m client.spark`: the Parquet export job (see client.spark.job)."""

import sys

from client.spark.job import main

sys.exit(main())
